"""The instance's HTTP/1.1 connection protocol, in place of uvicorn's, under uvicorn's server.

A request body is gathered into one buffer of its ``content-length`` as it arrives (one copy of
each piece the socket gives) and handed to the app whole, in one ``http.request`` message.
uvicorn's protocols copy a body three times on its way (the parser's piece, a bytearray, a
``bytes`` of it) and pause reading every 64 KiB: for [8, 150528] FP32 (4.8 MB) an echo app took
about 8 ms over a Unix socket, 3 ms with this protocol (bench/instance_http.py).

It speaks what the gateway, the worker and a scraper send an instance: requests with a
``content-length`` or no body, kept alive, one at a time on a connection (a pipelined request
waits for the answer before it). A chunked request body is refused (411), as are heads over
64 KiB (431), bodies over ``MAX_BODY_BYTES`` (413) and unparsable requests (400). With a
``prefix`` (the instance's key route, ``dilu.instance_protocol.route_prefix``), a request for any
other path is answered 404 before its body is read: whoever lacks the key cannot make the
instance set aside memory for a body by naming its length.

uvicorn's server keeps what it does around connections: the listeners, the lifespan, signals
and draining on SIGTERM. Its contract with a protocol: built as
``cls(config=, server_state=, app_state=, _loop=)``; registered in ``server_state.connections``
while open; each request's task in ``server_state.tasks``; ``shutdown()`` closes an idle
connection and lets a busy one finish its answer.
"""

from __future__ import annotations

import asyncio
import hmac
import http
import sys
import traceback
import urllib.parse
from typing import Any

import httptools

from worker.instance.direct_writes import DIRECT_WRITES, DirectSink, Encoder, can_write_directly

HEAD_LIMIT = 64 * 1024
MAX_BODY_BYTES = 4 * 1024 ** 3   # the instance's own bound; the gateway's (DILU_MAX_REQUEST_BYTES) is lower
_HEAD_END = b"\r\n\r\n"


def _status_line(status: int) -> bytes:
    try:
        reason = http.HTTPStatus(status).phrase.encode()
    except ValueError:
        reason = b""
    return b"HTTP/1.1 %d %s\r\n" % (status, reason)


class _Head:
    """httptools' callbacks for one request head: its URL and headers."""

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.complete = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value.rstrip(b" \t")))

    def on_headers_complete(self) -> None:
        self.complete = True


class _Exchange:
    """One request and its answer: the ASGI ``receive`` and ``send`` of its task."""

    def __init__(self, connection: InstanceHttp, scope: dict[str, Any], keep_alive: bool) -> None:
        self.connection = connection
        self.scope = scope
        self.keep_alive = keep_alive
        self.body: bytearray | bytes = b""
        self.body_given = False
        self.ended = asyncio.Event()      # the answer is sent or the connection is gone
        self.disconnected = False
        self.started: tuple[int, list[tuple[bytes, bytes]]] | None = None
        self.head_sent = False
        self.chunked = False
        self.complete = False

    async def receive(self) -> dict[str, Any]:
        if not self.body_given and not self.disconnected:
            self.body_given = True
            # A bytearray, not bytes: the one buffer the body was gathered in, which arrays are made on.
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self.ended.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        connection = self.connection
        if connection.writing_paused and not self.disconnected:
            await connection.drained.wait()
        if self.disconnected or self.complete:
            return
        kind = message["type"]
        if kind == "http.response.start" and self.started is None:
            self.started = (message["status"], list(message.get("headers", ())))
            return
        if kind != "http.response.body" or self.started is None:
            raise RuntimeError(f"unexpected ASGI message {kind!r} in this state")
        body = message.get("body", b"")
        more = message.get("more_body", False)
        pieces: list[bytes] = []
        if not self.head_sent:
            pieces.append(self._head(len(body), more))
            self.head_sent = True
        if self.scope["method"] == "HEAD":
            body = b""
        if self.chunked:
            if body:
                pieces += [b"%x\r\n" % len(body), body, b"\r\n"]
            if not more:
                pieces.append(b"0\r\n\r\n")
        elif body:
            pieces.append(body)
        if len(body) <= 16384:
            connection.transport.write(b"".join(pieces))
        else:   # a large body goes as it is, not copied behind its head
            connection.transport.writelines(pieces)
        if not more:
            self.complete = True
            self.ended.set()
            connection.answered(self)

    def direct_sink(self, encode: Encoder) -> DirectSink | None:
        """The answer's socket for its chunks to be sent from another thread
        (``worker.instance.direct_writes``), once its head has gone and while the loop has
        nothing of it left to send; None otherwise. Offered to the app as the scope's
        ``extensions[DIRECT_WRITES]``."""
        connection = self.connection
        if (not self.head_sent or not self.chunked or self.complete or self.disconnected
                or connection.writing_paused or not can_write_directly(connection.transport)):
            return None
        return DirectSink(connection.transport, encode)

    def _head(self, length: int, more: bool) -> bytes:
        status, headers = self.started
        names = {name.lower() for name, _ in headers}
        lines = [_status_line(status)]
        lines += [b"%s: %s\r\n" % (name, value) for name, value in headers]
        if b"content-length" not in names:
            if more:
                self.chunked = True
                lines.append(b"transfer-encoding: chunked\r\n")
            else:
                lines.append(b"content-length: %d\r\n" % length)
        if not self.keep_alive:
            lines.append(b"connection: close\r\n")
        lines.append(b"\r\n")
        return b"".join(lines)

    def lost(self) -> None:
        self.disconnected = True
        self.ended.set()


class InstanceHttp(asyncio.Protocol):
    """One connection to the instance (see the module's docstring)."""

    def __init__(self, config: Any, server_state: Any, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None, prefix: str = "") -> None:
        self.prefix = prefix.encode("ascii")
        self.app = config.loaded_app
        self.root_path = config.root_path
        self.keep_alive_s = config.timeout_keep_alive
        self.server_state = server_state
        self.app_state = app_state
        self.loop = _loop or asyncio.get_event_loop()
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.head = bytearray()      # bytes not yet parsed: a head coming, or a pipelined request
        self.body: bytearray | None = None    # set while a body is being gathered into it
        self.body_len = 0
        self.exchange: _Exchange | None = None
        self.reading_paused = False
        self.writing_paused = False
        self.drained = asyncio.Event()
        self.drained.set()
        self.idle_timer: asyncio.TimerHandle | None = None

    # The transport's side
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server_state.connections.add(self)
        self.server, self.client = _address(transport, "sockname"), _address(transport, "peername")
        self._arm_idle_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server_state.connections.discard(self)
        self._cancel_idle_timer()
        if self.exchange is not None:
            self.exchange.lost()
        self.drained.set()

    def eof_received(self) -> bool:
        return False     # the caller has gone: close

    def pause_writing(self) -> None:
        self.writing_paused = True
        self.drained.clear()

    def resume_writing(self) -> None:
        self.writing_paused = False
        self.drained.set()

    def data_received(self, data: bytes) -> None:
        self._cancel_idle_timer()
        if self.body is not None:
            taken = self._fill(data)
            if taken < len(data):
                self.head += memoryview(data)[taken:]
        else:
            self.head += data
        if self.exchange is None:
            self._next_request()
        elif len(self.head) >= HEAD_LIMIT and not self.reading_paused:
            self.transport.pause_reading()     # a pipelined request fills the buffer: wait for the answer
            self.reading_paused = True
        if self.exchange is None or self.body is not None:   # a head or body still to come: bounded wait
            self._arm_idle_timer()

    def _fill(self, data: bytes) -> int:
        """Copies what ``data`` holds of the body being read into its buffer; the count taken."""
        body = self.body
        taken = min(len(data), len(body) - self.body_len)
        body[self.body_len:self.body_len + taken] = data if taken == len(data) else memoryview(data)[:taken]
        self.body_len += taken
        if self.body_len == len(body):
            self.body = None
            self._start(body)
        return taken

    # uvicorn's server's side
    def shutdown(self) -> None:
        """Graceful shutdown: an idle connection closes now, a busy one after its answer."""
        if self.exchange is None:
            self.transport.close()
        else:
            self.exchange.keep_alive = False

    # Requests
    def _next_request(self) -> None:
        end = self.head.find(_HEAD_END, 0, HEAD_LIMIT)
        if end < 0:
            if len(self.head) >= HEAD_LIMIT:
                self._refuse(431, "request head is over 64 KiB")
            return
        size = end + len(_HEAD_END)
        head = _Head()
        parser = httptools.HttpRequestParser(head)
        try:
            parser.feed_data(bytes(self.head[:size]))
        except httptools.HttpParserError as exc:
            self._refuse(400, f"invalid HTTP request: {exc}")
            return
        if not head.complete:
            self._refuse(400, "invalid HTTP request head")
            return
        if self.prefix and not _under(head.url, self.prefix):
            self._refuse(404, "no such route")
            return
        fields = dict(head.headers)
        if b"transfer-encoding" in fields:
            self._refuse(411, "a request body needs a content-length (chunked bodies are not taken)")
            return
        try:
            length = int(fields.get(b"content-length", b"0"))
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY_BYTES:
            self._refuse(413 if length > 0 else 400, "content-length is not a size this instance takes")
            return
        self.exchange = _Exchange(self, self._scope(parser, head), parser.should_keep_alive())
        self.exchange.scope["extensions"] = {DIRECT_WRITES: self.exchange.direct_sink}
        if fields.get(b"expect", b"").lower() == b"100-continue":
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        taken = min(len(self.head) - size, length)
        body = bytearray(length)
        body[:taken] = memoryview(self.head)[size:size + taken]
        del self.head[:size + taken]     # a bytearray drops its front without moving the rest
        if taken == length:
            self._start(body)
        else:
            self.body, self.body_len = body, taken

    def _scope(self, parser: httptools.HttpRequestParser, head: _Head) -> dict[str, Any]:
        url = httptools.parse_url(head.url)
        raw_path = url.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        return {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": parser.get_http_version(), "method": parser.get_method().decode("ascii"),
            "scheme": "http", "server": self.server, "client": self.client,
            "root_path": self.root_path, "path": self.root_path + path,
            "raw_path": self.root_path.encode("ascii") + raw_path, "query_string": url.query or b"",
            "headers": head.headers, "state": self.app_state.copy(),
        }

    def _start(self, body: bytearray) -> None:
        exchange = self.exchange
        exchange.body = body
        task = self.loop.create_task(self._run(exchange))
        self.server_state.tasks.add(task)
        task.add_done_callback(self.server_state.tasks.discard)

    async def _run(self, exchange: _Exchange) -> None:
        try:
            await self.app(exchange.scope, exchange.receive, exchange.send)
        except BaseException:    # noqa: BLE001 - the app's fault, answered 500 as uvicorn does
            traceback.print_exc(file=sys.stderr)
            if exchange.started is None or not exchange.head_sent:
                await self._fail(exchange)
            else:
                self.transport.close()
            return
        if not exchange.complete and not exchange.disconnected:
            if exchange.head_sent:
                self.transport.close()    # an answer cut short must not look whole
            else:
                await self._fail(exchange)

    async def _fail(self, exchange: _Exchange) -> None:
        exchange.started, exchange.keep_alive = None, False
        await exchange.send({"type": "http.response.start", "status": 500,
                             "headers": [(b"content-type", b"text/plain; charset=utf-8")]})
        await exchange.send({"type": "http.response.body", "body": b"Internal Server Error"})

    def answered(self, exchange: _Exchange) -> None:
        """An answer is sent: the connection closes or takes its next request."""
        self.server_state.total_requests += 1
        self.exchange = None
        if not exchange.keep_alive:
            self.transport.close()
            return
        if self.reading_paused:
            self.reading_paused = False
            self.transport.resume_reading()
        self._arm_idle_timer()
        if self.head:
            self._next_request()

    def _refuse(self, status: int, message: str) -> None:
        body = message.encode()
        self.transport.write(_status_line(status) + b"content-type: text/plain; charset=utf-8\r\n"
                             b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))
        self.transport.close()

    def _arm_idle_timer(self) -> None:
        self._cancel_idle_timer()
        self.idle_timer = self.loop.call_later(self.keep_alive_s, self._close_idle)

    def _cancel_idle_timer(self) -> None:
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None

    def _close_idle(self) -> None:
        """No request for ``timeout_keep_alive``, or one whose head or body stopped coming."""
        if self.exchange is None or self.body is not None:
            self.transport.close()


def _under(url: bytes, prefix: bytes) -> bool:
    """Whether ``url`` is ``prefix`` or below it (compared in constant time: the prefix holds a key)."""
    start, rest = url[:len(prefix)], url[len(prefix):len(prefix) + 1]
    return hmac.compare_digest(start, prefix) and rest in (b"", b"/", b"?")


def _address(transport: asyncio.BaseTransport, which: str) -> tuple[str, int] | None:
    """A TCP socket's (host, port); None for a Unix socket, as uvicorn gives."""
    address = transport.get_extra_info(which)
    return (str(address[0]), int(address[1])) if isinstance(address, tuple) and len(address) >= 2 else None
