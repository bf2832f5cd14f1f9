"""The benchmarks' load generator reads a reply's length from Content-Length itself, not from a
header whose name ends the same (the inference protocol's binary replies carry both)."""

from __future__ import annotations

import asyncio

import pytest

from bench.loadgen import closed_loop, content_length

pytestmark = pytest.mark.integration


def test_content_length_is_matched_by_its_whole_name() -> None:
    head = b"HTTP/1.1 200 OK\r\nInference-Header-Content-Length: 12\r\ncontent-length: 5\r\n"
    assert content_length(head) == 5
    assert content_length(b"HTTP/1.1 204 No Content\r\nServer: x\r\n") == 0


async def test_a_binary_reply_with_both_headers_keeps_the_connection_in_step() -> None:
    body = b'{"a":1}' + b"\x00" * 8
    reply = (b"HTTP/1.1 200 OK\r\nInference-Header-Content-Length: 7\r\n"
             b"Content-Length: %d\r\n\r\n" % len(body)) + body
    seen: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # The client hangs up between requests: that ends the loop, and the connection is closed
        # here, not left to the garbage collector (whose warning would fail a later test).
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                seen.append(head)
                await reader.readexactly(content_length(head))
                writer.write(reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        latencies = await closed_loop(f"http://127.0.0.1:{port}/v2/models/m/infer", b"\x01\x02", clients=1,
                                      seconds=0.2, headers={"Content-Type": "application/octet-stream"})
    finally:
        server.close()
        await server.wait_closed()
    assert len(latencies) >= 2 and len(seen) >= len(latencies)       # several replies on one connection
    assert b"Content-Type: application/octet-stream" in seen[0] and b"Content-Length: 2" in seen[0]
