"""The gateway's hot routes, served before the framework: invocations (``POST
/v1/functions/{name}/invoke``) and inferences (``POST /v2/models/{name}[/versions/{v}]/infer``).

FastAPI's middleware, routing and dependency machinery cost more CPU per request than the
forwarding itself, so this ASGI wrapper takes these two routes straight to the code their
documented FastAPI routes also call (the ``Invoker``, ``answer_infer``); every other request
goes on to the app. It sits behind the key check (``AuthGate``), like the app.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.invocation import Invocation
from gateway.limits import read_capped, receive_chunks
from gateway.needs import Models
from gateway.route_table import route_in
from gateway.streams import Relay
from gateway.v2.rest import answer_infer


def _header(scope: dict, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


async def _send(send: Callable, status: int, body: bytes, content_type: str, headers: dict[str, str]) -> None:
    raw = [(b"content-type", content_type.encode("latin-1")), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def _relay(relay: Relay, content_type: str, headers: dict[str, str], receive: Callable,
                 send: Callable) -> None:
    """A stream to the caller, piece by piece; a caller who leaves ends it (and the instance's
    generation) at once."""
    raw = [(b"content-type", content_type.encode("latin-1")), (b"cache-control", b"no-cache")]
    raw += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]

    async def forward() -> None:
        await send({"type": "http.response.start", "status": 200, "headers": raw})
        async for piece in relay.pieces():
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def left() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    relaying, watching = asyncio.create_task(forward()), asyncio.create_task(left())
    try:
        await asyncio.wait((relaying, watching), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (relaying, watching):
            task.cancel()
        await asyncio.gather(relaying, watching, return_exceptions=True)
        relay.close()
    if not relaying.cancelled() and relaying.exception() is not None:
        raise relaying.exception()


class FastPaths:
    """ASGI wrapper: the two hot routes straight to their handlers; the rest to ``app``."""

    def __init__(self, app: Any, services_of: Callable[[], Models]) -> None:
        self.app = app
        self._services_of = services_of

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http":
            route = route_in(scope)
            if route.fast == "invoke":
                await self._invoke(route.function, scope, receive, send)
                return
            if route.fast == "infer":
                await self._infer(route.function, route.version, scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _invoke(self, name: str, scope: dict, receive: Callable, send: Callable) -> None:
        async def next_chunk() -> tuple[bytes, bool]:
            message = await receive()
            if message["type"] == "http.disconnect":
                return b"", False
            return message.get("body", b""), message.get("more_body", False)

        outcome = await self._services_of().invoker.invoke(Invocation(
            name, next_chunk, _header(scope, b"content-length"), accept=_header(scope, b"accept")))
        if outcome.relay is not None:
            await _relay(outcome.relay, outcome.content_type, outcome.headers, receive, send)
            return
        await _send(send, outcome.status, outcome.body, outcome.content_type, outcome.headers)

    async def _infer(self, name: str, version: str | None, scope: dict, receive: Callable, send: Callable) -> None:
        declared = _header(scope, b"content-length")

        def read_body(limit: int) -> Awaitable[bytes]:
            return read_capped(receive_chunks(receive), declared, limit)

        answer = await answer_infer(self._services_of(), name, version, read_body,
                                    _header(scope, b"inference-header-content-length"))
        await _send(send, answer.status, answer.body, answer.media_type, answer.headers)
