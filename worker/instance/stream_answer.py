"""A streamed answer as an ASGI app: its pieces as they come, ended when its caller leaves.

It stands in for Starlette's ``StreamingResponse``, which opens an AnyIO task group and cancel
scope per answer (and, cancelling it, formats the task's repr): a fifth to a third of the
instance's own Python per stream, taken from the runner's thread beside it. Here one task
watches for the caller leaving and cancels the answer, as Starlette's does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from typing import Any


class StreamAnswer:
    """``pieces`` (bytes) sent as a 200 answer with ``headers``; its
    caller leaving (``http.disconnect``) cancels the iteration, so the pieces' ``finally`` runs."""

    def __init__(self, pieces: AsyncGenerator[bytes, None], headers: dict[str, str]) -> None:
        self._pieces = pieces
        self._headers = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        answer = asyncio.current_task()
        state = {"sending": True}

        async def caller_left() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        def cancel_answer(watch: asyncio.Future) -> None:
            if state["sending"] and not watch.cancelled() and answer is not None:
                answer.cancel()

        watch = asyncio.ensure_future(caller_left())
        watch.add_done_callback(cancel_answer)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self._headers})
            async for piece in self._pieces:
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            state["sending"] = False
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not (watch.done() and not watch.cancelled()) or answer is None:
                raise
            answer.uncancel()   # the caller left: nobody to answer, and nothing else asked it to stop
        finally:
            state["sending"] = False
            watch.cancel()
            await self._pieces.aclose()     # their finally runs now, however the answer ended
