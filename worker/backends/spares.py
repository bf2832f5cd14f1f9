"""The runtime pool of one kind of instance process: spares started ahead of need.

A spare has the interpreter up, the instance server and the common libraries imported, and waits
on stdin for its assignment (``worker.instance``). What an instance is told at assignment reaches
it through ``os.environ``; what must be in place when the process *starts* cannot be told late:
the dynamic loader reads ``LD_*`` (the GPU shim is preloaded, the fake driver found, through
them), the interpreter reads ``PYTHON*`` and malloc ``GLIBC_TUNABLES`` and ``MALLOC_*``
(``worker.backends.heap``). So a worker keeps one pool per set of those
exec-time variables (``exec_time``): one for plain CPU instances, one for instances under the GPU
shim (the shim reads the rest of its configuration at the first driver call, after the
assignment; ``shim/src/config.c``).

Each pool forks its spares from a zygote that did the imports once (``worker.backends.zygote``):
milliseconds and no CPU per spare; until the zygote is ready (or if it is gone) spares start the
slow way, as fresh interpreters in the background CPU group.
"""

from __future__ import annotations

import logging
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dilu import instance_protocol as protocol
from dilu.local_sockets import SocketFolder
from worker.backends.base import endpoint_url, inheritable_listener, signal_group
from worker.backends.zygote import Zygote, ZygoteChild
from worker.pool import PoolSizer

logger = logging.getLogger(__name__)
EXEC_TIME_PREFIXES = ("LD_", "PYTHON", "GLIBC_", "MALLOC_")


def exec_time(env: dict[str, str] | None) -> dict[str, str]:
    """The variables of ``env`` that only take effect when a process starts (pure)."""
    return {name: value for name, value in (env or {}).items() if name.startswith(EXEC_TIME_PREFIXES)}


def pool_key(exec_env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """Which pool serves instances started with these exec-time variables (pure)."""
    return tuple(sorted(exec_env.items()))


@dataclass
class Spare:
    process: subprocess.Popen | ZygoteChild
    endpoint: str
    fd: int            # the listener's number in the worker's spawn (-1: a fork has its own)
    log_path: Path
    unix_fd: int = -1                # its Unix socket's number, likewise (-1: a fork, or none)
    socket_file: str | None = None   # that socket's file in the launch's folder, until assigned


@dataclass(frozen=True)
class SpareLaunch:
    """How this pool's processes start: interpreter, full environment, folder, where logs go,
    the address spares listen on, and what runs in the child before exec (cgroup, user);
    ``sockets``: where each spare also listens on a Unix socket (None: TCP only)."""
    name: str
    python: str
    env: dict[str, str]
    cwd: Path
    logs: Path
    host: str
    advertise: str
    preexec: Callable[[], None]
    sockets: SocketFolder | None = None


class SparePool:
    """Keeps between ``sizer.minimum`` and ``sizer.maximum`` spares of one kind."""

    def __init__(self, launch: SpareLaunch, sizer: PoolSizer, wait_for_zygote: bool = False) -> None:
        """``wait_for_zygote``: no spare the slow way while the zygote imports (a pool that
        preloads torch: each fresh interpreter would import it again, seconds of CPU and
        hundreds of MiB it shares with nobody); its spares come as forks once it is ready."""
        self.launch = launch
        self.sizer = sizer
        self._wait_for_zygote = wait_for_zygote
        self.spares: list[Spare] = []
        self._count = 0
        self.zygote = self._start_zygote() if sizer.maximum > 0 else None
        self.refill()

    def refill(self) -> None:
        """Brings the pool to its target: starts spares (a fork, or a fork/exec: milliseconds;
        a fresh one imports in the background), or ends the newest ones past it."""
        self.spares = [spare for spare in self.spares if spare.process.poll() is None]
        target = self.sizer.target(time.monotonic())
        while len(self.spares) > target:
            self._end(self.spares.pop())
        zygote = self.zygote
        if self._wait_for_zygote and zygote is not None and zygote.alive and not zygote.ready:
            return
        while len(self.spares) < target:
            try:
                self.spares.append(self._spawn())
            except OSError as exc:
                logger.warning("cannot start a spare instance process: %s", exc)
                return

    def take(self) -> Spare | None:
        """A live spare (counted as demand, so the pool grows), or None."""
        while self.spares:
            spare = self.spares.pop(0)
            if spare.process.poll() is None:
                self.sizer.took(time.monotonic())
                return spare
        return None

    def status(self, preloaded: list[str]) -> dict:
        zygote = self.zygote
        return {"spares": len([s for s in self.spares if s.process.poll() is None]),
                "target": self.sizer.target(time.monotonic()), "min": self.sizer.minimum,
                "max": self.sizer.maximum, "preloaded": preloaded,
                "zygote": "off" if zygote is None or not zygote.alive else "ready" if zygote.ready else "starting"}

    def close(self) -> None:
        spares, self.spares = self.spares, []
        self.sizer = PoolSizer(0, 0)
        for spare in spares:
            self._end(spare)
        if self.zygote is not None:
            self.zygote.close()
            self.zygote = None

    def _start_zygote(self) -> Zygote | None:
        launch = self.launch
        launch.logs.mkdir(parents=True, exist_ok=True)
        try:
            return Zygote([launch.python, "-m", "worker.instance", "--zygote"], env=launch.env, cwd=launch.cwd,
                          log_path=launch.logs / f"zygote-{launch.name}.log", preexec_fn=launch.preexec)
        except OSError as exc:
            logger.warning("cannot start the %s runtime pool's zygote (spares start the slow way): %s",
                           launch.name, exc)
            return None

    def _end(self, spare: Spare) -> None:
        end_spare(spare)
        if spare.socket_file is not None and self.launch.sockets is not None:
            self.launch.sockets.remove(spare.socket_file)

    def _spawn(self) -> Spare:
        launch = self.launch
        self._count += 1
        launch.logs.mkdir(parents=True, exist_ok=True)
        log_path = launch.logs / f"spare-{launch.name}-{self._count}.log"
        socket_file = f"spare-{launch.name}-{self._count}.sock"
        listener = inheritable_listener(launch.host)
        port = listener.getsockname()[1]
        unix = bind_unix(launch.sockets, socket_file)
        if unix is None:
            socket_file = None
        try:
            forked = self.zygote.fork(log_path, listener, unix) if self.zygote is not None else None
            if forked is not None:
                return Spare(forked, endpoint_url(launch.advertise, port), -1, log_path, -1, socket_file)
            passed = (listener.fileno(),) if unix is None else (listener.fileno(), unix.fileno())
            try:
                with open(log_path, "ab") as log:
                    process = subprocess.Popen(
                        [launch.python, "-m", "worker.instance", "--spare"], env=launch.env,
                        stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, pass_fds=passed,
                        start_new_session=True, preexec_fn=launch.preexec, cwd=launch.cwd)
            except BaseException:
                if socket_file is not None and launch.sockets is not None:
                    launch.sockets.remove(socket_file)
                raise
            return Spare(process, endpoint_url(launch.advertise, port), passed[0], log_path,
                         passed[1] if unix is not None else -1, socket_file)
        finally:
            listener.close()
            if unix is not None:
                unix.close()


def bind_unix(sockets: SocketFolder | None, name: str) -> socket.socket | None:
    """A listening Unix socket ``name`` in ``sockets`` for a process to inherit; None without a
    folder, or when it cannot be bound (the instance is then reached over TCP only)."""
    if sockets is None:
        return None
    try:
        return sockets.bind(name)
    except OSError as exc:
        logger.warning("cannot bind the Unix socket %s in %s (instances are reached over TCP): %s",
                       name, sockets.path, exc)
        return None


def end_spare(spare: Spare) -> None:
    if spare.process.stdin:
        spare.process.stdin.close()
    signal_group(spare.process.pid, signal.SIGKILL)
    spare.process.wait()


def preload_env(env: dict[str, str], preload: tuple[str, ...]) -> dict[str, str]:
    """A pool process's environment: the worker's, with what it imports ahead of need."""
    return {**env, "PYTHONUNBUFFERED": "1", protocol.ENV_PRELOAD: ",".join(preload)}
