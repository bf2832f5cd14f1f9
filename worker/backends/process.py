"""The process runtime: each instance is a child process with its own port, environment and log.

The worker binds the instance's listening socket itself and passes it down (``pass_fds``), so
ports are never raced for and a dead instance's port refuses connections at once.

Spares: the backend keeps runtime pools (``worker.backends.pools``) per kind of instance
process - plain CPU instances, instances under the GPU shim - of processes started ahead of
time, with the interpreter up and the instance server imported, waiting for an assignment; and,
while a function whose code imports them runs here, pools that preload heavy libraries too
(torch: seconds). An instance whose own environment can be applied after start-up (no
``PYTHON*`` or ``LD_*`` variables in its spec) takes a spare of its kind instead of a fresh
process, and a new spare is forked behind it. Each agent asks for the pool its device needs
(``prepare_pool``).

A worker running as root starts every instance as its function's own unprivileged user, each in
a folder of its own (``worker.sandbox``, ``worker.uids``); spares wait as root, running only the
platform's code, and take their function's user at assignment, before anything of the function
runs. The instance's config travels in its environment, which is built from an allow-list
(``worker.backends.instance_env``): nothing of the worker's own settings or secrets.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from dilu import instance_protocol as protocol
from dilu.instance_protocol import InstanceConfig
from dilu.local_sockets import SocketFolder, socket_name
from dilu.messages import DeviceInfo, StartInstance
from worker.backends.base import RunningInstance, endpoint_url, inheritable_listener, signal_group
from worker.backends.bounds import PIDS, RUNTIME_MEMORY, InstanceBounds, bounds_for
from worker.backends.heap import keeping_freed_memory
from worker.backends.imports import imported_modules, preloads_needed, python_sources
from worker.backends.instance_env import allowed_env
from worker.backends.pools import RuntimePools
from worker.backends.spares import Spare, SpareLaunch, SparePool, bind_unix, exec_time, preload_env
from worker.cgroups import CpuLimiter, InstanceGroups, join_group_of, join_groups
from worker.leftovers import Leftovers
from worker.pool import PoolSizer
from worker.reach import Cover
from worker.sandbox import (
    SANDBOX_PREFIX,
    InstanceUser,
    Sandboxes,
    become,
    die_with_parent,
    kept_in_temp,
    platform_paths,
    platform_reach,
    private_temp,
)
from worker.uids import UidRegistry

log = logging.getLogger(__name__)


def _child_setup(procs_files: list[str], user: InstanceUser | None, temp_bytes: int | None = None,
                 keep: tuple[str, ...] = (), reach: tuple[Cover, ...] = ()) -> Callable[[], None]:
    def setup() -> None:
        join_groups(procs_files)    # while still privileged enough to write the cgroups
        if temp_bytes is not None:
            private_temp(temp_bytes, keep, reach)
        if user is not None:
            become(user.uid, user.gid)
        die_with_parent()           # after the switch: changing credentials clears it

    return setup


def with_injection(env: dict[str, str], extra_env: dict[str, str] | None) -> dict[str, str]:
    """``env`` with what the worker injects (the shim) added; search paths are prepended to
    what ``env`` had, not replacing it (pure)."""
    env = dict(env)
    for name, value in (extra_env or {}).items():
        if name in ("LD_LIBRARY_PATH", "LD_PRELOAD") and env.get(name):
            separator = ":" if name == "LD_LIBRARY_PATH" else " "
            value = f"{value}{separator}{env[name]}"
        env[name] = value
    return env


class ProcessBackend:
    """Implements RuntimeBackend with local child processes."""

    def __init__(self, *, state_dir: Path, python: str | None = None, host: str = "127.0.0.1",
                 advertise_host: str | None = None, base_env: dict[str, str] | None = None,
                 cpu: CpuLimiter | None = None, spares: int = 0, spares_max: int | None = None,
                 preload: tuple[str, ...] = (), users: UidRegistry | None = None, cpu_pool: bool = True,
                 passed_env: tuple[str, ...] = (), groups: InstanceGroups | None = None,
                 runtime_memory: int = RUNTIME_MEMORY, pids: int = PIDS, stream_stall_s: float = 30.0,
                 preload_keep_s: float = 900.0, sockets: SocketFolder | None = None) -> None:
        """``groups``: each instance's memory and pids limits, and the end of all its processes
        at its stop (None: unbounded); ``runtime_memory`` and ``pids``: ``bounds_for``'s. A
        worker with ``users`` (root) also gives each instance a private /tmp and /dev/shm.
        ``preload``: the modules spares may import ahead, each only for functions whose code
        imports it, kept ``preload_keep_s`` after the last of them ended. ``sockets``: where
        each instance also listens on a Unix socket named by its id (``dilu.local_sockets``)."""
        self._state_dir = state_dir
        self._sockets = sockets
        bounds = (spares, max(spares, spares_max if spares_max is not None else spares))
        PoolSizer(*bounds)   # checks the bounds now, not at the first pool
        self._preload = tuple(preload)
        self._needs: dict[str, tuple[str, ...]] = {}    # bundle digest -> the preloads its code needs
        self._sandboxes = Sandboxes(users) if users is not None else None
        self._leftovers: Leftovers | None = None    # set by adopt(), at the worker's start
        self.cpu = cpu
        self.groups = groups
        self._limits = (runtime_memory, pids)
        self._bounds_of: dict[str, InstanceBounds] = {}
        self._stream_stall_s = stream_stall_s
        self._python = python or sys.executable
        self._kept_temp = kept_in_temp(platform_paths(self._python))   # the platform, where it lives in /tmp
        # ... and where it lives below a folder others cannot traverse (root's home)
        self._reach = platform_reach(self._python) if users is not None else ()
        self._host = host
        self._advertise = advertise_host or host
        self._base_env = allowed_env(os.environ if base_env is None else base_env, passed_env)
        self._pools = RuntimePools(self._launch, bounds, preload_keep_s)
        if cpu_pool:
            self.prepare_pool({})

    @property
    def shared_dir(self) -> Path | None:
        """A folder every instance can reach (token-manager sockets), when instances run as
        another user; None when they run as the worker's user."""
        return self._sandboxes.shared if self._sandboxes else None

    def instance_env(self, request: StartInstance, device: DeviceInfo, config_json: str, fd: int,
                     extra_env: dict[str, str] | None = None, instance_key: str = "",
                     home: Path | None = None, user: InstanceUser | None = None, unix_fd: int = -1) -> dict[str, str]:
        env = with_injection({**self._base_env, **(request.spec.get("env") or {})}, extra_env)
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
        if unix_fd >= 0:
            env[protocol.ENV_LISTEN_UNIX_FD] = str(unix_fd)
        if home is not None:   # its own HOME, and its temp files in its own /tmp (within its memory)
            env.update({"HOME": str(home), "TMPDIR": "/tmp"})
        if user is not None:
            env.update({"USER": user.name, "LOGNAME": user.name})
        return keeping_freed_memory(env)

    async def start(self, request: StartInstance, device: DeviceInfo, log_path: Path,
                    extra_env: dict[str, str] | None = None, owner: str = "") -> RunningInstance:
        if request.spec.get("image"):
            raise RuntimeError(f"function {request.function} names an image ({request.spec['image']}): "
                               "it needs a worker with the docker runtime (DILU_RUNTIME=docker)")
        key = protocol.new_key()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        user = self._user_of(request)
        if self._leftovers is not None:     # on record before anything of it exists on the host
            self._leftovers.note(request.instance_id, self._sandboxes.root if self._sandboxes else None)
        code, home = await asyncio.to_thread(self._place_code, request, user)
        weights = await asyncio.to_thread(self._place_weights, request, user)
        config_json = self._config_json(request, code, weights, self._stream_stall_s)
        bounds = self._bounds_of[request.instance_id] = self.bounds(request, device)
        procs = self._groups_of(request, device, bounds)
        needed = await asyncio.to_thread(self._preloads_of, request) if self._preload else ()
        spare = self._take_spare(request, extra_env, needed)
        if spare is not None:
            try:
                return self._assign(spare, request, device, config_json, code, home, log_path, extra_env, key, user,
                                    procs, bounds)
            finally:
                self._pools.maintain()
        listener = inheritable_listener(self._host)
        port = listener.getsockname()[1]
        name = socket_name(request.instance_id)
        unix = bind_unix(self._sockets, name) if name else None
        passed = (listener.fileno(),) if unix is None else (listener.fileno(), unix.fileno())
        try:
            with open(log_path, "ab") as log:
                process = subprocess.Popen(
                    [self._python, "-m", "worker.instance"],
                    env=self.instance_env(request, device, config_json, listener.fileno(), extra_env, key, home,
                                          user, unix_fd=passed[1] if unix is not None else -1),
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    pass_fds=passed, start_new_session=True,
                    preexec_fn=_child_setup(procs, user, self._temp_bytes(bounds), self._kept_temp,
                                                        self._reach), cwd=code,
                )
        except (OSError, subprocess.SubprocessError) as exc:
            self._forget_socket(request.instance_id)
            raise RuntimeError(f"cannot start instance process: {exc}") from exc
        finally:
            listener.close()
            if unix is not None:
                unix.close()
        return RunningInstance(endpoint=endpoint_url(self._advertise, port) + protocol.route_prefix(key),
                               pid=process.pid, handle=process, instance_id=request.instance_id)

    def bounds(self, request: StartInstance, device: DeviceInfo) -> InstanceBounds:
        """What bounds the instance (``worker.backends.bounds``)."""
        runtime_memory, pids = self._limits
        return bounds_for(request.memory_bytes, real_gpu=device.kind == "gpu" and not device.fake,
                          runtime_memory=runtime_memory, pids=pids)

    def _temp_bytes(self, bounds: InstanceBounds) -> int | None:
        """The size of the instance's private /tmp and /dev/shm; None: it shares the host's (a
        worker that is not root runs every instance as its own user anyway)."""
        return bounds.tmpfs_bytes if self._sandboxes is not None else None

    def _groups_of(self, request: StartInstance, device: DeviceInfo, bounds: InstanceBounds) -> list[str]:
        """The cgroup.procs files the instance's processes join: its CPU group (a slice on a CPU
        worker; no quota on a GPU, whose token manager slices it) and its memory and pids groups."""
        procs = [self._cpu_group(request, device) or (
            self.cpu.procs_file(request.instance_id) if self.cpu is not None and self.cpu.available else None)]
        if self.groups is not None:
            procs += self.groups.create(request.instance_id, bounds.memory_bytes, bounds.pids)
        return [path for path in procs if path]

    def token_peer(self, request: StartInstance) -> tuple[int | None, str | None]:
        user = self._user_of(request)
        tail = self.groups.path_tail(request.instance_id) if self.groups is not None else None
        return (user.uid if user else os.geteuid()), tail

    def _user_of(self, request: StartInstance) -> InstanceUser | None:
        """The function's own user on this host (None: instances run as the worker's user)."""
        return self._sandboxes.users.user_for(request.function) if self._sandboxes else None

    def _place_code(self, request: StartInstance, user: InstanceUser | None) -> tuple[str, Path | None]:
        """(working folder, HOME or None): the instance's own copy of its code when it runs as
        another user (who cannot reach the worker's folders), else the code where it is."""
        if self._sandboxes is None or user is None:
            return request.source_dir, None
        code, home = self._sandboxes.create(request.instance_id, request.source_dir, user)
        return str(code), home

    def _place_weights(self, request: StartInstance, user: InstanceUser | None) -> str:
        """The weights file as the instance reaches it: linked into its own folder when it runs
        as another user (one inode, so instances still share the host's cached pages)."""
        if not request.weights_path or self._sandboxes is None or user is None:
            return request.weights_path
        return str(self._sandboxes.place_weights(request.instance_id, request.weights_path))

    @staticmethod
    def _config_json(request: StartInstance, source_dir: str, weights: str = "", stream_stall_s: float = 30.0) -> str:
        spec = request.spec
        config = InstanceConfig.for_spec(request.instance_id, request.function, spec, source_dir, weights,
                                         stream_stall_s)
        return json.dumps(asdict(config))

    # ---- runtime pools ----
    def prepare_pool(self, exec_env: dict[str, str]) -> None:
        """Starts the plain pool for instances injected with ``exec_env`` (its exec-time
        variables: none on a CPU device, the shim's on a GPU); idempotent."""
        self._pools.prepare(exec_env)

    def _launch(self, exec_env: dict[str, str], preload: tuple[str, ...]) -> SpareLaunch:
        kind = "cpu" if not exec_env else "injected"
        background = self._background_group()
        return SpareLaunch(name=f"{os.getpid()}-{kind}{'-' + '-'.join(preload) if preload else ''}",
                           python=self._python,
                           env=keeping_freed_memory(preload_env(with_injection(self._base_env, exec_env), preload)),
                           cwd=self._sandboxes.shared if self._sandboxes else self._state_dir,
                           logs=self._state_dir / "logs", host=self._host, advertise=self._advertise,
                           # Pool processes wait in the background group: refilling never slows
                           # serving down; an assigned spare moves to its instance's group and
                           # takes its function's user.
                           preexec=_child_setup([background] if background else [], None),
                           sockets=self._sockets)

    def pool(self, exec_env: dict[str, str] | None = None, preload: tuple[str, ...] = ()) -> SparePool | None:
        """The pool for instances injected with ``exec_env`` (default: plain CPU ones) whose
        code needs ``preload`` (default: none)."""
        return self._pools.get(exec_env, preload)

    def maintain(self) -> None:
        """Periodic: pools shrink back once cold starts have been rare for a while, and a
        preloading pool ends once no instance here has needed it for a while."""
        self._pools.maintain()

    def pool_status(self, exec_env: dict[str, str] | None = None) -> dict | None:
        """What ``dilu status`` shows of the pool instances injected with ``exec_env`` use."""
        return self._pools.status(exec_env)

    def _background_group(self) -> str | None:
        return self.cpu.background_procs_file() if self.cpu and self.cpu.available else None

    def _preloads_of(self, request: StartInstance) -> tuple[str, ...]:
        """The preloadable modules the function's code imports: read once per bundle (its
        digest names its content); a folder deployed by path may change, so it is read each time."""
        needed = self._needs.get(request.bundle) if request.bundle else None
        if needed is None:
            arrays = request.spec.get("arrays")
            needed = preloads_needed(self._preload, imported_modules(python_sources(request.source_dir)),
                                     arrays if isinstance(arrays, str) else None)
            if request.bundle:
                self._needs[request.bundle] = needed
        return needed

    def _take_spare(self, request: StartInstance, extra_env: dict[str, str] | None,
                    needed: tuple[str, ...]) -> Spare | None:
        """A live spare of the instance's kind, when its own environment can be applied late."""
        if exec_time(request.spec.get("env")):
            return None
        return self._pools.take(extra_env, needed, request.instance_id)

    def _assign(self, spare: Spare, request: StartInstance, device: DeviceInfo, config_json: str, code: str,
                home: Path | None, log_path: Path, extra_env: dict[str, str] | None, key: str,
                user: InstanceUser | None, procs: list[str], bounds: InstanceBounds) -> RunningInstance:
        # Out of the background group into the instance's own groups, before anything of the
        # function runs (what the spare already holds stays charged to the pool).
        for procs_file in procs:
            join_group_of(procs_file, spare.process.pid)
        os.replace(spare.log_path, log_path)
        self._name_socket(spare, request.instance_id)
        env = self.instance_env(request, device, config_json, spare.fd, extra_env, key, home, user,
                                unix_fd=spare.unix_fd)
        assignment = {"env": env, "cwd": code, "user": [user.uid, user.gid] if user is not None else None,
                      "private_temp": self._temp_bytes(bounds), "keep_temp": list(self._kept_temp),
                      "reach": [cover.to_json() for cover in self._reach]}
        try:
            spare.process.stdin.write((json.dumps(assignment) + "\n").encode())
            spare.process.stdin.close()
        except OSError as exc:
            raise RuntimeError(f"cannot hand the instance to a spare process: {exc}") from exc
        return RunningInstance(endpoint=spare.endpoint + protocol.route_prefix(key), pid=spare.process.pid,
                               handle=spare.process, instance_id=request.instance_id)

    def _name_socket(self, spare: Spare, instance_id: str) -> None:
        """The spare's Unix socket takes its instance's name, where a gateway looks for it."""
        if spare.socket_file is None or self._sockets is None:
            return
        name = socket_name(instance_id)
        try:
            if name is None:
                raise OSError(f"instance id {instance_id!r} cannot name a socket")
            self._sockets.rename(spare.socket_file, name)
        except OSError as exc:
            log.warning("instance %s is reached over TCP only: %s", instance_id, exc)
            self._sockets.remove(spare.socket_file)
        spare.socket_file = None

    def _forget_socket(self, instance_id: str) -> None:
        name = socket_name(instance_id)
        if self._sockets is not None and name is not None:
            self._sockets.remove(name)

    def close(self) -> None:
        """Ends the pools (instances are stopped by the worker)."""
        self._pools.close()
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
        self._bounds_of.pop(instance_id, None)
        self._pools.ended(instance_id)
        self._forget_socket(instance_id)
        if self.groups is not None:   # nothing of an ended instance outlives it
            self.groups.kill_all(instance_id)
            self.groups.remove(instance_id)
        if self.cpu is not None:
            self.cpu.remove(instance_id)
        if self._sandboxes is not None:
            self._sandboxes.remove(instance_id)
        if self._leftovers is not None:
            self._leftovers.forget(instance_id)

    async def adopt(self, owner: str, log_path: Callable[[str], Path]) -> list[tuple[StartInstance, RunningInstance]]:
        """Nothing to adopt (instance processes die with their worker, PR_SET_PDEATHSIG), but
        what the instances of a killed worker of this id left on the host goes: their cgroups,
        emptied first, and their sandbox folders."""
        self._leftovers = Leftovers(self._state_dir, owner)
        roots = set()
        for instance_id, root in self._leftovers.left():
            self.release(instance_id)
            if root is not None and root != (self._sandboxes.root if self._sandboxes else None):
                shutil.rmtree(root / instance_id, ignore_errors=True)
                roots.add(root)
            log.info("removed what instance %s of a previous worker %s left", instance_id, owner)
        for root in roots:      # a previous worker's whole sandbox root, once no instance is on record in it
            if root.name.startswith(SANDBOX_PREFIX):
                shutil.rmtree(root, ignore_errors=True)
        return []

    def logs(self, running: RunningInstance, lines: int) -> str | None:
        return None

    def exit_code(self, running: RunningInstance) -> int | None:
        return running.handle.poll()

    def exit_reason(self, running: RunningInstance, memory_bytes: int) -> str | None:
        bounds = self._bounds_of.get(running.instance_id)
        if bounds is None or self.groups is None or not self.groups.oom_killed(running.instance_id):
            return None
        return bounds.describe_oom(memory_bytes)

    async def stop(self, running: RunningInstance, grace_s: float) -> None:
        process: subprocess.Popen = running.handle
        if process.poll() is not None:
            return
        signal_group(process.pid, signal.SIGTERM)
        if isinstance(process, subprocess.Popen):
            try:   # a thread waits for the exit, so it is seen the moment it happens
                await asyncio.to_thread(process.wait, grace_s)
            except subprocess.TimeoutExpired:
                pass
        else:      # a zygote's fork: its exit comes as a message, read on this thread only
            loop = asyncio.get_running_loop()
            deadline = loop.time() + grace_s
            while process.poll() is None and loop.time() < deadline:
                await asyncio.sleep(0.01)
        if process.poll() is None:
            signal_group(process.pid, signal.SIGKILL)
            await asyncio.to_thread(process.wait)
        else:
            # Whatever the instance forked must go too.
            signal_group(process.pid, signal.SIGKILL)
        if self.groups is not None and running.instance_id:   # and what left its process group
            await asyncio.to_thread(self.groups.kill_all, running.instance_id)
