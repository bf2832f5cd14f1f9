"""The contract between a worker and the instances it starts, in one place.

A worker starts an instance process (``python -m worker.instance``) with:
- ``DILU_INSTANCE_CONFIG``: a JSON file holding an ``InstanceConfig``, or
  ``DILU_INSTANCE_CONFIG_JSON``: the same JSON inline (containers, where no file is shared);
- ``DILU_LISTEN_FD``: an inherited, already-bound listening socket, or ``DILU_LISTEN``:
  ``host:port`` to bind (containers, which cannot inherit a socket); and ``DILU_LISTEN_UNIX_FD``:
  an inherited listening Unix socket it also serves on, for a gateway on its host
  (``dilu.local_sockets``);
- ``DILU_INSTANCE_ID``, ``DILU_FUNCTION``; ``DILU_DEVICE`` (``cuda`` or ``cpu``);
- ``DILU_INSTANCE_KEY``: a secret; the instance serves its routes only under ``/i/<key>``, so
  its endpoint (``http://host:port/i/<key>``, known to the worker, the controller and the
  gateways) is a capability: a caller who only found the port gets 404 for every path.

The instance answers ``GET /health`` 200 once ready, and 503 with ``{"loading": true}`` (and the
``x-dilu-loading: 1`` header) while it loads, so a caller that reached it early tells "not yet"
from a failure without matching text. An instance whose handler cannot be imported or loaded
prints a last ``ERROR_MARKER`` line on stderr and exits with ``EXIT_LOAD_FAILED``.

This module is imported by every instance at start-up, so it uses the standard library only:
reading the three variables through pydantic-settings would add about 150 ms to every cold start.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ENV_CONFIG = "DILU_INSTANCE_CONFIG"
ENV_CONFIG_JSON = "DILU_INSTANCE_CONFIG_JSON"
ENV_LISTEN_FD = "DILU_LISTEN_FD"
ENV_LISTEN = "DILU_LISTEN"
ENV_LISTEN_UNIX_FD = "DILU_LISTEN_UNIX_FD"
ENV_INSTANCE_ID = "DILU_INSTANCE_ID"
ENV_FUNCTION = "DILU_FUNCTION"
ENV_DEVICE = "DILU_DEVICE"
ENV_KEY = "DILU_INSTANCE_KEY"
ENV_PRELOAD = "DILU_PRELOAD"   # spares: comma-separated modules to import before an assignment

EXIT_LOAD_FAILED = 3
ERROR_MARKER = "DILU-ERROR: "
LOADING_HEADER = "x-dilu-loading"
NOT_STREAMING_HEADER = "x-dilu-not-streaming"   # on the 400 to a stream request for a handler that does not stream
TENSOR_FRAME_TYPE = "application/vnd.dilu.tensors"   # the body of dilu.tensor_frames
TENSORS_HEADER = "x-dilu-tensors"                    # and its header


@dataclass(frozen=True)
class InstanceConfig:
    """What the worker hands an instance (as JSON in the file named by ``DILU_INSTANCE_CONFIG``)."""

    instance_id: str
    function: str
    handler: str
    source_dir: str   # put first on the import path; "" for the working directory (image functions)
    options: dict[str, Any]
    max_batch_size: int
    max_wait_ms: float
    warmup: dict[str, Any] | None = None   # the spec's warm-up (request or file, count)
    arrays: str | None = None   # "numpy" or "torch": the handler takes and returns arrays
    inputs: dict[str, str] | None = None    # declared tensors, name -> datatype (for arrays)
    outputs: dict[str, str] | None = None
    shapes: dict[str, list[int]] | None = None   # declared input shapes (-1: any size), checked on JSON input
    weights: str | None = None   # the safetensors file of the spec's weights, as the instance sees it
    stream_stall_s: float = 30.0   # a stream whose caller reads nothing for this long is ended
    preferred_batch_size: int | None = None   # the profile's batch; max_batch_size is the spec's bound

    @classmethod
    def for_spec(cls, instance_id: str, function: str, spec: Mapping[str, Any], source_dir: str,
                 weights: str | None = None, stream_stall_s: float = 30.0) -> InstanceConfig:
        """The configuration of an instance of ``spec`` (the function's spec as a dict), its
        weights at ``weights`` when it has them."""
        def declared(tensors: list[dict[str, Any]] | None) -> dict[str, str] | None:
            return {t["name"]: t["datatype"] for t in tensors} if tensors else None

        return cls(instance_id=instance_id, function=function, handler=spec["handler"], source_dir=source_dir,
                   options=spec.get("model") or {}, max_batch_size=spec["batching"]["max_batch_size"],
                   max_wait_ms=spec["batching"]["max_wait_ms"], warmup=spec.get("warmup"),
                   arrays=spec.get("arrays"), inputs=declared(spec.get("inputs")),
                   outputs=declared(spec.get("outputs")),
                   shapes={t["name"]: list(t["shape"]) for t in spec.get("inputs") or []} or None,
                   weights=weights or None, stream_stall_s=stream_stall_s,
                   preferred_batch_size=spec["batching"].get("preferred_batch_size"))

    @classmethod
    def from_file(cls, path: str) -> InstanceConfig:
        with open(path, encoding="utf-8") as handle:
            return cls(**json.load(handle))

    @classmethod
    def from_json(cls, text: str) -> InstanceConfig:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class InstanceEnvironment:
    """The variables an instance reads; ``from_environ`` is the only place they are read."""

    config_path: str | None
    listen_fd: int | None
    device: str = "cpu"
    config_json: str | None = None
    key: str | None = None
    listen: tuple[str, int] | None = None   # (host, port) to bind when no socket is inherited
    listen_unix_fd: int | None = None        # a Unix socket served beside the TCP one

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> InstanceEnvironment:
        environ = os.environ if environ is None else environ
        fd, unix_fd = environ.get(ENV_LISTEN_FD), environ.get(ENV_LISTEN_UNIX_FD)
        host, _, port = (environ.get(ENV_LISTEN) or "").rpartition(":")
        return cls(config_path=environ.get(ENV_CONFIG) or None,
                   listen_fd=int(fd) if fd and fd.isdigit() else None,
                   device=environ.get(ENV_DEVICE) or "cpu",
                   config_json=environ.get(ENV_CONFIG_JSON) or None, key=environ.get(ENV_KEY) or None,
                   listen=(host.strip("[]"), int(port)) if host and port.isdigit() else None,
                   listen_unix_fd=int(unix_fd) if unix_fd and unix_fd.isdigit() else None)

    def config(self) -> InstanceConfig | None:
        """The instance's configuration from the file or the inline JSON; None when neither is set."""
        if self.config_json:
            return InstanceConfig.from_json(self.config_json)
        return InstanceConfig.from_file(self.config_path) if self.config_path else None


STREAM_TYPES = {"sse": "text/event-stream", "ndjson": "application/x-ndjson"}
FRAME_ENDS = {"sse": b"\n\n", "ndjson": b"\n"}     # what ends one event or line of each kind
SSE_DONE = b"data: [DONE]\n\n"
SSE_ERROR = b"event: error\n"


def stream_done(kind: str, chunks: int) -> bytes:
    """A finished stream's last frame: ``data: [DONE]`` or the line ``{"done": true, "chunks": N}``."""
    return SSE_DONE if kind == "sse" else b'{"done": true, "chunks": %d}\n' % chunks


def stream_error(kind: str, message: str, status: int) -> bytes:
    """A failed stream's last frame: ``event: error`` with ``data: {"error", "status"}``, or that
    object as the last line."""
    failure = json.dumps({"error": message, "status": status})
    return f"event: error\ndata: {failure}\n\n".encode() if kind == "sse" else f"{failure}\n".encode()


def ends_stream(kind: str, frame: bytes) -> bool:
    """Whether ``frame`` (one event or line, with its end) is a stream's terminator."""
    if kind == "sse":
        return frame == SSE_DONE or frame.startswith(SSE_ERROR)
    return stream_ending(frame) is not None


def stream_ending(line: bytes | Any) -> str | None:
    """``"done"`` or ``"error"`` for a JSON-lines terminator (the line, or the object decoded
    from it), None for a chunk. Only these exact shapes are terminators."""
    document = line
    if isinstance(line, bytes):
        if not line.startswith(b'{"'):
            return None
        try:
            document = json.loads(line)
        except ValueError:
            return None
    if not isinstance(document, dict):
        return None
    if document.keys() == {"done", "chunks"} and document["done"] is True:
        return "done"
    if document.keys() == {"error", "status"}:
        return "error"
    return None


def stream_kind(accept: str | None) -> str | None:
    """The stream a caller asks for by its ``Accept`` header: ``sse`` (server-sent events),
    ``ndjson`` (JSON lines) or None (a whole answer)."""
    if accept:
        for kind, media_type in STREAM_TYPES.items():
            if media_type in accept:
                return kind
    return None


def new_key() -> str:
    import secrets

    return secrets.token_urlsafe(18)


def route_prefix(key: str | None) -> str:
    """Where an instance with ``key`` serves its routes."""
    return f"/i/{key}" if key else ""


def is_loading(status: int, headers: Mapping[str, str]) -> bool:
    """Whether an instance's reply means "still loading, try another" (not a failure)."""
    return status == 503 and headers.get(LOADING_HEADER) == "1"
