"""Helpers for tests that run an ASGI app under a real server and speak HTTP/1.1 to it byte by
byte: the app's lifespan, and reading one answer off a connection."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import uvicorn

from tests.waiting import async_eventually


async def serve_lifespan(receive: Callable[[], Awaitable[dict[str, Any]]],
                         send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    """Answers the server's lifespan messages: started at once, stopped when told."""
    while (await receive())["type"] != "lifespan.shutdown":
        await send({"type": "lifespan.startup.complete"})
    await send({"type": "lifespan.shutdown.complete"})


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One response read off the connection: status, headers, body (by length or chunks)."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode().split("\r\n")
    status = int(head[0].split()[1])
    headers = dict(line.lower().split(": ", 1) for line in head[1:] if line)
    if "content-length" in headers:
        return status, headers, await reader.readexactly(int(headers["content-length"]))
    body = b""
    while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
        body += await reader.readexactly(size)
        await reader.readexactly(2)
    await reader.readexactly(2)
    return status, headers, body


@asynccontextmanager
async def serving_on_unix_socket(config: uvicorn.Config, path: str) -> AsyncIterator[None]:
    """A real uvicorn server of ``config`` listening on the Unix socket ``path`` until the block
    ends; then it stops as on SIGTERM, letting answers in flight finish."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[listener]))

    async def started() -> bool:
        return server.started
    await async_eventually(started, timeout=30, interval=0.01, what="the server to listen")
    try:
        yield
    finally:
        server.should_exit = True
        async with asyncio.timeout(30):
            await task
