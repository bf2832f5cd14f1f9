"""The folder of Unix sockets through which a gateway reaches the instances on its own host.

A process instance listens on TCP (for every gateway) and on a Unix socket in this folder (for a
gateway on the same host): a request over the socket skips the loopback TCP stack, about 40-70 us
of a no-op request here (docs/benchmarks.md). The worker binds both before the instance starts;
the socket is named by the instance's id, so a gateway finds it from the route alone and falls
back to TCP when it is not there (another host, another user, the docker runtime).

The folder is 0700: only the worker's user (and the gateway running as it) may connect. Paths go
through ``/proc/self/fd`` of the open folder, so a long home folder never meets the 108-byte
limit of a socket's address.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
from pathlib import Path

log = logging.getLogger(__name__)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def socket_name(instance_id: str) -> str | None:
    """The file an instance's socket has (pure); None for an id that cannot name a file safely."""
    return f"{instance_id}.sock" if _NAME.fullmatch(instance_id) else None


class SocketFolder:
    """One host's instance sockets; opened (and created 0700) by the worker and the gateway."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        if os.fstat(self._fd).st_uid == os.geteuid():
            os.fchmod(self._fd, 0o700)      # made by an earlier release, or by hand, more open

    def _address(self, file: str) -> str:
        return f"/proc/self/fd/{self._fd}/{file}"

    def address_of(self, instance_id: str) -> str | None:
        """Where a gateway connects to reach ``instance_id`` here; None when it has no socket."""
        name = socket_name(instance_id)
        if name is None or not os.path.exists(self._address(name)):
            return None
        return self._address(name)

    def bind(self, name: str) -> socket.socket:
        """A listening socket at ``name`` (replacing a stale one), inheritable by a child."""
        self.remove(name)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(self._address(name))
            listener.listen(1024)
        except OSError:
            listener.close()
            raise
        listener.set_inheritable(True)
        return listener

    def rename(self, old: str, new: str) -> None:
        """Gives a spare's socket its instance's name (the bound socket follows its file)."""
        os.rename(old, new, src_dir_fd=self._fd, dst_dir_fd=self._fd)

    def remove(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self._fd)

    def sweep(self) -> int:
        """Removes the sockets nothing listens on any more (left by a worker that died); how many."""
        removed = 0
        for entry in os.scandir(self._address("")):
            if not entry.name.endswith(".sock"):
                continue
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(self._address(entry.name))
            except ConnectionRefusedError:
                self.remove(entry.name)
                removed += 1
            except OSError:
                pass
            finally:
                probe.close()
        return removed

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


def open_folder(path: Path | None) -> SocketFolder | None:
    """The folder at ``path`` (None, or one that cannot be opened: instances are reached over TCP)."""
    if path is None:
        return None
    try:
        return SocketFolder(path)
    except OSError as exc:
        log.warning("instances are reached over TCP only: cannot open %s: %s", path, exc)
        return None
