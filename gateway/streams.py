"""Relaying a streamed answer (server-sent events or JSON lines) from an instance to its caller.

The instance's pieces go on as they come. The stream holds its instance slot (it counts as load
for routing, keep-alive and scaling) until it ends, the caller leaves, an instance stays silent
for ``request_timeout_s`` or the whole stream passes ``max_stream_s``; then the connection to
the instance is closed, which stops the generation there within one step.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from gateway.dashboard.view import LatencyWindow
from gateway.forward import InstanceFailed, InstanceTimeout, Streamed
from gateway.metrics import STREAM_FIRST, STREAM_GAP


class StreamTimes:
    """This gateway's recent stream timings per function, for ``dilu describe``."""

    def __init__(self) -> None:
        self.first = LatencyWindow()
        self.gap = LatencyWindow()

    def summary(self, function: str, now: float) -> dict[str, float] | None:
        """Time to first chunk and between chunks, p50 and p99 in ms; None before any stream."""
        first_p50, gap_p50 = self.first.median_s(function, now), self.gap.median_s(function, now)
        if first_p50 is None:
            return None
        return {"first_chunk_p50_ms": round(first_p50 * 1000, 3),
                "first_chunk_p99_ms": self.first.p99_ms(function, now),
                "chunk_gap_p50_ms": None if gap_p50 is None else round(gap_p50 * 1000, 3),
                "chunk_gap_p99_ms": self.gap.p99_ms(function, now), "window_s": self.first.window_s}


class StreamError(Exception):
    """A stream's in-band error line: the handler failed after its first chunk."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class Relay:
    """One stream to a caller: iterate ``pieces()``; ``close()`` (idempotent) when done with it."""

    def __init__(self, function: str, streamed: Streamed, idle_s: float, max_s: float,
                 on_end: Callable[[], None], arrived: float, times: StreamTimes | None = None) -> None:
        self._times = times
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
                waited = now - (self._arrived if last is None else last)
                (STREAM_FIRST if last is None else STREAM_GAP).labels(self._function).observe(waited)
                if self._times is not None:
                    (self._times.first if last is None else self._times.gap).observe(self._function, time.time(),
                                                                                     waited)
                last = now
                yield piece
        except (InstanceTimeout, InstanceFailed):
            return    # the caller sees the stream end without its last event
        finally:
            self.close()

    async def json_lines(self) -> AsyncIterator[Any]:
        """The chunks of a JSON-lines stream, decoded; its in-band error line raises StreamError.
        Closes the relay when the iteration ends or is abandoned."""
        buffer = b""
        try:
            async for piece in self.pieces():
                buffer += piece
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    chunk = orjson.loads(line)
                    if isinstance(chunk, dict) and "error" in chunk and "status" in chunk:
                        raise StreamError(int(chunk["status"]), str(chunk["error"]))
                    yield chunk
        finally:
            self.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._streamed.close()
            self._on_end()
