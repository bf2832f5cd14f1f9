"""The invocation at the gateway's centre: every surface (``/v1`` invoke and its fast path, the
inference protocol over REST and gRPC, the OpenAI routes, workflows) hands over an
``Invocation`` and gets an ``Outcome``.

The ``Invoker`` picks the least-loaded ready instance, or waits in the bounded cold-start queue;
forwards the body; retries where that is safe and can succeed; and relays a stream. It holds
exactly what that needs (the catalogue, routing, forwarding, activity, timings), never the
gateway's whole composition.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from dilu.config import GatewaySettings
from dilu.instance_protocol import STREAM_TYPES, is_loading, stream_kind
from dilu.limits import LimitExceeded, check_finite_json, check_json_depth
from dilu.messages import FunctionStatus
from dilu.spec import retries_after_failure
from gateway.activity import ActivityRecorder
from gateway.catalogue import FunctionCache, FunctionEntry
from gateway.dashboard.view import LatencyWindow
from gateway.forward import Forwarder, InstanceFailed, InstanceTimeout, NotDelivered, Reply
from gateway.metrics import ABANDONED, LATENCY, REQUESTS
from gateway.routing import GatewayStopping, NoInstance, QueueFull, RoutingTable
from gateway.statistics import InvocationStats
from gateway.streams import Relay, StreamTimes

JSON = "application/json"
BodyChunks = Callable[[], Awaitable[tuple[bytes, bool]]]  # -> (chunk, more_body)


def _nothing_more() -> BodyChunks:
    async def read() -> tuple[bytes, bool]:
        return b"", False
    return read


@dataclass(slots=True)
class Invocation:
    """One request to run a function, as a surface hands it over.

    ``read`` gives the body chunk by chunk (``declared_length``: its Content-Length, checked
    against the limit before reading); ``max_bytes``: the body's limit when not the setting's
    (the inference protocol bounds its own wire format and hands over the body it made).
    ``content_type``: JSON, or the tensor frame the inference protocol makes for a function
    that takes arrays (checked as it was made, so not parsed here), with its header
    ``tensors``. ``accept``: the caller's Accept header; a stream type there asks a streaming
    function for its chunks as they come (``Outcome.relay``). ``from_workflow``: a workflow's
    node (not a direct request, which keeps the function loaded)."""

    function: str
    read: BodyChunks = field(default_factory=_nothing_more)
    declared_length: str | None = None
    max_bytes: int | None = None
    content_type: str = JSON
    tensors: str | None = None
    accept: str | None = None
    from_workflow: bool = False

    @classmethod
    def of_body(cls, function: str, body: bytes | memoryview, **options: Any) -> Invocation:
        """An invocation of a body already in memory (what the inference protocol, the OpenAI
        routes and workflows hand over)."""
        sent = False

        async def read() -> tuple[bytes, bool]:
            nonlocal sent
            if sent:
                return b"", False
            sent = True
            return body, False

        return cls(function, read, **options)


@dataclass
class Outcome:
    """An invocation's answer: the instance's, or the gateway's error (a JSON ``error``)."""

    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/json"
    queued_s: float = 0.0      # how long it waited for an instance (a cold start)
    tensors: str | None = None     # the header of an answer in a tensor frame
    relay: Relay | None = None     # a streamed answer: its pieces come from here, after the headers

    def error(self) -> str:
        """The message of an error answer: its JSON ``error``, else its text."""
        try:
            return str(json.loads(self.body)["error"])
        except (ValueError, KeyError, TypeError):
            return self.body.decode("utf-8", errors="replace")[:500]


class _TooLarge(Exception):
    pass


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> Outcome:
    return Outcome(status, json.dumps({"error": message}).encode(), headers or {})


async def _read_body(next_chunk: BodyChunks, declared: str | None, limit: int) -> bytes | memoryview:
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _TooLarge
    chunks, size, more = [], 0, True
    while more:
        chunk, more = await next_chunk()
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)   # one chunk (a frame's view) is not copied


class _MetricsCache:
    """prometheus-client children per function, so the hot path skips the label lookup."""

    def __init__(self) -> None:
        self._latency: dict[str, Any] = {}
        self._requests: dict[tuple[str, int], Any] = {}

    def observe(self, name: str, status: int, seconds: float) -> None:
        counter = self._requests.get((name, status))
        if counter is None:
            counter = self._requests[(name, status)] = REQUESTS.labels(name, str(status))
        histogram = self._latency.get(name)
        if histogram is None:
            histogram = self._latency[name] = LATENCY.labels(name)
        counter.inc()
        histogram.observe(seconds)


_METRICS = _MetricsCache()


class _Timing:
    """Where one invocation got to, and when (``time.perf_counter``), for its statistics."""

    __slots__ = ("answered", "checked", "routed", "version")

    def __init__(self) -> None:
        self.version: int | None = None     # the function's version, once it is found
        self.checked = self.routed = self.answered = 0.0


class Invoker:
    """Runs invocations: see the module's docstring."""

    def __init__(self, *, settings: GatewaySettings, functions: FunctionCache, routing: RoutingTable,
                 forwarder: Forwarder, activity: ActivityRecorder, signal_demand: Callable[[str], None],
                 stream_times: StreamTimes) -> None:
        self._settings = settings
        self._functions = functions
        self._routing = routing
        self._forwarder = forwarder
        self._activity = activity
        self._signal_demand = signal_demand
        self._stream_times = stream_times
        self.latency = LatencyWindow()     # the dashboard's p99 of what it served, end to end
        # What a request takes once an instance has it (waits for a cold start left out): the
        # expected time of a workflow's node, which the plan of its loads builds on.
        self.service_time = LatencyWindow()
        self.stats = InvocationStats()     # Triton-shaped statistics of what this gateway answered

    async def invoke(self, invocation: Invocation) -> Outcome:
        """One invocation, start to end."""
        started, timing = time.perf_counter(), _Timing()
        outcome = await self._run(invocation, stream_kind(invocation.accept) and invocation.accept, started, timing)
        ended = time.perf_counter()
        elapsed = ended - started
        name = invocation.function
        _METRICS.observe(name, outcome.status, elapsed)
        now = time.time()
        if outcome.status < 400:
            self.latency.observe(name, now, elapsed)
            self.service_time.observe(name, now, elapsed - outcome.queued_s)
        if timing.version is not None:
            self.stats.record(name, timing.version, outcome.status < 400, started, timing.checked, timing.routed,
                              timing.answered, ended, outcome.headers.get("x-dilu-batch-size"), int(now * 1000))
        return outcome

    async def _run(self, invocation: Invocation, accept: str | None, arrived: float, timing: _Timing) -> Outcome:
        settings, name = self._settings, invocation.function
        limit = settings.max_request_bytes if invocation.max_bytes is None else invocation.max_bytes
        function = self._functions.get(name)
        if function is None:
            await self._functions.refresh(name)
            function = self._functions.get(name)
            if function is None:
                return _error(404, f"function {name!r} not found")
        timing.version = function.version
        try:
            body = await _read_body(invocation.read, invocation.declared_length, limit)
        except _TooLarge:
            return _error(413, f"request body exceeds the limit of {limit} bytes (DILU_MAX_REQUEST_BYTES)")
        if invocation.content_type == JSON:
            try:
                check_json_depth(body)
                check_finite_json(body)   # the body goes on as it came: checked, not kept
            except LimitExceeded as exc:
                return _error(400, f"request body: {exc}")
            except (ValueError, RecursionError) as exc:
                return _error(400, f"request body is not valid JSON: {exc}")
        timing.checked = time.perf_counter()

        self._activity.started(name, direct=not invocation.from_workflow)
        routing = self._routing
        tried: frozenset[str] = frozenset()
        failed_workers: frozenset[str] = frozenset()    # a retry goes elsewhere while it can
        retried = False
        queued_at: list[float] = []  # set when the request had to wait for an instance (a cold start)

        async def on_queued() -> None:
            if not queued_at:
                queued_at.append(time.perf_counter())
            self._signal_demand(name)

        while True:
            try:
                endpoint = await routing.wait_for_endpoint(
                    name, settings.queue_timeout_s, exclude=tried, on_queued=on_queued, avoid=failed_workers)
                if len(queued_at) == 1:
                    queued_at.append(time.perf_counter())
            except QueueFull as exc:
                return _error(429, str(exc), headers={"retry-after": "1"})
            except asyncio.CancelledError:
                ABANDONED.labels(name, "queued").inc()      # its caller left (gateway.abandon)
                raise
            except GatewayStopping as exc:
                return _error(503, str(exc), headers={"retry-after": "1"})
            except NoInstance as exc:
                entry = self._functions.get(name)
                return _error(503 if entry is None or entry.status == FunctionStatus.FAILED else 504, str(exc))
            routing.acquire(name, endpoint.instance_id)
            timing.routed = time.perf_counter()
            relay: Relay | None = None
            try:
                if accept:
                    reply, relay = await self._open_stream(invocation, function, endpoint.instance_id, endpoint.url,
                                                           body, accept, arrived)
                else:
                    reply = await self._forwarder.post(endpoint.url + "/infer", body, settings.request_timeout_s,
                                                       invocation.content_type, invocation.tensors,
                                                       endpoint.instance_id)
            except asyncio.CancelledError:
                ABANDONED.labels(name, "in_flight").inc()   # the connection's close tells the instance
                raise
            except NotDelivered:
                # Nothing reached the instance, so trying elsewhere is always safe.
                routing.drop_endpoint(name, endpoint.instance_id)
                routing.suspect(endpoint.worker_id)
                tried, failed_workers = tried | {endpoint.instance_id}, failed_workers | {endpoint.worker_id}
                continue
            except InstanceTimeout:
                return _error(504, f"instance {endpoint.instance_id} did not answer within "
                                   f"{settings.request_timeout_s:g}s")
            except InstanceFailed as exc:
                routing.drop_endpoint(name, endpoint.instance_id)
                routing.suspect(endpoint.worker_id)
                failed_workers = failed_workers | {endpoint.worker_id}
                if retried:
                    return _error(502, f"instance {endpoint.instance_id} failed while serving the request, after "
                                       f"a retry: {exc}", headers={"x-dilu-retried": "1"})
                if retries_after_failure(function.spec):
                    retried, tried = True, tried | {endpoint.instance_id}
                    continue
                return _error(502, f"instance {endpoint.instance_id} failed while serving the request: {exc}; not "
                                   "retried, since the function may have side effects (idempotent: false, or class "
                                   "batch): the handler may have run")
            finally:
                if relay is None:     # a stream holds its instance until it ends
                    routing.release(name, endpoint.instance_id)
                    self._activity.answered(name)
            if is_loading(reply.status, reply.headers):
                tried = tried | {endpoint.instance_id}
                continue
            timing.answered = time.perf_counter()
            headers, queued_s = reply.headers, 0.0
            if retried:     # the handler may have run twice: the caller is told
                headers = {**headers, "x-dilu-retried": "1"}
            if queued_at:
                queued_s = queued_at[-1] - queued_at[0]
                headers = {**headers, "x-dilu-queued-ms": f"{queued_s * 1000:.1f}"}
            return Outcome(reply.status, reply.body, headers, reply.content_type, queued_s, reply.tensors, relay)

    async def _open_stream(self, invocation: Invocation, function: FunctionEntry, instance_id: str, url: str,
                           body: bytes | memoryview, accept: str, arrived: float) -> tuple[Reply, Relay | None]:
        """The instance's answer to a stream request: a relay when it streams, else its whole
        reply (an error, or a function that does not stream refusing the request). The stream
        may run for the function's ``max_stream_s``, within the gateway's own bound."""
        settings, name = self._settings, function.name
        max_s = min(settings.max_stream_s, function.model.max_stream_s or settings.max_stream_s)
        streamed = await self._forwarder.stream(url + "/infer", body, settings.request_timeout_s,
                                                invocation.content_type, accept, instance_id)
        reply = Reply(streamed.status, b"", streamed.content_type, streamed.headers)
        if streamed.status == 200 and streamed.content_type.split(";")[0].strip() in STREAM_TYPES.values():
            def ended() -> None:
                self._routing.release(name, instance_id)
                self._activity.answered(name)

            return reply, Relay(name, streamed, settings.request_timeout_s, max_s, ended, arrived,
                                self._stream_times)
        pieces = [piece async for piece in streamed.chunks(settings.request_timeout_s)]
        return Reply(streamed.status, b"".join(pieces), streamed.content_type, streamed.headers), None
