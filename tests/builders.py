"""Test data builders with defaults."""

from __future__ import annotations

import gzip
import io
import tarfile
from typing import Any

from dilu.messages import DeviceInfo, StartInstance, WorkerInfo
from dilu.spec import spec_from_dict, spec_to_dict


def make_spec_dict(name: str = "fn", handler: str = "handler:Echo", **overrides: Any) -> dict[str, Any]:
    """A validated spec as stored in the database."""
    document: dict[str, Any] = {"name": name, "handler": handler}
    document.update(overrides)
    return spec_to_dict(spec_from_dict(document))


def make_worker(worker_id: str = "w1", kind: str = "cpu", memory: int = 8 * 2**30,
                url: str | None = None) -> WorkerInfo:
    device = DeviceInfo(kind=kind, uuid=f"GPU-{worker_id}" if kind == "gpu" else None, name=kind,
                        memory_bytes=memory, index=0 if kind == "gpu" else None)
    return WorkerInfo(id=worker_id, host="test", url=url, device=device)


def make_start(instance_id: str, source_dir: str, handler: str = "handler:Echo", function: str = "fn",
               **spec_overrides: Any) -> StartInstance:
    spec = make_spec_dict(function, handler, **spec_overrides)
    return StartInstance(instance_id=instance_id, function=function, version=1, spec=spec,
                         source_dir=source_dir, memory_bytes=spec["resources"]["memory"])


class _Zeros(io.RawIOBase):
    """A file of ``size`` zero bytes, read without holding them."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readinto(self, buffer) -> int:
        count = min(len(buffer), self.left)
        buffer[:count] = bytes(count)
        self.left -= count
        return count

    def readable(self) -> bool:
        return True


def compression_bomb(size: int, name: str = "zeros.bin") -> bytes:
    """A .tar.gz holding one file of ``size`` zero bytes: about a thousandth of that on the wire."""
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=9) as zipped, \
            tarfile.open(fileobj=zipped, mode="w") as archive:
        info = tarfile.TarInfo(name)
        info.size = size
        archive.addfile(info, _Zeros(size))
    return buffer.getvalue()
