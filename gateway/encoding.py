"""Compressed request bodies: ``Content-Encoding: gzip`` or ``deflate`` (what tritonclient's
``request_compression_algorithm`` sends) is decoded as the body arrives; any other encoding is
answered 415, never read as plain bytes.

Decoding is bounded the way the body is: each piece handed on is at most ``PIECE`` bytes, taken
from the compressed input only as the route reads, so the route's own size limit stops a small
body that would inflate without end (it counts decoded bytes) before it fills memory.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from typing import Any

PIECE = 1 << 20
DECODERS = {b"gzip": 16 + zlib.MAX_WBITS, b"x-gzip": 16 + zlib.MAX_WBITS, b"deflate": zlib.MAX_WBITS}


class ContentEncoding:
    """ASGI wrapper: see the module's docstring."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        encoding = next((value for name, value in scope["headers"] if name == b"content-encoding"), None)
        if encoding is None or encoding.strip().lower() in (b"", b"identity"):
            await self.app(scope, receive, send)
            return
        wbits = DECODERS.get(encoding.strip().lower())
        if wbits is None:
            await _refuse(send, 415, f"Content-Encoding {encoding.decode('latin-1')[:40]!r} is not supported: send "
                                     "the body as it is, or gzip or deflate it")
            return
        headers = [(name, value) for name, value in scope["headers"]
                   if name not in (b"content-encoding", b"content-length")]
        # A body that does not decode raises BodyNotDecodable from receive(): gateway.errors
        # answers it 400.
        await self.app({**scope, "headers": headers}, _decoding(receive, wbits), send)


def _decoding(receive: Callable, wbits: int) -> Callable:
    decoder = zlib.decompressobj(wbits)
    state = {"pending": b"", "more": True}

    async def decoded() -> dict:
        while True:
            if state["pending"]:
                data, state["pending"] = state["pending"], b""
            elif state["more"]:
                message = await receive()
                if message["type"] != "http.request":
                    return message
                data, state["more"] = message.get("body", b""), message.get("more_body", False)
            else:
                return await receive()     # the body is over: what comes next is the disconnect
            try:
                piece = decoder.decompress(data, PIECE)
            except zlib.error as exc:
                raise BodyNotDecodable(f"the body is not valid {'gzip' if wbits > 16 else 'deflate'} data: "
                                       f"{exc}") from None
            state["pending"] = decoder.unconsumed_tail
            more = bool(state["pending"]) or state["more"]
            if not more and not decoder.eof:
                raise BodyNotDecodable(f"the {'gzip' if wbits > 16 else 'deflate'} body ends before its end of stream")
            if piece or not more:
                return {"type": "http.request", "body": piece, "more_body": more}

    return decoded


class BodyNotDecodable(ValueError):
    """A compressed body that does not decode (``gateway.errors`` answers it 400)."""


async def _refuse(send: Callable, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
