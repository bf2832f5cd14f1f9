"""The runtime backend contract."""

from __future__ import annotations

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


class RuntimeBackend(Protocol):
    async def start(self, request: StartInstance, device: DeviceInfo, log_path: Path,
                    extra_env: dict[str, str] | None = None) -> RunningInstance:
        """Starts the instance's runtime server with ``extra_env`` added (the shim's injection);
        returns once it is spawned (not yet ready). Raises RuntimeError with a user-readable
        message if it cannot be spawned."""

    def exit_code(self, running: RunningInstance) -> int | None:
        """The exit status once it has ended (negative: killed by that signal), else None."""

    async def stop(self, running: RunningInstance, grace_s: float) -> None:
        """Asks it to stop, then kills it after ``grace_s``; idempotent."""

    def set_share(self, instance_id: str, share: float | None) -> bool:
        """Resizes the compute share of a running instance where the backend can (CPU quotas);
        False where it cannot."""

    @property
    def enforces_shares(self) -> bool:
        """Whether ``set_share`` can work here at all (a writable cgroup CPU controller)."""

    def release(self, instance_id: str) -> None:
        """Frees what the backend kept for an ended instance; idempotent."""

    def close(self) -> None:
        """Frees what the backend holds for future instances (spare processes); idempotent."""
