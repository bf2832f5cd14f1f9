"""The instance's HTTP protocol (worker/instance/http_protocol.py) under a real uvicorn server,
on a Unix socket, spoken to byte by byte and by http.client."""

from __future__ import annotations

import asyncio
import functools
import http.client
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from tests.raw_http import read_answer, serve_lifespan
from tests.waiting import async_eventually
from worker.instance.http_protocol import HEAD_LIMIT, InstanceHttp


class Seen:
    """What the app below was given, for the tests to read."""

    def __init__(self) -> None:
        self.bodies: list[Any] = []
        self.disconnected = asyncio.Event()
        self.waiting = asyncio.Event()
        self.release = asyncio.Event()


def _app(seen: Seen):
    async def app(scope: dict[str, Any], receive, send) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
            return
        message = await receive()
        path = scope["path"]
        seen.bodies.append(message["body"])
        if path == "/wait-for-leave":      # holds the answer until the caller leaves
            seen.waiting.set()
            assert (await receive())["type"] == "http.disconnect"
            seen.disconnected.set()
            return
        if path == "/slow":                # holds the answer until the test releases it
            seen.waiting.set()
            await seen.release.wait()
        if path == "/fail":
            raise RuntimeError("the app failed")
        if path == "/nothing":
            return
        if path == "/stream":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            for piece in (b"one ", b"two ", b"three"):
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        answer = b"%s %d %s" % (scope["method"].encode(), len(message["body"]), path.encode())
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": answer})
    return app


@pytest.fixture
def prefix() -> str:
    """The instance's key route (none unless a test names one)."""
    return ""


@pytest.fixture
def keep_alive_s() -> float:
    """How long the server keeps an idle connection (long unless a test names a time)."""
    return 75


@pytest.fixture
async def served(tmp_path: Path, prefix: str, keep_alive_s: float) -> AsyncIterator[tuple[str, Seen, uvicorn.Server]]:
    seen = Seen()
    path = str(tmp_path / "instance.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    config = uvicorn.Config(_app(seen), http=functools.partial(InstanceHttp, prefix=prefix), ws="none",
                            log_level="warning", timeout_keep_alive=keep_alive_s, timeout_graceful_shutdown=None)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[listener]))
    await _started(server)
    try:
        yield path, seen, server
    finally:
        server.should_exit = True
        async with asyncio.timeout(30):
            await task


async def _started(server: uvicorn.Server) -> None:
    async def started() -> bool:
        return server.started
    await async_eventually(started, timeout=30, interval=0.01, what="the server to listen")


async def _connect(path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_unix_connection(path)



def _post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nhost: instance\r\ncontent-length: %d\r\n%s\r\n" % (path.encode(), len(body), extra) \
        + body


async def test_a_body_sent_in_pieces_reaches_the_app_whole_in_one_buffer(served) -> None:
    path, seen, _ = served
    reader, writer = await _connect(path)
    body = bytes(range(256)) * 20_000      # 5 MB, as eight images are
    request = _post("/infer", body)
    for start in range(0, len(request), 300_001):     # pieces that cut the head from the body mid-way
        writer.write(request[start:start + 300_001])
        await writer.drain()
    status, _, answer = await read_answer(reader)
    assert (status, answer) == (200, b"POST %d /infer" % len(body))
    assert seen.bodies[0] == body
    assert isinstance(seen.bodies[0], bytearray), "the buffer it was gathered in, not a copy of it"
    writer.close()


async def test_requests_on_one_connection_are_answered_in_order_pipelined_or_not(served) -> None:
    path, _, _ = served
    reader, writer = await _connect(path)
    writer.write(_post("/a", b"x" * 10))
    await writer.drain()
    assert (await read_answer(reader))[2] == b"POST 10 /a"
    writer.write(_post("/b", b"yy") + b"GET /c HTTP/1.1\r\nhost: instance\r\n\r\n" + _post("/d", b""))
    await writer.drain()
    answers = [(await read_answer(reader))[2] for _ in range(3)]
    assert answers == [b"POST 2 /b", b"GET 0 /c", b"POST 0 /d"]
    writer.close()


async def test_a_streamed_answer_is_chunked_and_reads_whole_with_http_client(served) -> None:
    path, _, _ = served

    def fetch() -> tuple[int, bytes, str | None]:
        connection = http.client.HTTPConnection("instance")
        connection.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.sock.connect(path)
        connection.request("GET", "/stream")
        response = connection.getresponse()
        result = response.status, response.read(), response.getheader("transfer-encoding")
        connection.close()
        return result

    assert await asyncio.to_thread(fetch) == (200, b"one two three", "chunked")


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"POST /x HTTP/1.1\r\nhost: i\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 411),
    (b"POST /x HTTP/1.1\r\nhost: i\r\ncontent-length: 99999999999999\r\n\r\n", 413),
    (b"POST /x HTTP/1.1\r\nhost: i\r\ncontent-length: ten\r\n\r\n", 400),
    (b"POST /x HTTP/1.1\r\nhost: i\r\ncontent-length: -4\r\n\r\n", 400),
    (b"NOT HTTP AT ALL\r\n\r\n", 400),
    (b"GET /x HTTP/1.1\r\nx-filler: ".ljust(HEAD_LIMIT, b"a"), 431),     # fills the head's buffer, no end
], ids=["chunked", "too-large", "length-not-a-number", "negative-length", "garbage", "head-too-long"])
async def test_a_request_the_instance_does_not_take_is_refused_by_status_and_closed(served, request_bytes,
                                                                                      status) -> None:
    path, seen, _ = served
    reader, writer = await _connect(path)
    writer.write(request_bytes)
    await writer.drain()
    answer = await reader.read()     # to the end: the connection is closed after the refusal
    assert answer.startswith(b"HTTP/1.1 %d " % status), answer[:80]
    assert b"connection: close" in answer
    assert seen.bodies == [], "the app never saw it"
    writer.close()


async def test_a_caller_that_leaves_is_told_to_the_app_as_a_disconnect(served) -> None:
    path, seen, _ = served
    reader, writer = await _connect(path)
    writer.write(_post("/wait-for-leave", b"{}"))
    await writer.drain()
    async with asyncio.timeout(30):
        await seen.waiting.wait()
        writer.close()
        await seen.disconnected.wait()


@pytest.mark.parametrize("route", ["/fail", "/nothing"])
async def test_an_app_that_fails_or_answers_nothing_gives_a_500_and_a_closed_connection(served, route) -> None:
    path, _, _ = served
    reader, writer = await _connect(path)
    writer.write(_post(route, b""))
    await writer.drain()
    status, headers, body = await read_answer(reader)
    assert (status, body, headers.get("connection")) == (500, b"Internal Server Error", "close")
    assert await reader.read() == b""
    writer.close()


async def test_shutdown_lets_the_answer_in_progress_finish_then_closes(served) -> None:
    path, seen, server = served
    reader, writer = await _connect(path)
    idle_reader, idle_writer = await _connect(path)
    writer.write(_post("/slow", b"abc"))
    await writer.drain()
    async with asyncio.timeout(30):
        await seen.waiting.wait()
        server.should_exit = True
        assert await idle_reader.read() == b"", "an idle connection closes at once"
        seen.release.set()
        status, headers, body = await read_answer(reader)
        assert (status, body, headers.get("connection")) == (200, b"POST 3 /slow", "close")
        assert await reader.read() == b""
    writer.close()
    idle_writer.close()


async def test_an_expect_100_continue_is_answered_before_the_body(served) -> None:
    path, _, _ = served
    reader, writer = await _connect(path)
    writer.write(b"POST /e HTTP/1.1\r\nhost: i\r\ncontent-length: 4\r\nexpect: 100-continue\r\n\r\n")
    await writer.drain()
    assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"data")
    await writer.drain()
    assert (await read_answer(reader))[2] == b"POST 4 /e"
    writer.close()


@pytest.mark.parametrize("keep_alive_s", [0.2])
async def test_a_connection_idle_past_the_keep_alive_time_is_closed(served) -> None:
    path, _, _ = served
    async with asyncio.timeout(30):
        reader, writer = await _connect(path)
        writer.write(b"GET /half")       # a head that never ends
        await writer.drain()
        assert await reader.read() == b"", "closed by the instance, not left open"
        writer.close()


@pytest.mark.parametrize("prefix", ["/i/the-key"])
async def test_without_the_key_route_a_request_is_refused_before_its_body(served) -> None:
    path, seen, _ = served
    reader, writer = await _connect(path)
    writer.write(_post("/i/the-key/infer", b"ok"))
    await writer.drain()
    assert (await read_answer(reader))[2] == b"POST 2 /i/the-key/infer"
    writer.close()
    for wrong in (b"/i/the-kez/infer", b"/i/the-key-longer/infer", b"/infer"):
        reader, writer = await _connect(path)
        # The length of a body never sent: the refusal comes without waiting for it.
        writer.write(b"POST %s HTTP/1.1\r\nhost: i\r\ncontent-length: 3000000000\r\n\r\n" % wrong)
        await writer.drain()
        answer = await reader.read()
        assert answer.startswith(b"HTTP/1.1 404 "), (wrong, answer[:60])
        writer.close()
    assert len(seen.bodies) == 1, "the app saw only the request under its key"
