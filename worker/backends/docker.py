"""The docker runtime: each instance is a container from the function runtime image.

What every container gets (the contract in ``docs/architecture.md``):
- host networking; the instance binds ``DILU_LISTEN`` (a port the worker picked), since a
  container cannot inherit a socket; its configuration travels inline (``DILU_INSTANCE_CONFIG_JSON``);
- the function's code (an unpacked bundle) bind-mounted read-only at ``/opt/dilu/function``, or
  nothing when the spec names an ``image`` that holds the handler; the host's copy of its
  weights artifact, when it has one, read-only at ``/opt/dilu/weights.safetensors``;
- on a GPU: the GPU requested by UUID (NVIDIA device request), the shim's folder and the token
  manager's socket folder bind-mounted read-only, ``LD_PRELOAD`` pointing at the mounted shim;
- the bounds the process runtime applies too (``worker.backends.bounds``): memory (no swap), pids,
  /tmp and /dev/shm sized at the memory limit; a CPU slice as a CFS quota that
  ``set_share`` changes at run time (``docker update``), so vertical scaling works for CPU
  functions in containers too;
- an unprivileged user, a read-only root filesystem (the tmpfs at /tmp), no capabilities, no
  privilege escalation;
- labels naming the owning worker and the start order, so a restarted worker adopts what is
  still running (containers outlive their worker) and removes what has ended.

Paths handed to the engine are paths on the engine's host: a worker that itself runs in a
container must have its ``DILU_HOME`` bind-mounted at the same path (``docker-compose.yml`` does).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dilu import instance_protocol as protocol
from dilu.config import WorkerSettings
from dilu.instance_protocol import InstanceConfig
from dilu.messages import DeviceInfo, StartInstance
from worker.backends.base import RunningInstance, endpoint_url
from worker.backends.bounds import PIDS, RUNTIME_MEMORY, InstanceBounds, bounds_for
from worker.backends.heap import keeping_freed_memory
from worker.cgroups import PERIOD_US, cfs_quota

log = logging.getLogger(__name__)

LABEL_OWNER = "dev.dilu.worker"
LABEL_INSTANCE = "dev.dilu.instance"
LABEL_FUNCTION = "dev.dilu.function"
LABEL_ENDPOINT = "dev.dilu.endpoint"
LABEL_START = "dev.dilu.start"        # the StartInstance as JSON: what adoption rebuilds from

FUNCTION_DIR = "/opt/dilu/function"
WEIGHTS_FILE = "/opt/dilu/weights.safetensors"
SHIM_DIR = "/opt/dilu/shim"
RUN_DIR = "/run/dilu"
FAKE_DRIVER_DIR = "/opt/dilu/fake-driver"
FAKE_CLOCK = "/opt/dilu/fake-clock"
EXIT_POLL_S = 0.25                   # how stale an instance's "still running" may be


def container_name(instance_id: str) -> str:
    return f"dilu-{instance_id}"


def free_port(host: str) -> int:
    """A port nothing listens on now; the instance binds it a moment later (a lost race makes the
    instance fail to start, and the controller places another)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def signal_exit_code(code: int) -> int:
    """Docker reports a container killed by signal N as 128 + N; the agent's convention is -N."""
    return -(code - 128) if 128 < code < 160 else code


def translate_injection(extra_env: dict[str, str]) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The shim's injection (host paths, as the GPU control writes it for processes) rewritten to
    paths inside the container, with the read-only bind mounts that put them there."""
    env, mounts = dict(extra_env), []

    def mount(source: str, target: str, read_only: bool = True) -> None:
        mounts.append({"source": source, "target": target, "read_only": read_only})

    if "LD_PRELOAD" in env:
        shim = Path(env["LD_PRELOAD"])
        mount(str(shim.parent), SHIM_DIR)
        env["LD_PRELOAD"] = f"{SHIM_DIR}/{shim.name}"
    if "DILU_TOKEN_SOCKET" in env:
        sock = Path(env["DILU_TOKEN_SOCKET"])
        mount(str(sock.parent), RUN_DIR)
        env["DILU_TOKEN_SOCKET"] = f"{RUN_DIR}/{sock.name}"
    if "LD_LIBRARY_PATH" in env:   # the fake driver of a simulated GPU
        mount(env["LD_LIBRARY_PATH"], FAKE_DRIVER_DIR)
        env["LD_LIBRARY_PATH"] = FAKE_DRIVER_DIR
    if "DILU_FAKE_CLOCK" in env:   # the simulated device's clock is shared and written by every user
        mount(env["DILU_FAKE_CLOCK"], FAKE_CLOCK, read_only=False)
        env["DILU_FAKE_CLOCK"] = FAKE_CLOCK
    return env, mounts


class DockerBackend:
    """Implements RuntimeBackend with one container per instance."""

    def __init__(self, *, client: Any, cpu_image: str, gpu_image: str, user: str, host: str,
                 advertise_host: str, read_only: bool = True, cores: int | None = None,
                 users: Any = None, runtime_memory: int = RUNTIME_MEMORY, pids: int = PIDS,
                 stream_stall_s: float = 30.0) -> None:
        self._client = client
        self._stream_stall_s = stream_stall_s
        self._limits = (runtime_memory, pids)
        self._cpu_image = cpu_image
        self._gpu_image = gpu_image
        self._user = user              # uid:gid of every container, unless users gives one per function
        self._users = users            # worker.uids.UidRegistry, or None
        self._host = host
        self._advertise = advertise_host
        self._read_only = read_only
        self._cores = cores or os.cpu_count() or 1
        self._containers: dict[str, Any] = {}        # instance id -> container
        self._log_paths: dict[str, Path] = {}
        self._exit_seen: dict[str, tuple[float, int | None]] = {}
        self._releasing: list[threading.Thread] = []

    @classmethod
    def from_settings(cls, settings: WorkerSettings) -> DockerBackend:
        import docker

        try:
            client = docker.from_env()
            client.ping()
        except docker.errors.DockerException as exc:
            raise RuntimeError(f"the docker runtime needs a Docker engine (DOCKER_HOST or "
                               f"/var/run/docker.sock): {exc}") from None
        users = None
        if settings.docker_user == "auto":   # one uid per function, recorded like the process runtime's
            from dilu.config import parse_range
            from worker.uids import DEFAULT_REGISTRY, UidRegistry

            registry = settings.uid_registry or (DEFAULT_REGISTRY if os.geteuid() == 0
                                                 else settings.home / "instance-uids.json")
            users = UidRegistry(registry, parse_range(settings.instance_uids), settings.home)
        return cls(client=client, cpu_image=settings.docker_image, gpu_image=settings.docker_gpu_image,
                   user=settings.docker_user, host=settings.host, advertise_host=settings.effective_advertise_host,
                   read_only=settings.docker_read_only, users=users, runtime_memory=settings.instance_runtime_memory,
                   pids=settings.instance_pids, stream_stall_s=settings.stream_stall_s)

    def bounds(self, memory_bytes: int, real_gpu: bool = False) -> InstanceBounds:
        """What bounds an instance: the process runtime's numbers (``worker.backends.bounds``)."""
        runtime_memory, pids = self._limits
        return bounds_for(memory_bytes, real_gpu=real_gpu, runtime_memory=runtime_memory, pids=pids)

    def token_peer(self, request: StartInstance) -> tuple[int | None, str | None]:
        """The container's uid where it is a number (a name is resolved inside the image, out of
        reach); its own socket folder is all it can see of the manager either way."""
        uid = self._user_of(request.function).partition(":")[0]
        return (int(uid) if uid.isdigit() else None), None

    def _user_of(self, function: str) -> str:
        if self._users is None:
            return self._user
        user = self._users.user_for(function)
        return f"{user.uid}:{user.gid}"

    # ---- start ----
    async def start(self, request: StartInstance, device: DeviceInfo, log_path: Path,
                    extra_env: dict[str, str] | None = None, owner: str = "") -> RunningInstance:
        port = free_port(self._host)
        key = protocol.new_key()
        endpoint = endpoint_url(self._advertise, port) + protocol.route_prefix(key)
        kwargs = self.run_arguments(request, device, port, {**(extra_env or {}), protocol.ENV_KEY: key})
        kwargs["labels"] = {LABEL_OWNER: owner, LABEL_INSTANCE: request.instance_id,
                            LABEL_FUNCTION: request.function, LABEL_ENDPOINT: endpoint,
                            LABEL_START: json.dumps(request.to_dict(), separators=(",", ":"))}
        try:
            container = await asyncio.to_thread(self._run, kwargs)
        except Exception as exc:  # noqa: BLE001 - the SDK raises several types; all mean "could not start"
            raise RuntimeError(f"cannot start the instance's container: {_short(exc)}") from None
        self._containers[request.instance_id] = container
        self._log_paths[request.instance_id] = log_path
        return RunningInstance(endpoint=endpoint, pid=None, handle=container, instance_id=request.instance_id)

    def _run(self, kwargs: dict[str, Any]) -> Any:
        import docker

        name = kwargs["name"]
        try:   # a container left by an earlier attempt under this name (a start order retried)
            self._client.containers.get(name).remove(force=True)
        except docker.errors.NotFound:
            pass
        return self._client.containers.run(**kwargs)

    def run_arguments(self, request: StartInstance, device: DeviceInfo, port: int,
                      extra_env: dict[str, str]) -> dict[str, Any]:
        """The ``containers.run`` keyword arguments of an instance (pure: unit-tested)."""
        import docker

        spec = request.spec
        image = spec.get("image") or (self._gpu_image if device.kind == "gpu" and not device.fake else self._cpu_image)
        injected, mounts = translate_injection(extra_env)
        code_dir = "" if spec.get("image") else FUNCTION_DIR
        if code_dir:
            mounts.append({"source": request.source_dir, "target": FUNCTION_DIR, "read_only": True})
        weights = WEIGHTS_FILE if request.weights_path else ""
        if weights:
            mounts.append({"source": request.weights_path, "target": WEIGHTS_FILE, "read_only": True})
        config = InstanceConfig.for_spec(request.instance_id, request.function, spec, code_dir, weights,
                                         self._stream_stall_s)
        env = dict(spec.get("env") or {})
        env.update(injected)
        env.update({
            protocol.ENV_CONFIG_JSON: json.dumps(asdict(config)),
            protocol.ENV_LISTEN: f"{self._host}:{port}",
            protocol.ENV_INSTANCE_ID: request.instance_id,
            protocol.ENV_FUNCTION: request.function,
            protocol.ENV_DEVICE: "cuda" if device.kind == "gpu" else "cpu",
            "HOME": "/tmp", "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1",
        })
        if device.kind != "gpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
        env = keeping_freed_memory(env)
        bounds = self.bounds(request.memory_bytes, real_gpu=device.kind == "gpu" and not device.fake)
        tmpfs = {"/tmp": f"rw,nosuid,nodev,size={bounds.tmpfs_bytes}"}
        kwargs: dict[str, Any] = dict(
            image=image, command=["python", "-m", "worker.instance"], name=container_name(request.instance_id),
            detach=True, network_mode="host", user=self._user_of(request.function), environment=env,
            working_dir=code_dir or None, read_only=self._read_only, tmpfs=tmpfs if self._read_only else None,
            cap_drop=["ALL"], security_opt=["no-new-privileges"], mem_limit=bounds.memory_bytes,
            memswap_limit=bounds.memory_bytes, pids_limit=bounds.pids, shm_size=bounds.tmpfs_bytes, init=True,
            mounts=[docker.types.Mount(m["target"], m["source"], type="bind", read_only=m["read_only"])
                    for m in mounts])
        if device.kind == "gpu" and not device.fake and device.uuid:
            kwargs["device_requests"] = [docker.types.DeviceRequest(device_ids=[device.uuid], capabilities=[["gpu"]])]
        return {key: value for key, value in kwargs.items() if value is not None}

    # ---- adoption ----
    async def adopt(self, owner: str, log_path: Callable[[str], Path]) -> list[tuple[StartInstance, RunningInstance]]:
        return await asyncio.to_thread(self._adopt, owner, log_path)

    def _adopt(self, owner: str, log_path: Callable[[str], Path]) -> list[tuple[StartInstance, RunningInstance]]:
        adopted = []
        for container in self._client.containers.list(all=True, filters={"label": f"{LABEL_OWNER}={owner}"}):
            labels = container.labels
            try:
                request = StartInstance.from_dict(json.loads(labels[LABEL_START]))
            except (KeyError, TypeError, ValueError):
                request = None
            if container.status != "running" or request is None:
                log.info("removing ended container %s of %s", container.name, owner)
                _quietly(container.remove, force=True)
                continue
            self._containers[request.instance_id] = container
            self._log_paths[request.instance_id] = log_path(request.instance_id)
            adopted.append((request, RunningInstance(endpoint=labels[LABEL_ENDPOINT], pid=None, handle=container)))
        return adopted

    # ---- watching ----
    def exit_reason(self, running: RunningInstance, memory_bytes: int) -> str | None:
        attrs = running.handle.attrs    # as the last exit_code read them
        if not attrs.get("State", {}).get("OOMKilled"):
            return None
        limit = int(attrs.get("HostConfig", {}).get("Memory") or self.bounds(memory_bytes).memory_bytes)
        return InstanceBounds(limit, 0, limit).describe_oom(memory_bytes)

    def exit_code(self, running: RunningInstance) -> int | None:
        import docker

        container = running.handle
        seen_at, code = self._exit_seen.get(container.id, (0.0, None))
        if code is not None or time.monotonic() - seen_at < EXIT_POLL_S:
            return code
        try:
            container.reload()
            state = container.attrs.get("State", {})
            if state.get("Status") in ("exited", "dead"):
                code = signal_exit_code(int(state.get("ExitCode", -9)))
        except docker.errors.NotFound:
            code = -9   # removed from outside (docker rm -f)
        except docker.errors.DockerException as exc:
            log.warning("cannot inspect %s: %s", container.name, _short(exc))
        self._exit_seen[container.id] = (time.monotonic(), code)
        return code

    def logs(self, running: RunningInstance, lines: int) -> str | None:
        import docker

        try:
            return running.handle.logs(tail=lines if lines > 0 else "all").decode("utf-8", errors="replace")
        except docker.errors.DockerException:
            return None

    # ---- stopping ----
    async def stop(self, running: RunningInstance, grace_s: float) -> None:
        import docker

        try:
            await asyncio.to_thread(running.handle.stop, timeout=max(0, int(round(grace_s))))
        except docker.errors.NotFound:
            pass
        except docker.errors.DockerException as exc:
            log.warning("stopping %s: %s", running.handle.name, _short(exc))

    def maintain(self) -> None:
        pass   # containers start from their image; no pool of pre-started runtimes

    def prepare_pool(self, exec_env: dict[str, str]) -> None:
        pass   # nor a pool to prepare

    def pool_status(self, exec_env: dict[str, str] | None = None) -> None:
        return None

    @property
    def shared_dir(self) -> None:
        return None   # the sockets' folder is mounted into each container

    def release(self, instance_id: str) -> None:
        """Keeps the ended container's output in the worker's log file, then removes it (in the
        background: the engine's answers must not hold up the agent's loop)."""
        container = self._containers.pop(instance_id, None)
        log_path = self._log_paths.pop(instance_id, None)
        if container is None:
            return
        self._exit_seen.pop(container.id, None)

        def keep_logs_and_remove() -> None:
            if log_path is not None:
                try:
                    output = container.logs()
                    log_path.parent.mkdir(parents=True, exist_ok=True)
                    log_path.write_bytes(output)
                except Exception as exc:  # noqa: BLE001 - the container may be gone already
                    log.debug("no logs kept for %s: %s", instance_id, exc)
            _quietly(container.remove, force=True)

        thread = threading.Thread(target=keep_logs_and_remove, name=f"release-{instance_id}", daemon=True)
        self._releasing = [t for t in self._releasing if t.is_alive()] + [thread]
        thread.start()

    # ---- vertical scaling of CPU instances ----
    def set_share(self, instance_id: str, share: float | None) -> bool:
        container = self._containers.get(instance_id)
        if container is None:
            return False
        quota = cfs_quota(share, self._cores)
        try:
            container.update(cpu_period=PERIOD_US, cpu_quota=-1 if quota is None else quota)
        except Exception as exc:  # noqa: BLE001 - any engine failure: the quota stays, said in the log
            log.warning("cannot set the CPU quota of %s: %s", container.name, _short(exc))
            return False
        return True

    @property
    def enforces_shares(self) -> bool:
        return True

    def close(self) -> None:
        """Waits for ended containers to be removed (containers still running are the worker's
        to stop, or are left for a successor to adopt)."""
        for thread in self._releasing:
            thread.join(timeout=15)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:400] if text else type(exc).__name__


def _quietly(call: Callable[..., object], **kwargs: Any) -> None:
    try:
        call(**kwargs)
    except Exception as exc:  # noqa: BLE001 - best effort clean-up
        log.debug("ignored: %s", exc)
