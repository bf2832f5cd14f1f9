"""A streamed answer's chunks written by the runner's thread straight to the caller's socket.

When a step's chunks went through the event loop, the loop's thread woke for every step and
took the interpreter from the runner's thread while it was mid-step: on two cores that put a
quarter to a half millisecond on every token of a small model, waiting for the other thread. A
``DirectSink`` lets the thread that made a chunk send it, HTTP chunk framing and all, with one
non-blocking ``send`` on its own duplicate of the connection's socket; the loop is not woken.

It is only a shortcut, taken while the socket takes a whole chunk at once. A send that takes
part of a chunk, or none, hands what is left to the loop's transport and turns the sink off for
good: the chunks after it go through the loop, behind that rest, with the transport's flow
control and the stream's backpressure as before. A broken connection turns it off too (the loop
sees the connection go and cancels the stream).

The duplicate descriptor keeps the socket's number from being reused while the sink lives, so a
send can never reach another connection; ``close`` is the loop's, under the stream's lock that
every send holds (``worker.instance.streams.Stream``).
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable
from typing import Any

Encoder = Callable[[Any], bytes]
DIRECT_WRITES = "dilu.direct_writes"    # the scope's extension that offers a sink: (Encoder) -> DirectSink | None


class DirectSink:
    """One chunked answer's socket, written from the runner's thread; ``encode`` frames a chunk
    (a server-sent event, a JSON line) and raises ``TypeError``/``ValueError`` for one it cannot."""

    def __init__(self, transport: asyncio.Transport, encode: Encoder) -> None:
        self._loop = asyncio.get_running_loop()
        self._transport = transport
        self._encode = encode
        self._socket = socket.socket(fileno=os.dup(transport.get_extra_info("socket").fileno()))
        self.active = True

    def send(self, chunk: Any) -> bool:
        """Sends ``chunk``; False (and off from now on) when it cannot be encoded, so that the loop's
        path raises its error in order. On the runner's thread, under the stream's lock."""
        try:
            piece = self._encode(chunk)
        except (TypeError, ValueError):
            self.active = False
            return False
        framed = b"%x\r\n%s\r\n" % (len(piece), piece)
        try:
            sent = self._socket.send(framed, socket.MSG_NOSIGNAL)
        except BlockingIOError:
            sent = 0
        except OSError:        # the caller is gone: the loop cancels the stream when it sees it
            self.active = False
            return True
        if sent < len(framed):  # the socket is full: the rest, and every chunk after it, through the loop
            self.active = False
            self._loop.call_soon_threadsafe(self._write_rest, framed[sent:])
        return True

    def _write_rest(self, rest: bytes) -> None:
        if not self._transport.is_closing():
            self._transport.write(rest)

    def close(self) -> None:
        self.active = False
        self._socket.close()


def can_write_directly(transport: asyncio.Transport) -> bool:
    """Whether the loop has nothing of this connection's left to send, so a chunk sent now goes
    after everything already answered (on the loop)."""
    return not transport.is_closing() and transport.get_write_buffer_size() == 0
