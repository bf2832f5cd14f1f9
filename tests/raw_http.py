"""Helpers for tests that run an ASGI app under a real server and speak HTTP/1.1 to it byte by
byte: the app's lifespan, and reading one answer off a connection."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


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
