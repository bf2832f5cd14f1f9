"""Relaying a streamed answer (server-sent events or JSON lines) from an instance to its caller.

The instance's events or lines go on as they come. The stream holds its instance slot (it counts
as load for routing, keep-alive and scaling) until it ends, the caller leaves, an instance stays
silent for ``request_timeout_s`` or the whole stream passes ``max_stream_s``; then the connection
to the instance is closed, which stops the generation there within one step. A stream the
instance did not finish ends with an error frame, never as if it had.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from dilu.instance_protocol import FRAME_ENDS, STREAM_TYPES, ends_stream, stream_ending, stream_error
from gateway.dashboard.view import LatencyWindow
from gateway.forward import InstanceFailed, InstanceTimeout, Streamed
from gateway.metrics import ABANDONED, STREAM_FIRST, STREAM_GAP, STREAMS_CUT


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
    """One stream to a caller: iterate ``pieces()``; ``close()`` (idempotent) when done with it.

    Whatever happens to the instance, the caller's stream ends with a terminator
    (``dilu.instance_protocol.stream_done`` or ``stream_error``): the pieces go on whole events
    or lines, holding back a partial one, so that when the instance's connection breaks, falls
    silent, passes the stream's limit or ends without its terminator, the gateway can append an
    error frame the caller parses."""

    def __init__(self, function: str, streamed: Streamed, idle_s: float, max_s: float,
                 on_end: Callable[[], None], arrived: float, times: StreamTimes | None = None) -> None:
        self._times = times
        self._function = function
        self._streamed = streamed
        self._kind = "sse" if streamed.content_type.startswith(STREAM_TYPES["sse"]) else "ndjson"
        self._idle_s = idle_s
        self._max_s = max_s
        self._deadline = time.monotonic() + max_s
        self._on_end = on_end
        self._arrived = arrived
        self._closed = False
        self._first_seen, self._gap_seen = STREAM_FIRST.labels(function), STREAM_GAP.labels(function)

    async def pieces(self) -> AsyncIterator[bytes]:
        end = FRAME_ENDS[self._kind]
        last: float | None = None
        held, sent = b"", b""      # a partial frame not yet passed on; the last piece passed on
        try:
            async for piece in self._streamed.chunks(self._idle_s, self._deadline):
                if held:
                    piece, held = held + piece, b""
                if not piece.endswith(end):
                    cut = piece.rfind(end) + len(end)
                    piece, held = (b"", piece) if cut < len(end) else (piece[:cut], piece[cut:])
                    if not piece:
                        continue
                now = time.perf_counter()
                waited = now - (self._arrived if last is None else last)
                (self._first_seen if last is None else self._gap_seen).observe(waited)
                if self._times is not None:
                    (self._times.first if last is None else self._times.gap).observe(self._function, time.time(),
                                                                                     waited)
                last, sent = now, piece
                yield piece
            if held or not ends_stream(self._kind, _last_frame(sent, end)):
                yield self._cut("unterminated", "the instance ended the stream without its last frame", 502)
        except InstanceTimeout:
            if time.monotonic() >= self._deadline - 0.001:
                yield self._cut("limit", f"the stream ran past its limit of {self._max_s:g} s", 504)
            else:
                yield self._cut("silent", f"the instance sent nothing for {self._idle_s:g} s", 504)
        except InstanceFailed as exc:
            yield self._cut("failed", f"the instance failed mid-stream: {exc}", 502)
        except asyncio.CancelledError:
            ABANDONED.labels(self._function, "in_flight").inc()   # its caller left mid-stream (gateway.abandon)
            raise
        finally:
            self.close()

    def _cut(self, reason: str, message: str, status: int) -> bytes:
        STREAMS_CUT.labels(self._function, reason).inc()
        return stream_error(self._kind, f"stream cut: {message}", status)

    async def json_lines(self) -> AsyncIterator[Any]:
        """The chunks of a JSON-lines stream, decoded, up to its ``done`` line; an error line
        (the instance's, or the gateway's for a cut stream) raises StreamError. Closes the relay
        when the iteration ends or is abandoned."""
        buffer = b""
        try:
            async for piece in self.pieces():
                buffer += piece
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    chunk = orjson.loads(line)
                    ending = stream_ending(chunk)
                    if ending == "done":
                        return
                    if ending == "error":
                        raise StreamError(int(chunk["status"]), str(chunk["error"]))
                    yield chunk
        finally:
            self.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._streamed.close()
            self._on_end()


def _last_frame(piece: bytes, end: bytes) -> bytes:
    """The last whole event or line of ``piece`` (which ends with ``end``)."""
    if not piece.endswith(end):
        return b""
    before = piece.rfind(end, 0, len(piece) - len(end))
    return piece[before + len(end):] if before >= 0 else piece
