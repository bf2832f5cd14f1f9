"""CPU slices for instances on CPU workers: all cgroup file writes live here.

A CPU worker's "compute share" is a share of the host's cores, enforced by a CFS quota: cgroup
v2 ``cpu.max`` where the unified hierarchy has the cpu controller, else cgroup v1
``cpu.cfs_quota_us``. Each instance gets its own group under ``dilu/``; without a writable
cgroup the limiter reports itself unavailable and instances run unlimited.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)
PERIOD_US = 100_000
ROOTS_V2 = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
ROOT_V1 = Path("/sys/fs/cgroup/cpu")
BACKGROUND = "background"       # the group of work done ahead of need (never an instance id: those have a dash)


def cfs_quota(share: float | None, cores: int) -> int | None:
    """The CFS quota (per ``PERIOD_US``) that gives ``share`` of ``cores``; None: unlimited.
    One rule for both runtimes (cgroups of processes, ``docker update`` of containers)."""
    return None if share is None or share >= 1.0 else max(1000, int(share * cores * PERIOD_US))


class CpuLimiter:
    """Creates a group per instance and sets its quota; ``available`` says whether it can."""

    def __init__(self, base: Path | None = None, version: int | None = None, cores: int | None = None) -> None:
        self.cores = cores or os.cpu_count() or 1
        self.version, self.base = (version, base) if base is not None else self._detect()
        self.available = self.base is not None
        if not self.available:
            log.warning("no writable cgroup cpu controller: CPU instances run without compute slices")

    @staticmethod
    def _detect() -> tuple[int | None, Path | None]:
        for root in ROOTS_V2:
            controllers = root / "cgroup.controllers"
            if controllers.exists() and "cpu" in controllers.read_text().split():
                base = root / "dilu"
                try:
                    base.mkdir(exist_ok=True)
                    (root / "cgroup.subtree_control").write_text("+cpu")
                    (base / "cgroup.subtree_control").write_text("+cpu")
                    return 2, base
                except OSError:
                    continue
        if (ROOT_V1 / "cpu.cfs_quota_us").exists():
            base = ROOT_V1 / "dilu"
            try:
                base.mkdir(exist_ok=True)
                return 1, base
            except OSError:
                pass
        return None, None

    def group(self, instance_id: str) -> Path | None:
        """Creates the instance's group (idempotent); None when unavailable."""
        if not self.available:
            return None
        path = self.base / instance_id
        path.mkdir(exist_ok=True)
        return path

    def procs_file(self, instance_id: str) -> str | None:
        """Where a process writes its pid to join the instance's group."""
        path = self.group(instance_id)
        return str(path / "cgroup.procs") if path else None

    def background_procs_file(self) -> str | None:
        """A group that gets the CPU only when nothing else wants it (the lowest weight), for
        work done ahead of need (the runtime pool's imports): it must never slow down serving.
        None when unavailable."""
        path = self.group(BACKGROUND)
        if path is None:
            return None
        try:
            if self.version == 2:
                (path / "cpu.weight").write_text("1")
            else:
                (path / "cpu.shares").write_text("2")
        except OSError as exc:
            log.warning("cannot lower the CPU weight of %s: %s", path, exc)
        return str(path / "cgroup.procs")

    def set_share(self, instance_id: str, share: float | None) -> bool:
        """Limits the group to ``share`` of the host's cores (None or >= 1: unlimited)."""
        path = self.group(instance_id)
        if path is None:
            return False
        quota = cfs_quota(share, self.cores)
        if self.version == 2:
            (path / "cpu.max").write_text(f"{quota if quota else 'max'} {PERIOD_US}")
        else:
            (path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (path / "cpu.cfs_quota_us").write_text(str(quota if quota else -1))
        return True

    def share(self, instance_id: str) -> float | None:
        """The group's current share of the host's cores (None: unlimited or no group)."""
        if not self.available or not (self.base / instance_id).exists():
            return None
        path = self.base / instance_id
        if self.version == 2:
            quota, period = (path / "cpu.max").read_text().split()
        else:
            quota, period = (path / "cpu.cfs_quota_us").read_text().strip(), (path / "cpu.cfs_period_us").read_text()
        return None if quota in ("max", "-1") else int(quota) / (int(period) * self.cores)

    def remove(self, instance_id: str) -> None:
        if not self.available:
            return
        try:
            (self.base / instance_id).rmdir()
        except OSError:
            pass  # still has processes (a stop in progress) or already gone


def join_group_of(procs_file: str, pid: int) -> None:
    """Moves a running process (and its threads) into an instance's group."""
    try:
        with open(procs_file, "w") as handle:
            handle.write(str(pid))
    except OSError as exc:
        log.warning("cannot move process %d into %s: %s", pid, procs_file, exc)


def join_group(procs_file: str | None) -> None:
    """Runs in the child before exec: moves it into its instance's group."""
    if procs_file:
        try:
            with open(procs_file, "w") as handle:
                handle.write(str(os.getpid()))
        except OSError:
            pass
