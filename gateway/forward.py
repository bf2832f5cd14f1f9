"""Forwarding an invocation to an instance over pooled keep-alive HTTP/1.1 connections.

The gateway's busiest code: every request crosses it twice. It speaks only what Dilu's own
instances answer (worker/instance/http_protocol.py: a status, headers, a body by length or in
chunks), parsed by httptools, over connections kept per instance. A general client
costs more per request than the proxying itself: against a no-op instance, aiohttp's session
added 20-40 us of Python per request, and httpx's pool collapsed under concurrency (about 330
req/s through it, 5,800 through aiohttp, at 32 callers). See bench/gateway_overhead.py.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools

from dilu.instance_protocol import LOADING_HEADER, NOT_STREAMING_HEADER, TENSORS_HEADER
from dilu.local_sockets import SocketFolder

PASSED_HEADERS = ("x-dilu-batch-size", "x-dilu-latency-ms", "x-dilu-instance", LOADING_HEADER,
                  NOT_STREAMING_HEADER)
_PASSED = frozenset(name.encode() for name in PASSED_HEADERS)
_TENSORS = TENSORS_HEADER.encode()
IDLE_S = 60.0     # an idle connection is dropped after this; instances keep theirs for 75 s
MAX_IDLE_PER_INSTANCE = 256
STREAM_BUFFER_PIECES = 64   # a stream's pieces held for a slow caller before the instance is paused


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    content_type: str
    headers: dict[str, str]        # those passed on to the caller (PASSED_HEADERS)
    tensors: str | None = None     # a tensor frame's header (dilu.tensor_frames)


class NotDelivered(Exception):
    """The connection could not be made: the instance never saw the request (safe to retry)."""


class InstanceFailed(Exception):
    """The connection broke after the request was sent: the instance may have seen it."""


class InstanceTimeout(Exception):
    """The instance did not answer in time."""


@dataclass(frozen=True)
class _Target:
    host: str
    port: int
    path: bytes
    authority: bytes


@functools.lru_cache(maxsize=4096)
def _target(url: str) -> _Target:
    parts = urlsplit(url)
    return _Target(parts.hostname or "127.0.0.1", parts.port or 80, (parts.path or "/").encode(),
                   parts.netloc.encode())


@dataclass
class Streamed:
    """An instance's answer as it comes: status and headers, then ``chunks()``; ``close()`` it
    (or read it to the end) to give the connection back."""

    status: int
    content_type: str
    headers: dict[str, str]
    chunks: Callable[[float, float], AsyncIterator[bytes]]   # (idle s, monotonic deadline) -> the body
    close: Callable[[], None]     # idempotent: gives the connection back (or closes it, mid-stream)


class Pieces:
    """A stream's body as the parser hands it over, for its one reader: pieces, then None (the
    end) or an exception. A reader finding pieces waiting takes them without a timer; one is
    armed only to wait for the next."""

    def __init__(self) -> None:
        self._items: deque[bytes | Exception | None] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: bytes | Exception | None) -> None:
        self._items.append(item)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def qsize(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        return not self._items

    async def arrival(self) -> None:
        """Returns once something is there to take."""
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def take(self) -> bytes | Exception | None:
        """The oldest item (there must be one)."""
        return self._items.popleft()


class _Connection(asyncio.Protocol):
    """One kept-alive connection to an instance; one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self._reply: asyncio.Future[Reply] | None = None
        self._head: asyncio.Future[Reply] | None = None       # streaming: the status and headers
        self.pieces: Pieces | None = None   # streaming: the body
        self._reset()

    def _reset(self) -> None:
        self._status = 0
        self._content_type = "application/json"
        self._headers: dict[str, str] = {}
        self._tensors: str | None = None
        self._body: list[bytes] = []
        self._keep = True

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(InstanceFailed(f"the instance's answer is not HTTP: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(InstanceFailed(f"connection closed by the instance{f': {exc}' if exc else ''}"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-type":
            self._content_type = value.decode("latin-1")
        elif name in _PASSED:
            self._headers[name.decode("latin-1")] = value.decode("latin-1")
        elif name == _TENSORS:
            self._tensors = value.decode("latin-1")
        elif name == b"connection" and value.lower() == b"close":
            self._keep = False

    def on_headers_complete(self) -> None:
        self._status = self.parser.get_status_code()
        if self._head is not None and not self._head.done():
            self._head.set_result(Reply(self._status, b"", self._content_type, self._headers))

    def on_body(self, body: bytes) -> None:
        if self.pieces is not None:
            self.pieces.put_nowait(body)
            # A caller who reads slower than the instance writes: stop reading the instance (its
            # generation then waits on its socket) rather than buffer the stream here.
            if self.pieces.qsize() >= STREAM_BUFFER_PIECES and self.transport is not None:
                self.transport.pause_reading()
        else:
            self._body.append(body)

    def on_message_complete(self) -> None:
        if self.pieces is not None:
            self.pieces.put_nowait(None)
            if not (self._keep and self.parser.should_keep_alive()):
                self.close()
            self._reset()
            return
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        reply = Reply(self._status, body, self._content_type, self._headers, self._tensors)
        if not (self._keep and self.parser.should_keep_alive()):
            self.close()
        self._reset()
        if self._reply is not None and not self._reply.done():
            self._reply.set_result(reply)

    def _fail(self, exc: Exception) -> None:
        if self._reply is not None and not self._reply.done():
            self._reply.set_exception(exc)
        if self._head is not None and not self._head.done():
            self._head.set_exception(exc)
        elif self.pieces is not None:
            self.pieces.put_nowait(exc)

    def send(self, head: bytes, body: bytes | memoryview, streaming: bool = False) -> asyncio.Future[Reply]:
        """The reply (streaming: its status and headers, the body then arriving in ``pieces``)."""
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._reply, self._head, self.pieces = (None, future, Pieces()) if streaming else (future, None, None)
        assert self.transport is not None
        if len(body) <= 16384:
            self.transport.write(b"".join((head, body)))
        else:   # a large body goes as it is, not copied behind its head
            self.transport.writelines((head, body))
        return future

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Forwarder:
    """POSTs bodies to instances; ``max_connections`` bounds the connections in use at once.
    With ``sockets`` (``dilu.local_sockets``), an instance on this host is reached through its
    Unix socket there, and over TCP when it has none this gateway may use."""

    def __init__(self, max_connections: int = 1024, sockets: SocketFolder | None = None) -> None:
        self._sockets = sockets
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: dict[tuple[str, int], list[_Connection]] = defaultdict(list)

    async def start(self) -> None:
        """Nothing to open ahead: connections are made on first use."""

    async def close(self) -> None:
        for connections in self._idle.values():
            for connection in connections:
                connection.close()
        self._idle.clear()
        if self._sockets is not None:
            self._sockets.close()

    async def _connection(self, target: _Target, instance_id: str | None) -> _Connection:
        idle = self._idle[(target.host, target.port)]
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if not connection.closed and now - connection.idle_since < IDLE_S:
                return connection
            connection.close()
        loop = asyncio.get_running_loop()
        address = self._sockets.address_of(instance_id) if self._sockets is not None and instance_id else None
        if address is not None:
            try:
                _, connection = await loop.create_unix_connection(_Connection, address)
                return connection
            except OSError:
                pass     # gone, or not this gateway's to reach: TCP tells which
        try:
            _, connection = await loop.create_connection(_Connection, target.host, target.port)
        except OSError as exc:
            raise NotDelivered(f"cannot connect to {target.host}:{target.port}: {exc.strerror or exc}") from exc
        return connection

    def _keep(self, target: _Target, connection: _Connection) -> None:
        idle = self._idle[(target.host, target.port)]
        if connection.closed or len(idle) >= MAX_IDLE_PER_INSTANCE:
            connection.close()
            return
        connection.idle_since = time.monotonic()
        idle.append(connection)

    async def post(self, url: str, body: bytes | memoryview, timeout_s: float,
                   content_type: str = "application/json", tensors: str | None = None,
                   instance_id: str | None = None) -> Reply:
        """The instance's reply to ``body`` POSTed to ``url`` (``tensors``: the header of a tensor
        frame; ``instance_id``: whose socket to try first); ``NotDelivered`` when no connection
        could be made, ``InstanceTimeout`` after ``timeout_s``, ``InstanceFailed`` when the
        connection broke after the request was sent."""
        target = _target(url)
        extra = b"" if tensors is None else b"%s: %s\r\n" % (_TENSORS, tensors.encode("latin-1"))
        head = b"POST %s HTTP/1.1\r\nhost: %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n%s\r\n" % (
            target.path, target.authority, content_type.encode("latin-1"), len(body), extra)
        async with self._slots:
            connection = await self._connection(target, instance_id)
            done = False
            try:
                async with asyncio.timeout(timeout_s):
                    reply = await connection.send(head, body)
                done = True
            except TimeoutError as exc:
                raise InstanceTimeout(f"no answer within {timeout_s:g}s") from exc
            finally:
                if done:
                    self._keep(target, connection)
                else:   # a reply may still be on its way: this connection cannot carry another request
                    connection.close()
            return reply

    async def stream(self, url: str, body: bytes | memoryview, timeout_s: float,
                     content_type: str = "application/json", accept: str = "text/event-stream",
                     instance_id: str | None = None) -> Streamed:
        """POSTs ``body`` asking for a stream; returns once the status and headers are in (within
        ``timeout_s``). The body then comes through ``chunks(idle_s, deadline)``, which ends the
        stream with ``InstanceTimeout`` when no piece arrives for ``idle_s`` or at the monotonic
        ``deadline``; leaving it early closes the connection, which tells the instance its caller
        went."""
        target = _target(url)
        head = b"POST %s HTTP/1.1\r\nhost: %s\r\ncontent-type: %s\r\naccept: %s\r\ncontent-length: %d\r\n\r\n" % (
            target.path, target.authority, content_type.encode("latin-1"), accept.encode("latin-1"), len(body))
        await self._slots.acquire()
        try:
            connection = await self._connection(target, instance_id)
        except BaseException:
            self._slots.release()
            raise
        try:
            async with asyncio.timeout(timeout_s):
                reply = await connection.send(head, body, streaming=True)
        except BaseException as exc:
            connection.close()
            self._slots.release()
            if isinstance(exc, TimeoutError):
                raise InstanceTimeout(f"no answer within {timeout_s:g}s") from exc
            raise

        pieces = connection.pieces
        assert pieces is not None
        state = {"finished": False, "closed": False}

        def close() -> None:
            if state["closed"]:
                return
            state["closed"] = True
            connection.pieces = None
            if state["finished"]:
                self._keep(target, connection)
            else:
                connection.close()
            self._slots.release()

        async def chunks(idle_s: float, deadline: float = float("inf")) -> AsyncIterator[bytes]:
            try:
                while True:
                    if pieces.empty():      # a timer only when there is something to wait for
                        try:
                            async with asyncio.timeout(min(idle_s, deadline - time.monotonic())):
                                await pieces.arrival()
                        except TimeoutError as exc:
                            raise InstanceTimeout(f"the stream sent nothing for {idle_s:g}s, or ran past its "
                                                  "limit") from exc
                    elif time.monotonic() >= deadline:
                        raise InstanceTimeout("the stream ran past its limit")
                    piece = pieces.take()
                    if pieces.qsize() < STREAM_BUFFER_PIECES // 2 and connection.transport is not None:
                        connection.transport.resume_reading()
                    if piece is None:
                        state["finished"] = True
                        return
                    if isinstance(piece, Exception):
                        raise piece
                    yield piece
            finally:
                close()

        return Streamed(reply.status, reply.content_type, reply.headers, chunks, close)

