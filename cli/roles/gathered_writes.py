"""uvicorn's HTTP protocol with the writes of one event-loop turn sent as one.

uvicorn writes an answer's head when the app sends ``http.response.start`` and its body when the
app sends ``http.response.body``: two ``write`` calls, two segments, two wake-ups of the caller
for every answer. On loopback a write costs as much as the rest of a forwarded request's Python
(the kernel delivers to the reader inside it), so the gateway gathers what a connection is given
in one turn of the loop and writes it once: as soon as the answer is complete, or at the turn's
end. An answer whose head and body are sent together, as the gateway's are, leaves in one write;
a stream's pieces go out as they come, each at the end of the turn that made it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_JOIN_BELOW = 16384   # smaller writes are joined into one buffer; larger go as they are (writelines)
# Past this much gathered, it goes at once: the transport then sees its buffer fill within the
# turn and pauses the writer, as it would without gathering, so a slow reader bounds memory.
_SEND_AT = 65536


class GatheredTransport:
    """A connection's transport whose writes wait for the answer to be complete, the end of the
    loop's turn, or 64 KiB gathered, whichever comes first.

    Everything that ends or hands over the connection (``close``, ``set_protocol``) sends what is
    gathered first; ``abort`` drops it, as the transport's own ``abort`` drops its buffer."""

    __slots__ = ("_transport", "_loop", "_pending", "_size", "_flushing")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes | bytearray | memoryview] = []
        self._size = 0
        self._flushing: asyncio.Handle | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._pending:
            self._flushing = self._loop.call_soon(self.flush)
        self._pending.append(data)
        self._size += len(data)
        if self._size >= _SEND_AT:
            self.flush()

    def writelines(self, pieces: list[bytes]) -> None:
        for piece in pieces:
            self.write(piece)

    def _take_pending(self) -> tuple[list[bytes | bytearray | memoryview], int]:
        """What was gathered, and its size; the gathering starts again empty."""
        pending, size = self._pending, self._size
        self._pending, self._size = [], 0
        if self._flushing is not None:
            self._flushing.cancel()
            self._flushing = None
        return pending, size

    def flush(self) -> None:
        """Sends what was gathered (nothing once the connection is closing)."""
        if not self._pending:
            return
        pending, size = self._take_pending()
        if self._transport.is_closing():
            return
        if len(pending) == 1:
            self._transport.write(pending[0])
        elif size < _JOIN_BELOW:
            self._transport.write(b"".join(pending))
        else:   # large bodies are not copied behind their head
            self._transport.writelines(pending)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._take_pending()
        self._transport.abort()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.flush()
        self._transport.set_protocol(protocol)

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def __getattr__(self, name: str) -> Any:   # anything else the transport has, unchanged
        return getattr(self._transport, name)


class GatheredWritesHttp(HttpToolsProtocol):
    """uvicorn's httptools protocol over a ``GatheredTransport``; otherwise unchanged."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.gathered = GatheredTransport(transport, self.loop)
        super().connection_made(self.gathered)  # type: ignore[arg-type]

    def on_response_complete(self) -> None:
        self.gathered.flush()    # the answer is whole: out now, not after the rest of the turn
        super().on_response_complete()
