"""The worker's side of the runtime pool's zygote (``worker.instance.zygote`` is the other side).

``Zygote`` starts the template process and asks it for spares; each spare is a ``ZygoteChild``,
which stands in for ``subprocess.Popen`` where the backend uses one (``pid``, ``stdin``,
``poll``, ``wait``). A spare is the zygote's child, so its exit code arrives as a message; if the
zygote itself is gone, its children died with it (they are killed when it dies).
"""

from __future__ import annotations

import logging
import os
import select
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

logger = logging.getLogger(__name__)
FORK_TIMEOUT_S = 5.0


class Zygote:
    def __init__(self, command: list[str], *, env: dict[str, str], cwd: Path, log_path: Path,
                 preexec_fn: Callable[[], None] | None) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(command, env=env, stdin=theirs, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True, preexec_fn=preexec_fn, cwd=cwd)
        theirs.close()
        self._control = ours
        self._buffer = b""
        self._ready = False
        self._exits: dict[int, int] = {}

    @property
    def ready(self) -> bool:
        """Whether it has finished its imports and answers (never blocks)."""
        if not self._ready and self.alive:
            self._read(0.0)
        return self._ready and self.alive

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def fork(self, log_path: Path, listener: socket.socket, unix: socket.socket | None = None) -> ZygoteChild | None:
        """A new spare writing to ``log_path`` and serving on ``listener`` (and ``unix``); None
        if the zygote cannot make one (the caller starts a spare the slow way)."""
        if not self.ready:
            return None
        read_end, write_end = os.pipe()
        try:
            with open(log_path, "ab") as log:
                fds = [read_end, log.fileno(), listener.fileno(), *([unix.fileno()] if unix is not None else [])]
                socket.send_fds(self._control, [b"FORK\n"], fds)
            pid = self._await_forked()
        except OSError as exc:
            logger.warning("the runtime pool's zygote did not fork: %s", exc)
            os.close(write_end)
            return None
        finally:
            os.close(read_end)
        if pid is None:
            os.close(write_end)
            return None
        return ZygoteChild(self, pid, os.fdopen(write_end, "wb"))

    def exit_code(self, pid: int) -> int | None:
        """A child's exit code once it has ended, else None."""
        if pid not in self._exits:
            if self.alive:
                self._read(0.0)
            elif not _exists(pid):
                return -9   # died with the zygote
        return self._exits.get(pid)

    def close(self) -> None:
        self._control.close()     # the zygote's loop ends on EOF
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    # ---- messages ----
    def _await_forked(self) -> int | None:
        deadline = time.monotonic() + FORK_TIMEOUT_S
        while time.monotonic() < deadline:
            for line in self._read(max(0.0, deadline - time.monotonic())):
                if line.startswith(b"FORKED "):
                    return int(line.split()[1])
            if not self.alive:
                return None
        return None

    def _read(self, timeout: float) -> list[bytes]:
        """Reads what has arrived (waiting up to ``timeout`` for something) and returns the lines
        that are not exit reports (those are recorded)."""
        lines = []
        if select.select([self._control], [], [], timeout)[0]:
            data = self._control.recv(65536)
            self._buffer += data
        *complete, self._buffer = self._buffer.split(b"\n")
        for line in complete:
            if line == b"READY":
                self._ready = True
            elif line.startswith(b"EXIT "):
                _, pid, code = line.split()
                self._exits[int(pid)] = int(code)
            else:
                lines.append(line)
        return lines


class ZygoteChild:
    """A spare forked by the zygote, used where the backend would use a ``Popen``."""

    def __init__(self, zygote: Zygote, pid: int, stdin: IO[bytes]) -> None:
        self._zygote = zygote
        self.pid = pid
        self.stdin = stdin
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.01)
        return self.returncode


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
