"""The process runtime: each instance is a child process with its own port, environment and log.

The worker binds the instance's listening socket itself and passes it down (``pass_fds``), so
ports are never raced for and a dead instance's port refuses connections at once.

Spares: the backend keeps ``spares`` processes started ahead of time, with the interpreter up
and the instance server imported, waiting on stdin for an assignment. A CPU instance whose
environment can be applied after start-up (no ``PYTHON*`` or ``LD_*`` variables in its spec)
takes a spare instead of a fresh process - its cold start skips the interpreter's start and the
imports (torch: seconds) - and a new spare is started behind it. New spares are forked from the
pool's zygote (``worker.backends.zygote``), which did those imports once: a fork costs
milliseconds and shares the imports' memory, where a fresh interpreter costs seconds of CPU
(spares start the slow way only until the zygote is ready, or if it is gone). Spares and the
zygote wait in the background CPU group, so refilling the pool never slows serving down. GPU
instances always start fresh: the shim must be preloaded when the process starts.

A worker running as root starts every instance (and spare) as an unprivileged user, each in a
folder of its own (``worker.sandbox``); the instance's config travels in its environment.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from dilu import instance_protocol as protocol
from dilu.instance_protocol import InstanceConfig
from dilu.messages import DeviceInfo, StartInstance
from worker.cgroups import CpuLimiter, join_group, join_group_of
from worker.backends.base import RunningInstance, endpoint_url
from worker.backends.zygote import Zygote, ZygoteChild
from worker.pool import PoolSizer
from worker.sandbox import InstanceUser, Sandboxes, become, die_with_parent

logger = logging.getLogger(__name__)


def _child_setup(procs_file: str | None, user: InstanceUser | None):  # noqa: ANN202
    def setup() -> None:
        join_group(procs_file)      # while still privileged enough to write the cgroup
        if user is not None:
            become(user)
        die_with_parent()           # after the switch: changing credentials clears it

    return setup


@dataclass
class _Spare:
    process: subprocess.Popen | ZygoteChild
    endpoint: str
    fd: int
    log_path: Path


class ProcessBackend:
    """Implements RuntimeBackend with local child processes."""

    def __init__(self, *, state_dir: Path, python: str | None = None, host: str = "127.0.0.1",
                 advertise_host: str | None = None, base_env: dict[str, str] | None = None,
                 cpu: CpuLimiter | None = None, spares: int = 0, spares_max: int | None = None,
                 preload: tuple[str, ...] = (), user: InstanceUser | None = None) -> None:
        self._state_dir = state_dir
        self._pool = PoolSizer(spares, max(spares, spares_max if spares_max is not None else spares))
        self._preload = tuple(preload)
        self._sandboxes = Sandboxes(user) if user is not None else None
        self.cpu = cpu
        self._python = python or sys.executable
        self._host = host
        self._advertise = advertise_host or host
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._spares: list[_Spare] = []
        self._spare_count = 0
        self._zygote = self._start_zygote() if self._pool.maximum > 0 else None
        self._refill()

    @property
    def shared_dir(self) -> Path | None:
        """A folder every instance can reach (token-manager sockets), when instances run as
        another user; None when they run as the worker's user."""
        return self._sandboxes.shared if self._sandboxes else None

    def instance_env(self, request: StartInstance, device: DeviceInfo, config_json: str, fd: int,
                     extra_env: dict[str, str] | None = None, instance_key: str = "",
                     home: Path | None = None) -> dict[str, str]:
        env = dict(self._base_env)
        env.update(request.spec.get("env") or {})
        for name, value in (extra_env or {}).items():
            # Search paths are prepended to what the worker had, not replacing it.
            if name in ("LD_LIBRARY_PATH", "LD_PRELOAD") and env.get(name):
                separator = ":" if name == "LD_LIBRARY_PATH" else " "
                value = f"{value}{separator}{env[name]}"
            env[name] = value
        env.update({
            protocol.ENV_KEY: instance_key,
            protocol.ENV_CONFIG_JSON: config_json,
            protocol.ENV_LISTEN_FD: str(fd),
            protocol.ENV_INSTANCE_ID: request.instance_id,
            protocol.ENV_FUNCTION: request.function,
            protocol.ENV_DEVICE: "cuda" if device.kind == "gpu" else "cpu",
            # Keyed by UUID so the instance sees exactly its GPU (or none on a CPU worker).
            "CUDA_VISIBLE_DEVICES": device.uuid if device.kind == "gpu" and device.uuid else "",
            "PYTHONUNBUFFERED": "1",
        })
        if home is not None:   # its own HOME and temp folder, not the worker's
            env.update({"HOME": str(home), "TMPDIR": str(home), "USER": self._sandboxes.user.name,
                        "LOGNAME": self._sandboxes.user.name})
        return env

    async def start(self, request: StartInstance, device: DeviceInfo, log_path: Path,
                    extra_env: dict[str, str] | None = None, owner: str = "") -> RunningInstance:
        if request.spec.get("image"):
            raise RuntimeError(f"function {request.function} names an image ({request.spec['image']}): "
                               "it needs a worker with the docker runtime (DILU_RUNTIME=docker)")
        key = protocol.new_key()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        code, home = await asyncio.to_thread(self._place_code, request)
        config_json = self._config_json(request, code)
        spare = self._take_spare(request, device, extra_env)
        if spare is not None:
            try:
                return self._assign(spare, request, device, config_json, code, home, log_path, extra_env, key)
            finally:
                self._refill()
        listener = socket.socket(_family(self._host), socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self._host, 0))
        listener.listen(1024)
        listener.set_inheritable(True)
        port = listener.getsockname()[1]
        try:
            with open(log_path, "ab") as log:
                process = subprocess.Popen(
                    [self._python, "-m", "worker.instance"],
                    env=self.instance_env(request, device, config_json, listener.fileno(), extra_env, key, home),
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    pass_fds=(listener.fileno(),), start_new_session=True,
                    preexec_fn=_child_setup(self._cpu_group(request, device), self._user), cwd=code,
                )
        except OSError as exc:
            raise RuntimeError(f"cannot start instance process: {exc}") from exc
        finally:
            listener.close()
        return RunningInstance(endpoint=endpoint_url(self._advertise, port) + protocol.route_prefix(key),
                               pid=process.pid, handle=process)

    @property
    def _user(self) -> InstanceUser | None:
        return self._sandboxes.user if self._sandboxes else None

    def _place_code(self, request: StartInstance) -> tuple[str, Path | None]:
        """(working folder, HOME or None): the instance's own copy of its code when it runs as
        another user (who cannot reach the worker's folders), else the code where it is."""
        if self._sandboxes is None:
            return request.source_dir, None
        code, home = self._sandboxes.create(request.instance_id, request.source_dir)
        return str(code), home

    @staticmethod
    def _config_json(request: StartInstance, source_dir: str) -> str:
        spec = request.spec
        config = InstanceConfig(
            instance_id=request.instance_id, function=request.function, handler=spec["handler"],
            source_dir=source_dir, options=spec.get("model") or {},
            max_batch_size=spec["batching"]["max_batch_size"], max_wait_ms=spec["batching"]["max_wait_ms"],
            warmup=spec.get("warmup"))
        return json.dumps(asdict(config))

    # ---- spares ----
    def _refill(self) -> None:
        """Brings the pool to its target: starts spares (each spawn is a fork/exec: milliseconds;
        their imports run in the background), or ends the newest ones past it."""
        self._spares = [spare for spare in self._spares if spare.process.poll() is None]
        target = self._pool.target(time.monotonic())
        while len(self._spares) > target:
            _end_spare(self._spares.pop())
        while len(self._spares) < target:
            try:
                self._spares.append(self._spawn_spare())
            except OSError as exc:
                logger.warning("cannot start a spare instance process: %s", exc)
                return

    def maintain(self) -> None:
        """Periodic: the pool shrinks back once cold starts have been rare for a while."""
        self._refill()

    def pool_status(self) -> dict:
        """What ``dilu status`` shows of the runtime pool."""
        zygote = self._zygote
        return {"spares": len([s for s in self._spares if s.process.poll() is None]),
                "target": self._pool.target(time.monotonic()), "min": self._pool.minimum,
                "max": self._pool.maximum, "preloaded": list(self._preload),
                "zygote": "off" if zygote is None or not zygote.alive else "ready" if zygote.ready else "starting"}

    def _start_zygote(self) -> Zygote | None:
        folder = self._state_dir / "logs"
        folder.mkdir(parents=True, exist_ok=True)
        try:
            return Zygote([self._python, "-m", "worker.instance", "--zygote"],
                          env={**self._base_env, "PYTHONUNBUFFERED": "1", protocol.ENV_PRELOAD: ",".join(self._preload)},
                          cwd=self._sandboxes.shared if self._sandboxes else self._state_dir,
                          log_path=folder / f"zygote-{os.getpid()}.log",
                          preexec_fn=_child_setup(self._background_group(), self._user))
        except OSError as exc:
            logger.warning("cannot start the runtime pool's zygote (spares start the slow way): %s", exc)
            return None

    def _background_group(self) -> str | None:
        return self.cpu.background_procs_file() if self.cpu and self.cpu.available else None

    def _spawn_spare(self) -> _Spare:
        self._spare_count += 1
        folder = self._state_dir / "logs"
        folder.mkdir(parents=True, exist_ok=True)
        log_path = folder / f"spare-{os.getpid()}-{self._spare_count}.log"
        listener = socket.socket(_family(self._host), socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self._host, 0))
        listener.listen(1024)
        listener.set_inheritable(True)
        forked = self._zygote.fork(log_path, listener) if self._zygote is not None else None
        if forked is not None:
            port = listener.getsockname()[1]
            listener.close()
            return _Spare(forked, endpoint_url(self._advertise, port), -1, log_path)
        try:
            with open(log_path, "ab") as log:
                process = subprocess.Popen(
                    [self._python, "-m", "worker.instance", "--spare"],
                    env={**self._base_env, "PYTHONUNBUFFERED": "1", protocol.ENV_PRELOAD: ",".join(self._preload)},
                    stdin=subprocess.PIPE, stdout=log,
                    stderr=subprocess.STDOUT, pass_fds=(listener.fileno(),), start_new_session=True,
                    # Spares import in the background group: a refill never slows serving down;
                    # an assigned spare moves to its instance's group.
                    preexec_fn=_child_setup(self._background_group(), self._user),
                    cwd=self._sandboxes.shared if self._sandboxes else self._state_dir)
        finally:
            port = listener.getsockname()[1]
            fd = listener.fileno()
            listener.close()
        return _Spare(process, endpoint_url(self._advertise, port), fd, log_path)

    def _take_spare(self, request: StartInstance, device: DeviceInfo,
                    extra_env: dict[str, str] | None) -> _Spare | None:
        """A live spare, when this instance can run in one (CPU, nothing injected at exec)."""
        late_env = all(not key.startswith(("PYTHON", "LD_")) for key in (request.spec.get("env") or {}))
        if device.kind != "cpu" or extra_env or not late_env:
            return None
        while self._spares:
            spare = self._spares.pop(0)
            if spare.process.poll() is None:
                self._pool.took(time.monotonic())
                return spare
        return None

    def _assign(self, spare: _Spare, request: StartInstance, device: DeviceInfo, config_json: str, code: str,
                home: Path | None, log_path: Path, extra_env: dict[str, str] | None, key: str) -> RunningInstance:
        procs = self._cpu_group(request, device)
        if procs:
            join_group_of(procs, spare.process.pid)
        os.replace(spare.log_path, log_path)
        env = self.instance_env(request, device, config_json, spare.fd, extra_env, key, home)
        assignment = {"env": env, "cwd": code}
        try:
            spare.process.stdin.write((json.dumps(assignment) + "\n").encode())
            spare.process.stdin.close()
        except OSError as exc:
            raise RuntimeError(f"cannot hand the instance to a spare process: {exc}") from exc
        return RunningInstance(endpoint=spare.endpoint + protocol.route_prefix(key), pid=spare.process.pid,
                               handle=spare.process)

    def close(self) -> None:
        """Ends the spares (instances are stopped by the worker)."""
        spares, self._spares = self._spares, []
        self._pool = PoolSizer(0, 0)
        for spare in spares:
            _end_spare(spare)
        if self._zygote is not None:
            self._zygote.close()
            self._zygote = None
        if self._sandboxes is not None:
            self._sandboxes.close()

    def _cpu_group(self, request: StartInstance, device: DeviceInfo) -> str | None:
        """CPU workers: the instance's cgroup, unlimited while it loads; the worker applies its
        slice (a share of the host's cores) once it is ready."""
        if self.cpu is None or device.kind != "cpu" or not self.cpu.available:
            return None
        self.cpu.set_share(request.instance_id, None)
        return self.cpu.procs_file(request.instance_id)

    def set_share(self, instance_id: str, share: float | None) -> bool:
        return self.cpu is not None and self.cpu.set_share(instance_id, share)

    @property
    def enforces_shares(self) -> bool:
        return self.cpu is not None and self.cpu.available

    def release(self, instance_id: str) -> None:
        if self.cpu is not None:
            self.cpu.remove(instance_id)
        if self._sandboxes is not None:
            self._sandboxes.remove(instance_id)

    async def adopt(self, owner: str, log_path: Callable[[str], Path]) -> list[tuple[StartInstance, RunningInstance]]:
        return []  # instance processes die with their worker (PR_SET_PDEATHSIG)

    def logs(self, running: RunningInstance, lines: int) -> str | None:
        return None

    def exit_code(self, running: RunningInstance) -> int | None:
        return running.handle.poll()

    async def stop(self, running: RunningInstance, grace_s: float) -> None:
        process: subprocess.Popen = running.handle
        if process.poll() is not None:
            return
        _signal_group(process.pid, signal.SIGTERM)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while process.poll() is None and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if process.poll() is None:
            _signal_group(process.pid, signal.SIGKILL)
            await asyncio.to_thread(process.wait)
        else:
            # Whatever the instance forked must go too.
            _signal_group(process.pid, signal.SIGKILL)


def _end_spare(spare: _Spare) -> None:
    if spare.process.stdin:
        spare.process.stdin.close()
    _signal_group(spare.process.pid, signal.SIGKILL)
    spare.process.wait()


def _family(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
