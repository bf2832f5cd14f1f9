"""The runtime backend contract."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from dilu.messages import DeviceInfo, StartInstance


@dataclass
class RunningInstance:
    """A started instance: where it listens and the backend's own handle."""

    endpoint: str
    pid: int | None
    handle: Any
    instance_id: str = ""


def inheritable_listener(host: str) -> socket.socket:
    """A listening TCP socket on a free port of ``host``, to hand down to a child process."""
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, 0))
    listener.listen(1024)
    listener.set_inheritable(True)
    return listener


def signal_group(pid: int, sig: int) -> None:
    """Sends ``sig`` to the process group led by ``pid`` (an instance and whatever it forked)."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def endpoint_url(host: str, port: int) -> str:
    """``http://host:port``, with IPv6 literals bracketed."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class RuntimeBackend(Protocol):
    async def start(self, request: StartInstance, device: DeviceInfo, log_path: Path,
                    extra_env: dict[str, str] | None = None, owner: str = "") -> RunningInstance:
        """Starts the instance's runtime server with ``extra_env`` added (the shim's injection);
        returns once it is spawned (not yet ready). ``owner`` is the worker's id, recorded where
        the instance can outlive the worker (containers) so a restarted worker adopts it. Raises
        RuntimeError with a user-readable message if it cannot be spawned."""

    async def adopt(self, owner: str, log_path: Callable[[str], Path]) -> list[tuple[StartInstance, RunningInstance]]:
        """The instances a previous run of worker ``owner`` left running (containers survive
        their worker); ended ones are removed. ``log_path(instance_id)`` is where each one's
        output is kept once it ends. Backends whose instances die with the worker
        return nothing."""

    def logs(self, running: RunningInstance, lines: int) -> str | None:
        """The instance's last output lines where the backend keeps it (container logs); None
        when it is in the worker's log file."""

    def exit_code(self, running: RunningInstance) -> int | None:
        """The exit status once it has ended (negative: killed by that signal), else None."""

    def exit_reason(self, running: RunningInstance, memory_bytes: int) -> str | None:
        """Why an ended instance ended, where the runtime knows better than its exit status (the
        kernel killed it at its memory limit); None: the exit status says it."""

    async def stop(self, running: RunningInstance, grace_s: float) -> None:
        """Asks it to stop, then kills it after ``grace_s``; idempotent."""

    def token_peer(self, request: StartInstance) -> tuple[int | None, str | None]:
        """Who the instance's processes are, for its GPU's token manager (``worker.tokens.peers``):
        their uid (None: not known here) and how their cgroup path ends (None: no group)."""

    def set_share(self, instance_id: str, share: float | None) -> bool:
        """Resizes the compute share of a running instance where the backend can (CPU quotas);
        False where it cannot."""

    @property
    def enforces_shares(self) -> bool:
        """Whether ``set_share`` can work here at all (a writable cgroup CPU controller)."""

    def release(self, instance_id: str) -> None:
        """Frees what the backend kept for an ended instance; idempotent."""

    @property
    def shared_dir(self) -> Path | None:
        """A folder its instances can all reach, for the token-manager sockets, when they cannot
        reach the worker's home (instances running as another user); None: the home will do."""

    def close(self) -> None:
        """Frees what the backend holds for future instances (spare processes); idempotent."""

    def maintain(self) -> None:
        """Periodic upkeep (the runtime pool's size); cheap."""

    def prepare_pool(self, exec_env: dict[str, str]) -> None:
        """Starts the runtime pool for instances injected with ``exec_env`` (what must be set
        when the process starts: the GPU shim's preload), where the backend keeps pools."""

    def pool_status(self, exec_env: dict[str, str] | None = None) -> dict | None:
        """The runtime pool instances injected with ``exec_env`` use (spares, target, min, max,
        preloaded modules, zygote); None without one."""
