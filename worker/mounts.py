"""The mount(2) calls of an instance's own view of the host (``worker.sandbox``,
``worker.reach``): a tmpfs, and a folder or file bound back read-only through a descriptor
opened before a mount hid it. Each raises OSError naming the path."""

from __future__ import annotations

import ctypes
import os

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND = 0x1, 0x2, 0x4, 0x20, 0x1000
MS_REC, MS_SLAVE = 0x4000, 0x80000


def mount(source: bytes | None, target: str, kind: bytes | None, flags: int, options: bytes | None) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(source, target.encode(), kind, flags, options) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"a view of {target}: {os.strerror(error)}")


def tmpfs(target: str, options: bytes) -> None:
    """An empty tmpfs on ``target``, without setuid programs or device files."""
    mount(b"tmpfs", target, b"tmpfs", MS_NOSUID | MS_NODEV, options)


def bind_read_only(fd: int, path: str) -> None:
    """What ``fd`` (an O_PATH descriptor) names, bound at ``path`` (which must exist) read-only;
    the descriptor is closed."""
    mount(f"/proc/self/fd/{fd}".encode(), path, None, MS_BIND | MS_REC, None)
    mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY, None)
    os.close(fd)
