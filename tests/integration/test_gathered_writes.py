"""The roles' HTTP server (cli/roles/serving.py: ``http_server``, uvicorn with
``GatheredWritesHttp``) on a real TCP socket: an answer's head and body leave together, and
nothing gathered is held back or lost (streams, large bodies, closing, 100-continue, pipelining)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from cli.roles.serving import Server, http_server, listen
from tests.raw_http import read_answer, serve_lifespan
from tests.waiting import async_eventually

LARGE = bytes(range(256)) * 12_000   # 3 MB: goes out without being joined to its head


class Pieces:
    """The stream's pace, set by the test: each piece waits for its release."""

    def __init__(self) -> None:
        self.release = asyncio.Queue[None]()


def _app(pieces: Pieces):
    async def app(scope: dict[str, Any], receive, send) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["path"] == "/flood":      # many pieces in one turn, none awaited for
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            for index in range(64):
                await send({"type": "http.response.body", "body": bytes([index]) * 65536, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        if scope["path"] == "/stream":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            for piece in (b"one ", b"two ", b"three"):
                await pieces.release.get()
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        answer = LARGE if scope["path"] == "/large" else b"%s got %d bytes" % (scope["path"].encode(), len(body))
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(answer))]})
        await send({"type": "http.response.body", "body": answer})
    return app


@pytest.fixture
async def served() -> AsyncIterator[tuple[int, Pieces]]:
    pieces = Pieces()
    sock = listen("127.0.0.1", 0)
    server: Server = http_server(_app(pieces), timeout_graceful_shutdown=5)
    task = asyncio.create_task(server.serve(sockets=[sock]))

    async def started() -> bool:
        return server.started
    await async_eventually(started, timeout=30, interval=0.01, what="the server to listen")
    try:
        yield sock.getsockname()[1], pieces
    finally:
        server.should_exit = True
        async with asyncio.timeout(30):
            await task



def _post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nhost: dilu\r\ncontent-length: %d\r\n%s\r\n" % (path.encode(), len(body), extra) + body


async def test_an_answers_head_and_body_arrive_in_one_read(served) -> None:
    port, _ = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(3):      # on a kept-alive connection too
        writer.write(_post("/small", b"hello"))
        first = await reader.read(65536)     # whatever arrived first
        assert first.startswith(b"HTTP/1.1 200 OK\r\n")
        assert first.endswith(b"\r\n\r\n/small got 5 bytes"), "the head came without its body"
    writer.close()


async def test_a_large_answer_arrives_whole_and_in_order(served) -> None:
    port, _ = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_post("/large", b""))
    assert (await read_answer(reader))[2] == LARGE
    writer.write(_post("/small", b"after"))
    assert (await read_answer(reader))[2] == b"/small got 5 bytes"
    writer.close()


async def test_a_streams_pieces_are_not_held_for_the_next(served) -> None:
    port, pieces = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_post("/stream", b""))
    pieces.release.put_nowait(None)
    head = await reader.readuntil(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head
    for piece in (b"one ", b"two "):
        # the next piece waits for its release, so this one must have left on its own
        assert await reader.readuntil(b"\r\n") == b"%x\r\n" % len(piece)
        assert await reader.readexactly(len(piece) + 2) == piece + b"\r\n"
        pieces.release.put_nowait(None)
    assert await reader.readexactly(len(b"5\r\nthree\r\n0\r\n\r\n")) == b"5\r\nthree\r\n0\r\n\r\n"
    writer.close()


async def test_an_answer_before_close_is_sent_whole(served) -> None:
    port, _ = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_post("/small", b"bye", b"connection: close\r\n"))
    everything = await reader.read()     # to the end of the connection
    assert everything.startswith(b"HTTP/1.1 200 OK\r\n")
    assert everything.endswith(b"\r\n\r\n/small got 3 bytes")
    writer.close()


async def test_a_client_waiting_for_100_continue_gets_it_then_itsread_answer(served) -> None:
    port, _ = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /upload HTTP/1.1\r\nhost: dilu\r\ncontent-length: 4\r\nexpect: 100-continue\r\n\r\n")
    assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"data")
    assert (await read_answer(reader))[2] == b"/upload got 4 bytes"
    writer.close()


async def test_pipelined_requests_are_answered_in_order(served) -> None:
    port, _ = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_post("/first", b"a") + _post("/second", b"bb") + _post("/large", b""))
    assert [(await read_answer(reader))[2] for _ in range(3)] == [b"/first got 1 bytes", b"/second got 2 bytes", LARGE]
    writer.close()


async def test_a_flood_of_pieces_made_in_one_turn_arrives_whole_and_in_order(served) -> None:
    port, _ = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
    writer.write(_post("/flood", b""))
    _, _, body = await read_answer(reader)
    assert body == b"".join(bytes([index]) * 65536 for index in range(64))
    writer.close()
