"""CPU slices for instances on CPU workers: all cgroup file writes live here.

A CPU worker's "compute share" is a share of the host's cores, enforced by a CFS quota: cgroup
v2 ``cpu.max`` where the unified hierarchy has the cpu controller, else cgroup v1
``cpu.cfs_quota_us``. Each instance gets its own group under ``dilu/``; without a writable
cgroup the limiter reports itself unavailable and instances run unlimited.
"""

from __future__ import annotations

import logging
import os
import time
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


def writable_group(path: Path) -> bool:
    """Whether this process can make groups in ``path`` (made here when missing). A group an
    earlier worker made as root exists for every user, writable or not: existing is not enough."""
    try:
        path.mkdir(exist_ok=True)
    except OSError:
        return False
    return os.access(path, os.W_OK | os.X_OK)


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
        if (ROOT_V1 / "cpu.cfs_quota_us").exists() and writable_group(ROOT_V1 / "dilu"):
            return 1, ROOT_V1 / "dilu"
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


# ---- memory, pids and every process of an instance ----
V1_FENCES = ("memory", "pids", "freezer")
KILL_ROUNDS = 200     # rounds of 10 ms: a group that still holds live processes then is reported


def _own_v1_path(controller: str) -> str:
    """This process's group in a v1 hierarchy ('/' at the root): instances nest below it, so
    they stay within whatever bounds the worker itself was given."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, names, path = line.split(":", 2)
            if controller in names.split(","):
                return path
    except OSError:
        pass
    return "/"


class InstanceGroups:
    """Per instance: a memory limit, a pids limit, and a way to end every process in it.

    cgroup v2: one group under ``<root>/dilu/`` with the memory and pids controllers, ended by
    ``cgroup.kill``. cgroup v1: a group in each of the memory, pids and freezer hierarchies (below
    the worker's own group), ended by freezing it, killing what it holds and thawing it, so a
    process forking meanwhile cannot slip out. ``available`` names the controllers in use; with
    none, instances run unbounded (a worker that cannot write cgroups) and the worker says so."""

    def __init__(self, base: Path | None = None, version: int | None = None,
                 v1_bases: dict[str, Path] | None = None) -> None:
        self.version, self.base, self.v1 = (version, base, v1_bases or {}) if (base or v1_bases) else self._detect()
        self.available = frozenset(("memory", "pids", "kill") if self.version == 2 else
                                   self.v1.keys() | ({"kill"} if "freezer" in self.v1 else set()))
        if not self.available:
            log.warning("no writable cgroup memory or pids controller: instances run without memory and "
                        "process limits")

    @staticmethod
    def _detect() -> tuple[int | None, Path | None, dict[str, Path]]:
        for root in ROOTS_V2:
            controllers = root / "cgroup.controllers"
            if controllers.exists() and {"memory", "pids"} <= set(controllers.read_text().split()):
                base = root / "dilu"
                try:
                    base.mkdir(exist_ok=True)
                    (root / "cgroup.subtree_control").write_text("+memory +pids")
                    (base / "cgroup.subtree_control").write_text("+memory +pids")
                    return 2, base, {}
                except OSError:
                    continue
        bases = {}
        for controller in V1_FENCES:
            root = Path("/sys/fs/cgroup") / controller
            if not (root / "cgroup.procs").exists():
                continue
            base = root / _own_v1_path(controller).lstrip("/") / "dilu"
            if writable_group(base):
                bases[controller] = base
        return (1 if bases else None), None, bases

    def _groups(self, instance_id: str) -> list[Path]:
        if self.version == 2:
            return [self.base / instance_id]
        return [base / instance_id for base in self.v1.values()]

    def path_tail(self, instance_id: str) -> str | None:
        """How the instance's group path ends in /proc/<pid>/cgroup (None: instances are not
        cgroups here): the token manager's proof that a caller is one of its processes."""
        return f"dilu/{instance_id}" if self.available else None

    def create(self, instance_id: str, memory_bytes: int, pids: int) -> list[str]:
        """Makes the instance's groups with their limits (idempotent); returns the ``cgroup.procs``
        files a process writes its pid to, to join them."""
        if not self.available:
            return []
        for path in self._groups(instance_id):
            path.mkdir(exist_ok=True)
        if self.version == 2:
            group = self.base / instance_id
            _write(group / "memory.max", str(memory_bytes))
            _write(group / "memory.swap.max", "0", required=False)
            _write(group / "pids.max", str(pids))
        else:
            if "memory" in self.v1:
                group = self.v1["memory"] / instance_id
                _write(group / "memory.limit_in_bytes", str(memory_bytes))
                # With swap accounting, memory plus swap: the limit is not escaped by swapping.
                _write(group / "memory.memsw.limit_in_bytes", str(memory_bytes), required=False)
            if "pids" in self.v1:
                _write(self.v1["pids"] / instance_id / "pids.max", str(pids))
        return [str(path / "cgroup.procs") for path in self._groups(instance_id)]

    def oom_killed(self, instance_id: str) -> bool:
        """Whether the kernel killed a process of the instance for passing its memory limit."""
        if "memory" not in self.available:
            return False
        events = (self.base / instance_id / "memory.events") if self.version == 2 else \
            (self.v1["memory"] / instance_id / "memory.oom_control")
        try:
            for line in events.read_text().splitlines():
                name, _, count = line.partition(" ")
                if name == "oom_kill" and int(count) > 0:
                    return True
        except (OSError, ValueError):
            pass
        return False

    def pids(self, instance_id: str) -> list[int]:
        """Every live process in the instance's groups now (not the zombies its killed leave)."""
        found: set[int] = set()
        for path in self._groups(instance_id):
            try:
                found.update(int(pid) for pid in (path / "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                pass
        return sorted(pid for pid in found if _alive(pid))

    def kill_all(self, instance_id: str) -> None:
        """Ends every process of the instance, those that left its process group and session
        too (a double-forked daemon); returns once none is left, or after saying why not."""
        if "kill" not in self.available:
            return
        if self.version == 2:
            _write(self.base / instance_id / "cgroup.kill", "1", required=False)
            return
        freezer = self.v1["freezer"] / instance_id
        if not freezer.exists():
            return
        for _ in range(KILL_ROUNDS):
            pids = self.pids(instance_id)
            if not pids:
                return
            _write(freezer / "freezer.state", "FROZEN", required=False)
            for pid in self.pids(instance_id):   # read again frozen: nothing forks past this list
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
            _write(freezer / "freezer.state", "THAWED", required=False)   # the killed run to their end
            time.sleep(0.01)
        log.warning("instance %s: processes still left after %d kill rounds: %s", instance_id, KILL_ROUNDS,
                    self.pids(instance_id))

    def remove(self, instance_id: str) -> None:
        """Removes the instance's groups (once empty: call ``kill_all`` first)."""
        for path in self._groups(instance_id):
            try:
                path.rmdir()
            except OSError:
                pass  # a killed process not yet reaped by its parent, or already gone


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _write(path: Path, value: str, required: bool = True) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        if required:
            log.warning("cannot write %s to %s: %s", value, path, exc)


def join_groups(procs_files: list[str]) -> None:
    """Runs in the child before exec: moves it into each of its instance's groups."""
    for procs_file in procs_files:
        join_group(procs_file)
