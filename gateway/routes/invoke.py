"""Invocation: pick the least-loaded ready instance, or wait in the bounded cold-start queue.

The same ``handle_invoke`` serves the documented FastAPI route and ``gateway.fast_path``, a plain
ASGI wrapper that takes invoke requests before the framework's middleware, routing and
dependency machinery (which cost more CPU per request than the forwarding itself).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from dilu.instance_protocol import STREAM_TYPES, is_loading, stream_kind
from dilu.limits import LimitExceeded, check_finite_json, check_json_depth
from dilu.messages import FunctionStatus
from dilu.spec import retries_after_failure
from gateway.docs import AUTH_ERRORS, SECURED, ErrorBody, errors
from gateway.forward import InstanceFailed, InstanceTimeout, NotDelivered, Reply
from gateway.metrics import ABANDONED, LATENCY, REQUESTS
from gateway.routing import GatewayStopping, NoInstance, QueueFull
from gateway.services import FunctionEntry, GatewayServices
from gateway.streams import Relay

router = APIRouter(prefix="/v1/functions", tags=["invoke"], dependencies=SECURED, responses=AUTH_ERRORS)
PREFIX, SUFFIX = "/v1/functions/", "/invoke"
JSON = "application/json"
BodyChunks = Callable[[], Awaitable[tuple[bytes, bool]]]  # -> (chunk, more_body)


@dataclass
class Outcome:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/json"
    queued_s: float = 0.0      # how long it waited for an instance (a cold start)
    tensors: str | None = None     # the header of an answer in a tensor frame
    relay: Relay | None = None     # a streamed answer: its pieces come from here, after the headers


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


async def handle_invoke(services: GatewayServices, name: str, next_chunk: BodyChunks,
                        content_length: str | None, max_bytes: int | None = None,
                        from_workflow: bool = False, content_type: str = JSON, tensors: str | None = None,
                        accept: str | None = None) -> Outcome:
    """One invocation, start to end. ``max_bytes``: the body's limit when not the setting's (the
    inference protocol bounds its own wire format and hands over the body it made).
    ``from_workflow``: a workflow's node (not a direct request, which keeps the function loaded).
    ``content_type``: JSON, or the tensor frame the inference protocol makes for a function that
    takes arrays (checked as it was made, so not parsed here), with its header ``tensors``.
    ``accept``: the caller's Accept header; a stream type there asks a streaming function for its
    chunks as they come (``Outcome.relay``)."""
    started = time.perf_counter()
    outcome = await _invoke(services, name, next_chunk, content_length, max_bytes, from_workflow, content_type,
                            tensors, stream_kind(accept) and accept, started)
    elapsed = time.perf_counter() - started
    _METRICS.observe(name, outcome.status, elapsed)
    if outcome.status < 400:
        now = time.time()
        services.latency.observe(name, now, elapsed)
        services.service_time.observe(name, now, elapsed - outcome.queued_s)
    return outcome


async def invoke_body(services: GatewayServices, name: str, body: bytes | memoryview, max_bytes: int | None = None,
                      from_workflow: bool = False, content_type: str = JSON, tensors: str | None = None,
                      accept: str | None = None) -> Outcome:
    """One invocation of a body already in memory (what the inference protocol and workflows
    hand over)."""
    sent = False

    async def next_chunk() -> tuple[bytes, bool]:
        nonlocal sent
        if sent:
            return b"", False
        sent = True
        return body, False

    return await handle_invoke(services, name, next_chunk, None, max_bytes, from_workflow, content_type, tensors,
                               accept)


async def _invoke(services: GatewayServices, name: str, next_chunk: BodyChunks,
                  content_length: str | None, max_bytes: int | None, from_workflow: bool,
                  content_type: str, tensors: str | None, accept: str | None, arrived: float) -> Outcome:
    settings = services.settings
    limit = settings.max_request_bytes if max_bytes is None else max_bytes
    function = services.functions.get(name)
    if function is None:
        await services.functions.refresh(name)
        function = services.functions.get(name)
        if function is None:
            return _error(404, f"function {name!r} not found")
    try:
        body = await _read_body(next_chunk, content_length, limit)
    except _TooLarge:
        return _error(413, f"request body exceeds the limit of {limit} bytes (DILU_MAX_REQUEST_BYTES)")
    if content_type == JSON:
        try:
            check_json_depth(body)
            check_finite_json(body)   # the body goes on as it came: checked, not kept
        except LimitExceeded as exc:
            return _error(400, f"request body: {exc}")
        except (ValueError, RecursionError) as exc:
            return _error(400, f"request body is not valid JSON: {exc}")

    services.activity.started(name, direct=not from_workflow)
    routing = services.routing
    tried: frozenset[str] = frozenset()
    failed_workers: frozenset[str] = frozenset()    # a retry goes elsewhere while it can
    retried = False
    queued_at: list[float] = []  # set when the request had to wait for an instance (a cold start)

    async def on_queued() -> None:
        if not queued_at:
            queued_at.append(time.perf_counter())
        services.signal_demand(name)

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
            entry = services.functions.get(name)
            return _error(503 if entry is None or entry.status == FunctionStatus.FAILED else 504, str(exc))
        routing.acquire(name, endpoint.instance_id)
        relay: Relay | None = None
        try:
            if accept:
                reply, relay = await _open_stream(services, function, endpoint.instance_id, endpoint.url, body,
                                                  content_type, accept, arrived)
            else:
                reply = await services.forwarder.post(endpoint.url + "/infer", body, settings.request_timeout_s,
                                                      content_type, tensors)
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
                services.activity.answered(name)
        if is_loading(reply.status, reply.headers):
            tried = tried | {endpoint.instance_id}
            continue
        headers, queued_s = reply.headers, 0.0
        if retried:     # the handler may have run twice: the caller is told
            headers = {**headers, "x-dilu-retried": "1"}
        if queued_at:
            queued_s = queued_at[-1] - queued_at[0]
            headers = {**headers, "x-dilu-queued-ms": f"{queued_s * 1000:.1f}"}
        return Outcome(reply.status, reply.body, headers, reply.content_type, queued_s, reply.tensors, relay)


async def _open_stream(services: GatewayServices, function: FunctionEntry, instance_id: str, url: str,
                       body: bytes | memoryview, content_type: str, accept: str,
                       arrived: float) -> tuple[Reply, Relay | None]:
    """The instance's answer to a stream request: a relay when it streams, else its whole reply
    (an error, or a function that does not stream refusing the request). The stream may run
    for the function's ``max_stream_s``, within the gateway's own bound."""
    settings, name = services.settings, function.name
    max_s = min(settings.max_stream_s, function.model.max_stream_s or settings.max_stream_s)
    streamed = await services.forwarder.stream(url + "/infer", body, settings.request_timeout_s, content_type,
                                               accept)
    reply = Reply(streamed.status, b"", streamed.content_type, streamed.headers)
    if streamed.status == 200 and streamed.content_type.split(";")[0].strip() in STREAM_TYPES.values():
        def ended() -> None:
            services.routing.release(name, instance_id)
            services.activity.answered(name)

        return reply, Relay(name, streamed, settings.request_timeout_s, max_s, ended, arrived,
                            services.stream_times)
    pieces = [piece async for piece in streamed.chunks(settings.request_timeout_s)]
    return Reply(streamed.status, b"".join(pieces), streamed.content_type, streamed.headers), None


@router.post("/{name}/invoke", responses={
    200: {"description": "The function's JSON result (headers x-dilu-batch-size, x-dilu-latency-ms, "
                         "x-dilu-instance; x-dilu-queued-ms after a cold start)",
          "content": {"application/json": {"schema": {}}}},
    **errors(400, 404, 413, 429, 502, 503, 504),
    422: {"model": ErrorBody, "description": "The handler refused the input (dilu.InputError)"},
    500: {"model": ErrorBody, "description": "The handler failed on this input"}},
    openapi_extra={"requestBody": {"required": True, "description": "One JSON input of the function",
                                   "content": {"application/json": {"schema": {}}}}})
async def invoke(name: str, request: Request) -> Response:
    """Runs the function on one JSON input and returns its JSON result.

    (Served by gateway.fast_path in the running gateway; this route documents it and backs it up.)
    """
    stream = request.stream().__aiter__()

    async def next_chunk() -> tuple[bytes, bool]:
        try:
            return await stream.__anext__(), True
        except StopAsyncIteration:
            return b"", False

    outcome = await handle_invoke(request.app.state.services, name, next_chunk,
                                  request.headers.get("content-length"), accept=request.headers.get("accept"))
    if outcome.relay is not None:
        return StreamingResponse(outcome.relay.pieces(), headers=outcome.headers, media_type=outcome.content_type)
    return Response(outcome.body, status_code=outcome.status, headers=outcome.headers,
                    media_type=outcome.content_type)
