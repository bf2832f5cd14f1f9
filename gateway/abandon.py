"""Work whose caller left stops: an ASGI wrapper that cancels an invocation once its client
disconnects, queued or in flight; and that ends, with an answer, the invocations still running
when the gateway's stop drain is over.

Servers do not cancel a request's handler when its client goes; the handler would wait out the
queue and the instance's answer for nobody. Once the app has read the whole body, this wrapper
watches the connection; a disconnect cancels the request's task. Cancelled, a queued request
leaves the queue, and one in flight closes its connection to the instance, which drops it from
its batch if it has not started and ends its generation at the next step. A later ``receive()``
of the app (a stream watching for the disconnect itself) gets the same disconnect.

An invocation ended because the gateway stops is answered, not dropped: a 503 naming the reason
when nothing was sent yet, else the stream's error frame (``dilu.instance_protocol``), so its
caller never mistakes it for a finished answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson

from dilu.instance_protocol import STREAM_TYPES, stream_error
from gateway.route_table import route_in


def _stream_kind(headers: list[tuple[bytes, bytes]]) -> str | None:
    """``sse`` or ``ndjson`` for a streamed answer's headers; None for a whole answer."""
    for name, value in headers:
        if name.lower() == b"content-type":
            media_type = value.decode("latin-1").split(";")[0].strip()
            return next((kind for kind, known in STREAM_TYPES.items() if known == media_type), None)
    return None


class LeavesWithCaller:
    """ASGI wrapper: an invocation's task is cancelled when its caller disconnects, or when
    ``end_all`` is called (the gateway stopping)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._running: dict[asyncio.Task, dict] = {}     # invocation task -> its state
        self._ended: str | None = None

    def end_all(self, reason: str) -> None:
        """Ends every invocation still running with ``reason`` as its answer (503)."""
        self._ended = reason
        for task, state in list(self._running.items()):
            if not state["answered"]:
                state["stopped"] = True
                task.cancel()

    async def _answer_stopped(self, state: dict, send: Callable) -> None:
        reason = self._ended or "the gateway is stopping"
        kind = _stream_kind(state["started"]) if state["started"] is not None else None
        if kind is not None:                # a stream under way: its error frame, then its end
            await send({"type": "http.response.body", "body": stream_error(kind, f"stream cut: {reason}", 503),
                        "more_body": False})
        elif state["started"] is None:
            body = orjson.dumps({"error": reason})
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
        else:                               # a whole answer half sent: the connection ends short
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or not route_in(scope).invocation:
            await self.app(scope, receive, send)
            return
        task = asyncio.current_task()
        assert task is not None
        # started: the answer's headers once it has begun (read only if the gateway stops it)
        state: dict = {"body_read": False, "answered": False, "left": False, "stopped": False, "started": None}
        disconnect: asyncio.Future[dict] = asyncio.get_running_loop().create_future()
        watcher: asyncio.Task | None = None

        async def watch() -> None:
            while (message := await receive())["type"] != "http.disconnect":
                pass
            disconnect.set_result(message)
            if not state["answered"]:
                state["left"] = True
                task.cancel()

        async def app_receive() -> dict:
            nonlocal watcher
            if state["body_read"]:
                return await asyncio.shield(disconnect)
            message = await receive()
            if message["type"] == "http.disconnect" or not message.get("more_body", False):
                state["body_read"] = True
                if message["type"] == "http.disconnect":
                    disconnect.set_result(message)
                else:
                    watcher = asyncio.create_task(watch())
            return message

        async def app_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                state["started"] = message.get("headers", [])
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                state["answered"] = True
            await send(message)

        self._running[task] = state
        try:
            await self.app(scope, app_receive, app_send)
        except asyncio.CancelledError:
            if not (state["left"] or state["stopped"]):
                raise
            task.uncancel()     # the caller is gone, or the gateway stops: nothing to raise
            if state["stopped"] and not state["left"]:
                await self._answer_stopped(state, send)
        finally:
            del self._running[task]
            if watcher is not None:
                watcher.cancel()
