"""The runtime server inside every instance: loads the handler once, serves batched inference.

Routes: ``POST /infer`` (JSON in, the handler's JSON result out; for a handler that takes arrays,
a tensor frame in and out as well; with ``x-dilu-batch-size`` and ``x-dilu-latency-ms``
headers), ``GET /health`` (200 only after ``load()`` succeeded, 503 while loading; its body
has ``startup``: the wall-clock time each start-up stage ended - ``process_start``,
``runtime_imported``, ``serving``, ``handler_imported``, ``loaded``, ``ready``), ``GET
/metrics`` (Prometheus: latency and batch-size histograms, the requests queued), ``GET /progress`` (the work units a
batch-class handler reported with ``dilu.report_progress``, and when).
If import or ``load()`` fails, the error is printed as a final ``DILU-ERROR:`` line on stderr
(the instance log) and the process exits with status 3, so the worker reports it instead of
restarting in a loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import socket
import sys
import threading
import time
import traceback
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route

from dilu.handler import progress_units
from dilu.instance_protocol import (
    ERROR_MARKER,
    EXIT_LOAD_FAILED,
    LOADING_HEADER,
    NOT_STREAMING_HEADER,
    STREAM_TYPES,
    TENSOR_FRAME_TYPE,
    TENSORS_HEADER,
    InstanceConfig,
    route_prefix,
    stream_kind,
)
from worker.instance.batcher import Batcher, BatchError, BatchResult, HandedOver
from worker.instance.codec import codec_for, loads
from worker.instance.direct_writes import DIRECT_WRITES
from worker.instance.gpu_requests import RequestSignal
from worker.instance.loader import HandlerError, build_handler
from worker.instance.metrics import InstanceMetrics
from worker.instance.stream_answer import StreamAnswer
from worker.instance.streams import Stream, StreamRunner, chunk_encoder, is_streaming, stream_body, whole_answer

if TYPE_CHECKING:   # imported lazily at run time: spares preload it
    import uvicorn


class RuntimeState:
    def __init__(self, config: InstanceConfig, device: str = "cpu") -> None:
        self.config = config
        self.device = device
        self.marks: dict[str, float] = {}
        self.ready = threading.Event()
        self.batcher: Batcher | None = None
        self.streams: StreamRunner | None = None    # a streaming handler's runner, instead of the batcher
        self.handler: Any = None
        self.metrics = InstanceMetrics()
        self.gpu_requests = RequestSignal()
        self.codec = codec_for(config, device)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def create_app(state: RuntimeState, lifespan: Callable[[Starlette], AbstractAsyncContextManager[None]] | None = None,
               prefix: str = "") -> InferFirst:
    async def infer(request: Request) -> Response | StreamAnswer:
        if not state.ready.is_set() or (state.batcher is None and state.streams is None):
            return JSONResponse({"error": "instance is still loading", "loading": True}, status_code=503,
                                headers={LOADING_HEADER: "1"})
        wants = stream_kind(request.headers.get("accept"))
        if wants is not None and state.streams is None:
            return JSONResponse({"error": f"{state.config.function} does not stream (its handler has no start() and "
                                          "step()): ask for a whole answer, without Accept: text/event-stream or "
                                          "application/x-ndjson"}, status_code=400,
                                headers={NOT_STREAMING_HEADER: "1"})
        try:
            body = await _whole_body(request)
        except CallerLeft:
            state.metrics.abandoned += 1
            return Response(status_code=499)
        framed = request.headers.get("content-type") == TENSOR_FRAME_TYPE
        try:
            payload = state.codec.read_frame(request.headers.get(TENSORS_HEADER), body) if framed else loads(body)
        except ValueError as exc:
            return _error(400, f"request body is not valid {'tensor frame' if framed else 'JSON'}: {exc}")
        started = time.perf_counter()
        if state.streams is not None and wants is not None:
            return await _streamed(state, payload, wants, request)
        try:
            with state.gpu_requests.serving():
                if state.streams is not None:
                    stream = state.streams.submit(payload)
                    result = await _unless_caller_leaves(request, _whole(state, stream), stream.cancel)
                else:
                    result = await _unless_caller_leaves(request, state.batcher.submit(payload))
        except HandedOver as exc:
            return _handed_over(exc)
        except BatchError as exc:
            return _error(exc.status, f"invalid input: {exc}" if exc.status < 500 else f"handler error: {exc}")
        except CallerLeft:
            state.metrics.abandoned += 1
            return Response(status_code=499)     # nobody reads it: the connection is gone
        try:   # NaN and infinities are not JSON: a client's parser would refuse the answer
            content, media_type, extra = state.codec.write(result.output, framed)
        except (TypeError, ValueError) as exc:
            return _error(500, f"handler returned a result that is not JSON-serialisable: {exc}")
        elapsed = time.perf_counter() - started
        state.metrics.observe(elapsed, result.batch_size)
        return Response(content, media_type=media_type, headers={
            "x-dilu-batch-size": str(result.batch_size),
            "x-dilu-latency-ms": f"{elapsed * 1000:.3f}",
            "x-dilu-instance": state.config.instance_id, **extra,
        })

    async def health(_: Request) -> Response:
        if state.ready.is_set():
            return JSONResponse({"status": "ready", "instance": state.config.instance_id, "startup": state.marks})
        return JSONResponse({"status": "loading", "loading": True}, status_code=503, headers={LOADING_HEADER: "1"})

    async def progress(_: Request) -> Response:
        return JSONResponse({"units": progress_units(), "at": time.time()})

    async def metrics(_: Request) -> Response:
        content, media_type = await asyncio.to_thread(state.metrics.render)
        return Response(content, media_type=media_type)

    routes = [
        Route("/infer", infer, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/progress", progress, methods=["GET"]),
    ]
    return InferFirst(Starlette(lifespan=lifespan, routes=[Mount(prefix, routes=routes)] if prefix else routes),
                      f"{prefix}/infer", infer)


class InferFirst:
    """ASGI: ``POST {prefix}/infer`` straight to its endpoint, every other request (and the
    lifespan) to ``app``. Starlette's middleware and routing layers cost a no-op inference about a
    sixth of the instance's Python time; what they add there (a 500 for an error) the server does itself."""

    def __init__(self, app: Starlette, infer_path: str,
                 infer: Callable[[Request], Awaitable[Response | StreamAnswer]]) -> None:
        self.app = app
        self._infer_path = infer_path
        self._infer = infer

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == self._infer_path:
            response = await self._infer(Request(scope, receive))
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


T = TypeVar("T")


def _handed_over(exc: HandedOver) -> Response:
    """A request the stopping instance did not start: "try another" to the gateway."""
    return JSONResponse({"error": str(exc), "loading": True}, status_code=503, headers={LOADING_HEADER: "1"})


class CallerLeft(Exception):
    """The gateway closed the request's connection before its answer."""


async def _unless_caller_leaves(request: Request, work: Awaitable[T], on_leave: Callable[[], None] | None = None) -> T:
    """``work``'s result, unless the request's connection closes first: then ``work`` is
    cancelled (a batcher's input not yet in a batch is dropped, ``on_leave`` ends a generation at
    its next step) and CallerLeft is raised."""
    working = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((working, gone), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        working.cancel()
        raise
    finally:
        gone.cancel()
    if working.done():
        return working.result()
    working.cancel()
    if on_leave is not None:
        on_leave()
    raise CallerLeft()


async def _whole_body(request: Request) -> bytes | bytearray:
    """The request's body as the server gathered it: InstanceHttp hands it over in one message, in
    one buffer (Starlette's ``Request.body`` would join it into a copy)."""
    pieces: list[bytes | bytearray] = []
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise CallerLeft()
        pieces.append(message.get("body", b""))
        if not message.get("more_body", False):
            return pieces[0] if len(pieces) == 1 else b"".join(pieces)


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _streamed(state: RuntimeState, payload: Any, kind: str, request: Request) -> Response | StreamAnswer:
    """The chunks as they come, once the first is made (a request refused before its first chunk
    gets its error as a plain answer); a caller who leaves cancels its request at the next step.
    Where the server offers it, the chunks after the first are sent by the runner's thread
    (``worker.instance.direct_writes``)."""
    direct = request.scope.get("extensions", {}).get(DIRECT_WRITES)
    encode = chunk_encoder(kind)
    stream = state.streams.submit(payload, direct=direct is not None)
    pieces = stream_body(stream, kind)
    try:
        with state.gpu_requests.serving():
            first = await anext(pieces, b"")
    except BaseException:
        stream.cancel()
        raise
    failure = stream.failure
    if isinstance(failure, HandedOver):
        return _handed_over(failure)
    if failure is not None:    # the first piece is its error event
        return _error(failure.status, f"invalid input: {failure}" if failure.status < 500 else
                      f"handler error: {failure}")

    async def relay() -> AsyncIterator[bytes]:
        try:
            with state.gpu_requests.serving():
                yield first     # sent by now, with the head: the runner may send what follows
                if direct is not None:
                    stream.decide_route(lambda: direct(encode))
                async for piece in pieces:
                    yield piece
        finally:
            stream.cancel()
            stream.close_sink()

    body = relay()
    # A response dropped before it was sent never starts its body, whose finally would not run.
    weakref.finalize(body, stream.cancel)
    media_type = STREAM_TYPES[kind]
    return StreamAnswer(body, {"content-type": f"{media_type}; charset=utf-8" if media_type.startswith("text/")
                               else media_type, "cache-control": "no-cache",
                               "x-dilu-instance": state.config.instance_id})


async def _whole(state: RuntimeState, stream: Stream) -> BatchResult:
    """A plain request to a streaming handler: its chunks gathered into one answer."""
    output = await whole_answer(state.handler, stream)
    return BatchResult(output, max(stream.batch_sizes, default=1), 0.0, 0.0)


def _process_start_time() -> float:
    """When this process was created (from /proc, so interpreter start-up is counted); now elsewhere."""
    try:
        with open("/proc/self/stat", encoding="ascii") as handle:
            ticks = int(handle.read().rsplit(")", 1)[1].split()[19])  # start time, ticks since boot
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):
        return time.time()


def _fail(message: str) -> None:
    """Reports a load failure on stderr and ends the process at once."""
    sys.stderr.write(f"{ERROR_MARKER}{message}\n")
    sys.stderr.flush()
    os._exit(EXIT_LOAD_FAILED)


async def _load_then_serve_batches(state: RuntimeState) -> None:
    config = state.config
    state.marks["serving"] = time.time()  # the HTTP server is up; what follows is the handler's
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dilu-predict")
    loop = asyncio.get_running_loop()
    try:
        handler = await loop.run_in_executor(executor, functools.partial(
            build_handler, config.source_dir, config.handler, config.options, state.marks,
            device=state.device, warmup=config.warmup, adapt=state.codec.adapt, weights=config.weights))
    except HandlerError as exc:
        traceback.print_exc()
        _fail(str(exc))
        return
    except BaseException as exc:  # noqa: BLE001 - anything else during import/load is still the handler's fault
        traceback.print_exc()
        _fail(f"{type(exc).__name__}: {exc}")
        return
    state.handler = handler
    if is_streaming(handler):
        state.streams = StreamRunner(handler, max_batch_size=config.max_batch_size, executor=executor,
                                     stall_s=config.stream_stall_s)
    else:
        state.batcher = Batcher(handler.predict, max_batch_size=config.max_batch_size,
                                max_wait_s=config.max_wait_ms / 1000.0, executor=executor,
                                preferred_batch_size=config.preferred_batch_size)
    state.metrics.queued = (state.streams or state.batcher).queued
    if state.batcher is not None:
        batcher = state.batcher
        state.metrics.dropped = lambda: batcher.abandoned
    state.marks["ready"] = time.time()
    state.ready.set()
    state.metrics.build_in_background()
    print(f"dilu: instance {config.instance_id} of {config.function} ready", file=sys.stderr, flush=True)
    await (state.streams or state.batcher).run()


def _uvicorn_config(app: InferFirst | Starlette, prefix: str = "") -> uvicorn.Config:
    import uvicorn

    from worker.instance.http_protocol import InstanceHttp

    # InstanceHttp reads a body into one buffer, not uvicorn's three copies (its docstring).
    # No websockets (instances speak plain HTTP): uvicorn would otherwise import a websocket
    # implementation on every start.
    # Idle connections outlive the gateway's pool (60 s), so it never reuses one being closed.
    # On SIGTERM, requests and streams in flight finish for as long as the worker lets the
    # instance live (its drain: dilu.config's drain_s, a function's max_stream_s).
    # No proxy headers: only the gateway calls, and nothing reads the client's address.
    return uvicorn.Config(app, log_level="warning", access_log=False, ws="none", proxy_headers=False,
                          http=functools.partial(InstanceHttp, prefix=prefix), timeout_graceful_shutdown=None,
                          timeout_keep_alive=75)


def preload() -> None:
    """Imports what ``serve`` needs, uvicorn's lazily loaded protocol and lifespan modules
    included, so a spare process has it all done before it is assigned."""
    _uvicorn_config(Starlette()).load()


def bind_listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (containers bind their own; processes inherit one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(1024)
    return listener


def serve(config: InstanceConfig, listener: socket.socket, assigned_at: float | None = None,
          key: str | None = None, device: str = "cpu", also: socket.socket | None = None) -> None:
    """Serves on the bound ``listener`` (and ``also``, a Unix socket) until SIGTERM. ``assigned_at``: when
    a spare process (started and imported ahead of time) was given this instance; its start-up
    marks count from then."""

    state = RuntimeState(config, device)
    started = assigned_at if assigned_at is not None else _process_start_time()
    state.marks.update(process_start=started, runtime_imported=assigned_at or time.time())

    loops: list[asyncio.AbstractEventLoop] = []

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        loops.append(asyncio.get_running_loop())
        task = asyncio.create_task(_load_then_serve_batches(state))
        try:
            yield
        finally:
            task.cancel()

    def hand_over() -> None:
        """Stopping: the requests waiting for a slot go to other instances (the gateway retries
        a "try another" answer elsewhere); those running finish."""
        for runner in (state.batcher, state.streams):
            if runner is not None:
                runner.hand_over()

    prefix = route_prefix(key)
    app = create_app(state, lifespan, prefix)
    # A socket object, not uvicorn's fd=: socket(fileno=...) detects the real family (fd= assumes
    # AF_UNIX, which leaves Nagle on for TCP and costs ~40 ms per response through delayed ACKs).
    server = _prompt_server(_uvicorn_config(app, prefix), lambda: loops and loops[0].call_soon_threadsafe(hand_over))
    # uvicorn drains requests in flight on SIGTERM, then raises the signal again under the
    # disposition it found: left at the default, that kills the process before the exit
    # handlers (the handler's own clean-up) run. Found as this handler, it exits through them.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: exit_now())
    server.run(sockets=[listener] if also is None else [listener, also])


def exit_now() -> None:
    """Runs the exit handlers (the handler's own clean-up), then ends without tearing the
    interpreter down: with torch loaded that takes a few hundred milliseconds, for which the
    instance's memory would stay held for nothing."""
    import atexit

    _skip_teardown_finalizers()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


TEARDOWN_ONLY = ("torch.library",)   # modules whose exit finalizers only undo process-wide registrations


def _skip_teardown_finalizers() -> None:
    """Leaves out, at exit, the finalizers that only undo what the process registered in itself:
    torch removes each of its operator libraries from its dispatcher one by one (25-110 ms of the
    instance's exit on a loaded host, with its memory held meanwhile), for a process about to end.
    Every other exit handler, the handler's own included, still runs."""
    import weakref

    try:
        registry = list(weakref.finalize._registry.items())   # no public way to list them
    except AttributeError:
        return
    for finalizer, info in registry:
        if getattr(info.func, "__module__", None) in TEARDOWN_ONLY:
            finalizer.atexit = False


def _prompt_server(config: uvicorn.Config, on_exit: Callable[[], Any]) -> uvicorn.Server:  # uvicorn: lazily
    import uvicorn

    class PromptServer(uvicorn.Server):
        """A SIGTERM with no request in progress ends the instance at once; with requests in
        progress, uvicorn drains them first (its shutdown otherwise takes 0.1-0.2 s of ticks
        even when there is nothing to drain), once ``on_exit`` has handed the waiting ones over."""

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if not self.server_state.tasks:
                exit_now()
            on_exit()
            super().handle_exit(sig, frame)

    return PromptServer(config)
