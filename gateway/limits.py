"""Size and nesting limits on the API's own request bodies (invokes and bundles have theirs)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from dilu.config import GatewaySettings
from dilu.limits import LimitExceeded, check_json_depth
from gateway.route_table import route_in


class BodyLimits:
    """ASGI wrapper: a body over ``max_bytes`` is answered 413, JSON nested too deep 400, before
    the framework parses it (its parser would recurse until the interpreter gives up); routes
    that read their own bodies under their own limits pass (``gateway.route_table``)."""

    def __init__(self, app: ASGIApp, settings_of: Callable[[], GatewaySettings]) -> None:
        self.app = app
        self._settings_of = settings_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH") or route_in(scope).own_body:
            await self.app(scope, receive, send)
            return
        limit = self._settings_of().max_api_body_bytes
        try:
            body = await read_capped(receive_chunks(receive), None, limit)
        except BodyTooLarge:
            await _reply(send, 413, f"request body is over the limit of {limit} bytes (DILU_MAX_API_BODY_BYTES)")
            return
        try:
            check_json_depth(body)
        except LimitExceeded as exc:
            await _reply(send, 400, f"request body: {exc}")
            return
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


async def _reply(send: Send, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class BodyTooLarge(Exception):
    """A streamed body passed its limit (its declared length, or what arrived)."""


async def receive_chunks(receive: Receive) -> AsyncIterator[bytes]:
    """An ASGI request's body chunks, until the last (or the client left)."""
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        yield message.get("body", b"")
        more = message.get("more_body", False)


async def read_capped(chunks: AsyncIterator[bytes], declared: str | None, limit: int) -> bytes:
    """The whole body, never buffered past ``limit`` bytes (``BodyTooLarge`` instead)."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    parts, size = [], 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        parts.append(chunk)
    return b"".join(parts)
