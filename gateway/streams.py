"""Relaying a streamed answer (server-sent events or JSON lines) from an instance to its caller.

The instance's pieces go on as they come. The stream holds its instance slot (it counts as load
for routing, keep-alive and scaling) until it ends, the caller leaves, an instance stays silent
for ``request_timeout_s`` or the whole stream passes ``max_stream_s``; then the connection to
the instance is closed, which stops the generation there within one step.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

from gateway.forward import InstanceFailed, InstanceTimeout, Streamed
from gateway.metrics import STREAM_FIRST, STREAM_GAP


class Relay:
    """One stream to a caller: iterate ``pieces()``; ``close()`` (idempotent) when done with it."""

    def __init__(self, function: str, streamed: Streamed, idle_s: float, max_s: float,
                 on_end: Callable[[], None], arrived: float) -> None:
        self._function = function
        self._streamed = streamed
        self._idle_s = idle_s
        self._deadline = time.monotonic() + max_s
        self._on_end = on_end
        self._arrived = arrived
        self._closed = False

    async def pieces(self) -> AsyncIterator[bytes]:
        last: float | None = None
        try:
            async for piece in self._streamed.chunks(self._idle_s, self._deadline):
                now = time.perf_counter()
                if last is None:
                    STREAM_FIRST.labels(self._function).observe(now - self._arrived)
                else:
                    STREAM_GAP.labels(self._function).observe(now - last)
                last = now
                yield piece
        except (InstanceTimeout, InstanceFailed):
            return    # the caller sees the stream end without its last event
        finally:
            self.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._streamed.close()
            self._on_end()
