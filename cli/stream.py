"""`dilu invoke --stream`: reading the gateway's JSON-lines stream, whose last line says whether
it finished (``{"done": true, "chunks": N}``) or failed (``{"error": ..., "status": S}``). A
stream that ends with neither was cut on the way and is never shown as an answer."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from dilu.instance_protocol import stream_ending


@dataclass(frozen=True)
class Chunk:
    value: Any


@dataclass(frozen=True)
class Finished:
    chunks: int


@dataclass(frozen=True)
class Failed:
    error: str
    status: int | None


Frame = Chunk | Finished | Failed


def read_frame(line: str) -> Frame:
    """One line of the stream, told apart by the protocol's own rule (only the exact terminator
    objects end a stream: ``dilu.instance_protocol.stream_ending``)."""
    value = json.loads(line)
    ending = stream_ending(value)
    if ending == "done":
        return Finished(value["chunks"])
    if ending == "error":
        status = value.get("status")
        return Failed(str(value["error"]), status if isinstance(status, int) else None)
    return Chunk(value)


def failure_message(frame: Failed | None, chunks: int) -> str:
    """What the CLI says when a stream did not finish: its error, or that it was cut."""
    if frame is None:
        return (f"the stream was cut after {chunks} chunk(s): it ended without its terminator, so the "
                "answer is incomplete")
    status = f" (status {frame.status})" if frame.status is not None else ""
    return f"the stream failed after {chunks} chunk(s){status}: {frame.error}"
