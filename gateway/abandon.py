"""Work whose caller left stops: an ASGI wrapper that cancels an invocation once its client
disconnects, queued or in flight.

Servers do not cancel a request's handler when its client goes; the handler would wait out the
queue and the instance's answer for nobody. Once the app has read the whole body, this wrapper
watches the connection; a disconnect cancels the request's task. Cancelled, a queued request
leaves the queue, and one in flight closes its connection to the instance, which drops it from
its batch if it has not started and ends its generation at the next step. A later ``receive()``
of the app (a stream watching for the disconnect itself) gets the same disconnect.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from gateway.fast_path import INFER_SUFFIX, INVOKE_PREFIX, INVOKE_SUFFIX, MODELS_PREFIX

GENERATE = ("/v1/completions", "/v1/chat/completions")


def watched(method: str, path: str) -> bool:
    """Whether a request is an invocation, whose work is worth stopping when its caller leaves
    (not a deploy or a delete, which must not stop half-way)."""
    if method != "POST":
        return False
    return (path.startswith(INVOKE_PREFIX) and path.endswith(INVOKE_SUFFIX)) or \
        (path.startswith(MODELS_PREFIX) and path.endswith(INFER_SUFFIX)) or path in GENERATE


class LeavesWithCaller:
    """ASGI wrapper: an invocation's task is cancelled when its caller disconnects."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or not watched(scope["method"], scope["path"]):
            await self.app(scope, receive, send)
            return
        task = asyncio.current_task()
        assert task is not None
        state = {"body_read": False, "answered": False, "left": False}
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
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                state["answered"] = True
            await send(message)

        try:
            await self.app(scope, app_receive, app_send)
        except asyncio.CancelledError:
            if not state["left"]:
                raise
            task.uncancel()     # the caller is gone: nothing to answer, nothing to raise
        finally:
            if watcher is not None:
                watcher.cancel()
