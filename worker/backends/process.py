"""The process runtime: each instance is a child process with its own port, environment and log.

The worker binds the instance's listening socket itself and passes it down (``pass_fds``), so
ports are never raced for and a dead instance's port refuses connections at once.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

from dilu import instance_protocol as protocol
from dilu.instance_protocol import InstanceConfig
from dilu.messages import DeviceInfo, StartInstance
from worker.cgroups import CpuLimiter, join_group
from worker.backends.base import RunningInstance

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Instances must not outlive a worker that is killed with SIGKILL.
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def _child_setup(procs_file: str | None):  # noqa: ANN202
    def setup() -> None:
        _die_with_parent()
        join_group(procs_file)

    return setup


class ProcessBackend:
    """Implements RuntimeBackend with local child processes."""

    def __init__(self, *, state_dir: Path, python: str | None = None, host: str = "127.0.0.1",
                 base_env: dict[str, str] | None = None, cpu: CpuLimiter | None = None) -> None:
        self._state_dir = state_dir
        self.cpu = cpu
        self._python = python or sys.executable
        self._host = host
        self._base_env = dict(os.environ if base_env is None else base_env)

    def instance_env(self, request: StartInstance, device: DeviceInfo, config_path: Path, fd: int,
                     extra_env: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(self._base_env)
        env.update(request.spec.get("env") or {})
        for key, value in (extra_env or {}).items():
            # Search paths are prepended to what the worker had, not replacing it.
            if key in ("LD_LIBRARY_PATH", "LD_PRELOAD") and env.get(key):
                separator = ":" if key == "LD_LIBRARY_PATH" else " "
                value = f"{value}{separator}{env[key]}"
            env[key] = value
        env.update({
            protocol.ENV_CONFIG: str(config_path),
            protocol.ENV_LISTEN_FD: str(fd),
            protocol.ENV_INSTANCE_ID: request.instance_id,
            protocol.ENV_FUNCTION: request.function,
            protocol.ENV_DEVICE: "cuda" if device.kind == "gpu" else "cpu",
            # Keyed by UUID so the instance sees exactly its GPU (or none on a CPU worker).
            "CUDA_VISIBLE_DEVICES": device.uuid if device.kind == "gpu" and device.uuid else "",
            "PYTHONUNBUFFERED": "1",
        })
        return env

    async def start(self, request: StartInstance, device: DeviceInfo, log_path: Path,
                    extra_env: dict[str, str] | None = None) -> RunningInstance:
        spec = request.spec
        config = InstanceConfig(
            instance_id=request.instance_id, function=request.function, handler=spec["handler"],
            source_dir=request.source_dir, options=spec.get("model") or {},
            max_batch_size=spec["batching"]["max_batch_size"], max_wait_ms=spec["batching"]["max_wait_ms"])
        config_dir = self._state_dir / "instances"
        config_dir.mkdir(parents=True, exist_ok=True)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        config_path = config_dir / f"{request.instance_id}.json"
        config_path.write_text(json.dumps(asdict(config)), encoding="utf-8")

        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self._host, 0))
        listener.listen(1024)
        listener.set_inheritable(True)
        port = listener.getsockname()[1]
        try:
            with open(log_path, "ab") as log:
                process = subprocess.Popen(
                    [self._python, "-m", "worker.instance"],
                    env=self.instance_env(request, device, config_path, listener.fileno(), extra_env),
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    pass_fds=(listener.fileno(),), start_new_session=True,
                    preexec_fn=_child_setup(self._cpu_group(request, device)), cwd=request.source_dir,
                )
        except OSError as exc:
            raise RuntimeError(f"cannot start instance process: {exc}") from exc
        finally:
            listener.close()
        return RunningInstance(endpoint=f"http://{self._host}:{port}", pid=process.pid, handle=process)

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


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
