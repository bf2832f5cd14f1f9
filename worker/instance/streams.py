"""Streaming handlers: generation step by step, requests joining and leaving the running batch.

A handler streams when it has ``start(request) -> state`` and ``step(states) -> chunks``. The
runtime keeps one running batch of at most ``max_batch_size`` requests. Before every step it
drops the requests whose callers left and admits waiting ones (``start``, on the handler's
thread); then it calls ``step`` once for all of them. Each result is that request's next chunk,
or ``dilu.Last(chunk)`` for its final one, after which the request leaves the batch. So a
request that arrives while a generation runs joins it at the next step (iteration-level
batching) instead of waiting for the batch to finish, and a caller who leaves frees its slot
within one step. The loop of steps runs on the handler's thread, not the event loop: a step
follows the last at once, while the event loop sends the last one's chunks.

Once a streamed answer's head and first chunk are sent, the runner's thread sends the chunks
after it itself, while the caller's socket takes them whole (``worker.instance.direct_writes``):
the loop's thread is not woken per step. What the runner makes before that is decided waits in
its stream, in order (``Stream.pass_on``).

A ``start`` that raises fails that request only; a ``step`` that raises fails every request in
the batch (a step is one call for all of them, so there is no telling which one broke it).

Backpressure: a stream whose caller has not read ``MAX_WAITING_CHUNKS`` of its chunks is left
out of the next steps until it reads (the batch goes on without it), and one that reads nothing
for ``stall_s`` is ended, its waiting chunks dropped: a caller that stops reading holds at most
that many chunks of the instance's memory, and never its handler's time.
"""

from __future__ import annotations

import asyncio
import functools
import json
import sys
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from dilu.handler import InputError, Last
from dilu.instance_protocol import stream_done, stream_error
from worker.instance.batcher import BatchError, HandedOver, as_error
from worker.instance.direct_writes import DirectSink
from worker.instance.failures import HandlerFailures

_END = object()
MAX_WAITING_CHUNKS = 64


def is_streaming(handler: Any) -> bool:
    """Whether ``handler`` generates step by step (has ``start`` and ``step``)."""
    return callable(getattr(handler, "start", None)) and callable(getattr(handler, "step", None))


# What the runner's thread hands the event loop after a step: (stream, CHUNK, a chunk),
# (stream, END, None), (stream, FAILED, the error that ends it) or (stream, STALLED, the error:
# its waiting chunks are dropped first).
CHUNK, END, FAILED, STALLED = range(4)
Delivery = tuple["Stream", int, Any]
# How a stream's chunks after its first reach its caller (Stream.route).
UNDECIDED, DIRECT, THROUGH_LOOP = range(3)


@dataclass(eq=False)
class Stream:
    """One request's chunks as they are made; ``cancel()`` when its caller leaves.

    The runner's thread makes its chunks and counts them (``chunks_made``); they reach its
    queue on the event loop, where its caller reads them (``chunks_read``)."""

    submitted: float = field(default_factory=time.perf_counter)
    cancelled: bool = False
    chunks_made: int = 0
    chunks_read: int = 0
    failure: BatchError | None = None     # set when it ended in an error before any chunk
    batch_sizes: list[int] = field(default_factory=list)
    full_since: float | None = None       # the runner's clock when it became full, unread since
    full_at_read: int = 0                 # chunks_read then (the runner's thread alone writes these two)
    on_read: Callable[[], None] = lambda: None    # its runner's wake-up: room again, or a slot freed
    chunks_sent_directly: int = 0         # of chunks_made, those the runner's thread sent itself (its alone)
    route: int = THROUGH_LOOP             # or UNDECIDED until its answer's head is sent, then either
    sink: DirectSink | None = None        # with DIRECT: sent through on the runner's thread, under _lock
    first_handed: bool = False            # its first chunk has gone to the loop (the runner's thread alone)
    held: list[Delivery] = field(default_factory=list)   # made while UNDECIDED (the runner's thread alone)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _queue: asyncio.Queue = field(default_factory=asyncio.Queue)

    def cancel(self) -> None:
        self.cancelled = True
        self.on_read()    # its slot is free: a runner waiting on full streams admits the next

    @property
    def full(self) -> bool:
        """Whether its caller has left as many chunks unread as a stream may hold."""
        return self.chunks_made - self.chunks_sent_directly - self.chunks_read >= MAX_WAITING_CHUNKS

    def decide_route(self, make_sink: Callable[[], DirectSink | None]) -> None:
        """Once its answer's head and first chunk are sent: the chunks after it go through
        ``make_sink()``'s sink from the runner's thread, or through the loop where it gives none.
        On the loop; the runner is woken to pass on what it held meanwhile."""
        with self._lock:
            self.sink = None if self.cancelled else make_sink()
            self.route = DIRECT if self.sink is not None else THROUGH_LOOP
        self.on_read()

    def close_sink(self) -> None:
        """Ends direct sending (the answer is over); on the loop."""
        with self._lock:
            if self.sink is not None:
                self.sink.close()

    def pass_on(self, delivery: Delivery) -> list[Delivery]:
        """What of ``delivery`` (this stream's) the loop must take, in order; a chunk that can go
        through the sink goes now. The first chunk and all before it are the loop's, which decides
        the answer by it; what comes after it waits until the route is decided. On the runner's thread."""
        kind = delivery[1]
        if kind == STALLED:       # its waiting chunks are dropped: the held ones too
            self.held.clear()
            return [delivery]
        if not self.first_handed:
            self.first_handed = kind == CHUNK
            return [delivery]
        if self.route == UNDECIDED and not self.cancelled:
            self.held.append(delivery)
            return []
        return self.release_held() + self._through(delivery)

    def release_held(self) -> list[Delivery]:
        """What was held, sent or for the loop, once the route is decided (the runner's thread)."""
        held, self.held = self.held, []
        return [out for delivery in held for out in self._through(delivery)]

    def _through(self, delivery: Delivery) -> list[Delivery]:
        if delivery[1] == CHUNK and self.route == DIRECT:
            with self._lock:
                sink = self.sink
                if sink is not None and sink.active and sink.send(delivery[2]):
                    self.chunks_sent_directly += 1
                    return []
        return [delivery]

    def put(self, chunk: Any) -> None:
        """Queues a chunk already counted in ``chunks_made`` (on the event loop)."""
        self._queue.put_nowait(chunk)

    def end(self, error: BaseException | None = None, drop_waiting: bool = False) -> None:
        """Its last item: the end, or ``error``; ``drop_waiting``: the chunks not yet read go."""
        if drop_waiting:
            while not self._queue.empty():
                self._queue.get_nowait()
        if error is None:
            self._queue.put_nowait(_END)
            return
        failure = as_error(error)
        if self.chunks_made == 0:
            self.failure = failure
        self._queue.put_nowait(failure)

    def mark_full(self, now: float) -> None:
        """Starts its stall clock at ``now`` if it has become full, or was read since it last
        did; stops it if it is not full. On the runner's thread."""
        if not self.full:
            self.full_since = None
        elif self.full_since is None or self.full_at_read != self.chunks_read:
            self.full_since, self.full_at_read = now, self.chunks_read

    async def chunks(self) -> AsyncIterator[Any]:
        """The chunks until the last; a failure is raised as ``BatchError``."""
        while True:
            item = await self._queue.get()
            if item is _END:
                return
            if isinstance(item, BatchError):
                raise item
            was_full = self.full
            self.chunks_read += 1
            if was_full:
                self.on_read()
            yield item


class StreamRunner:
    """Runs a streaming handler's batch on a thread of its own (``executor``'s, one thread),
    step after step: the next step does not wait for the event loop to send the last one's
    chunks, and the loop is woken once per step to send them all."""

    def __init__(self, handler: Any, *, max_batch_size: int, executor: Executor | None = None,
                 on_step: Callable[[int], None] | None = None, stall_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._handler = handler
        self.failures = HandlerFailures()
        self._max = max_batch_size
        self._executor = executor
        self._waiting: deque[tuple[Stream, Any]] = deque()    # appended on the loop, taken by the thread
        self._on_step = on_step or (lambda _size: None)
        self._stall_s = stall_s
        self._clock = clock
        self._wake = threading.Event()   # a full stream was read, a request arrived, or the runner stops
        self._stopping = False
        self.stalled = 0                 # streams ended because their callers stopped reading
        self._holding: set[Stream] = set()   # streams holding deliveries until their route is decided

    def queued(self) -> int:
        """Streams waiting for a slot in the running batch."""
        return len(self._waiting)

    def hand_over(self) -> int:
        """Ends every stream still waiting for a slot with ``HandedOver`` (the instance is
        stopping): before its first chunk, so the gateway sends it to another instance. The
        running streams go on to their end. Returns how many. On the event loop."""
        count = 0
        while True:
            try:
                stream, _ = self._waiting.popleft()
            except IndexError:
                return count
            if not stream.cancelled:
                stream.end(HandedOver())
                count += 1

    def submit(self, request: Any, direct: bool = False) -> Stream:
        """``request``'s stream; ``direct``: its chunks after the first may be sent from the
        runner's thread, once its caller has decided so (``Stream.decide_route``)."""
        stream = Stream(on_read=self._wake.set, route=UNDECIDED if direct else THROUGH_LOOP)
        self._waiting.append((stream, request))
        self._wake.set()
        return stream

    async def run(self) -> None:
        """Serves until cancelled (the step in progress then finishes, and the thread ends)."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._serve, loop)
        finally:
            self._stopping = True
            self._wake.set()

    def _serve(self, loop: asyncio.AbstractEventLoop) -> None:
        running: list[tuple[Stream, Any]] = []
        while not self._stopping:
            self._wake.clear()    # before looking: a wake-up from here on is not lost
            delivered: list[Delivery] = []
            running = [(stream, state) for stream, state in running if not stream.cancelled]
            while len(running) < self._max:
                try:
                    arrival = self._waiting.popleft()
                except IndexError:    # none, or hand_over took the last meanwhile
                    break
                running += self._admit(arrival, delivered)
            running = self._end_stalled(running, delivered)
            ready = [pair for pair in running if not pair[0].full]
            if ready:
                held = [pair for pair in running if pair[0].full]
                running = self._step(ready, delivered) + held
            for_loop = self._pass_on(delivered)
            if for_loop:
                loop.call_soon_threadsafe(_deliver, for_loop)
            # Nothing to step: wait for a request, a read, or the first full stream to stall (unless
            # passing on what a stream held has made room in it).
            if not ready and all(stream.full for stream, _ in running):
                self._wake.wait(self._next_stall(running) if running else None)

    def _pass_on(self, delivered: list[Delivery]) -> list[Delivery]:
        """What of a pass's deliveries the loop must take, with what streams held until their
        route was decided (``Stream.pass_on``); the rest is sent from this thread."""
        for_loop: list[Delivery] = []
        for stream in [stream for stream in self._holding if stream.route != UNDECIDED or stream.cancelled]:
            self._holding.discard(stream)
            for_loop += stream.release_held()
        for delivery in delivered:
            stream = delivery[0]
            for_loop += stream.pass_on(delivery)
            if stream.held:
                self._holding.add(stream)
        return for_loop

    def _end_stalled(self, running: list[tuple[Stream, Any]],
                     delivered: list[Delivery]) -> list[tuple[Stream, Any]]:
        """Ends the streams whose callers read nothing for ``stall_s``; the others go on."""
        now, still = self._clock(), []
        for stream, state in running:
            stream.mark_full(now)
            if stream.full_since is not None and now - stream.full_since >= self._stall_s:
                self.stalled += 1
                print(f"dilu: a stream's caller read none of its last {MAX_WAITING_CHUNKS} chunks for "
                      f"{self._stall_s:g} s: stream ended", file=sys.stderr, flush=True)
                stream.cancel()
                delivered.append((stream, STALLED, BatchError(f"the stream's caller read none of its last "
                                                              f"{MAX_WAITING_CHUNKS} chunks for {self._stall_s:g} s: "
                                                              "ended", status=504)))
            else:
                still.append((stream, state))
        return still

    def _next_stall(self, running: list[tuple[Stream, Any]]) -> float:
        """Seconds until the first of these full streams would stall."""
        now = self._clock()
        return max(0.0, min(stream.full_since + self._stall_s - now for stream, _ in running
                            if stream.full_since is not None))

    def _admit(self, arrival: tuple[Stream, Any], delivered: list[Delivery]) -> list[tuple[Stream, Any]]:
        stream, request = arrival
        if stream.cancelled:
            return []
        try:
            return [(stream, self._handler.start(request))]
        except Exception as exc:  # noqa: BLE001 - the handler's refusal is this request's answer
            self.failures.failed(exc, "start")
            delivered.append((stream, FAILED, exc))
            return []

    def _step(self, running: list[tuple[Stream, Any]], delivered: list[Delivery]) -> list[tuple[Stream, Any]]:
        states = [state for _, state in running]
        try:
            chunks = self._handler.step(states)
            if not isinstance(chunks, (list, tuple)) or len(chunks) != len(states):
                got = len(chunks) if isinstance(chunks, (list, tuple)) else type(chunks).__name__
                raise BatchError(f"step() must return a list of {len(states)} chunks, got {got}")
        except Exception as exc:  # noqa: BLE001 - a failed step fails the requests that were in it
            self.failures.failed(exc, "step")
            delivered.extend((stream, FAILED, exc) for stream, _ in running)
            return []
        self._on_step(len(running))
        # Read before the counts rise: whoever sees a stream full sees it full since this time.
        now, still = self._clock(), []
        for (stream, state), chunk in zip(running, chunks, strict=True):
            stream.batch_sizes.append(len(running))
            if isinstance(chunk, InputError):
                delivered.append((stream, FAILED, chunk))
                continue
            last = isinstance(chunk, Last)
            if last:
                chunk = chunk.chunk
            if chunk is not None or not last:
                stream.chunks_made += 1
                delivered.append((stream, CHUNK, chunk))
            if last:
                delivered.append((stream, END, None))
            else:
                still.append((stream, state))
            stream.mark_full(now)
        return still


def _deliver(items: list[Delivery]) -> None:
    """Hands a step's chunks and endings to their streams, on the event loop."""
    for stream, kind, item in items:
        if kind == CHUNK:
            stream.put(item)
        elif kind == END:
            stream.end()
        else:
            stream.end(item, drop_waiting=kind == STALLED)


async def whole_answer(handler: Any, stream: Stream) -> Any:
    """A plain request's answer from a streaming handler: ``handler.finish(chunks)`` when it has
    one, else the list of chunks."""
    chunks = [chunk async for chunk in stream.chunks()]
    finish = getattr(handler, "finish", None)
    return finish(chunks) if callable(finish) else chunks


def _encode(kind: str, document: Any) -> bytes:
    text = json.dumps(document, allow_nan=False)
    return f"data: {text}\n\n".encode() if kind == "sse" else f"{text}\n".encode()


def chunk_encoder(kind: str) -> Callable[[Any], bytes]:
    """How a chunk is framed in a ``kind`` stream (for a ``DirectSink``)."""
    return functools.partial(_encode, kind)


async def stream_body(stream: Stream, kind: str) -> AsyncIterator[bytes]:
    """The chunks as server-sent events (``data: <json>``) or JSON lines, then the stream's
    terminator (``dilu.instance_protocol.stream_done``): a finished stream's, or a failure's
    ``{"error", "status"}`` (``event: error`` in server-sent events)."""
    sent = 0
    try:
        async for chunk in stream.chunks():
            try:
                yield _encode(kind, chunk)
            except (TypeError, ValueError) as exc:
                raise BatchError(f"a chunk is not JSON-serialisable: {exc}") from None
            sent += 1
    except BatchError as exc:
        yield stream_error(kind, str(exc), exc.status)
        return
    yield stream_done(kind, sent + stream.chunks_sent_directly)
