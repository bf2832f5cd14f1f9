"""A worker's runtime backend, chosen by configuration: how it starts instances, and as whom."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import dilu
from dilu.config import WorkerSettings, parse_range
from worker.backends.base import RuntimeBackend
from worker.sandbox import private_temp_problem, runtime_problem
from worker.uids import DEFAULT_REGISTRY, InstanceUser, UidRegistry


def create_backend(settings: WorkerSettings) -> RuntimeBackend:
    """The runtime backend DILU_RUNTIME names: child processes, or Docker containers."""
    if settings.runtime == "process":
        from worker.backends.process import ProcessBackend
        from worker.cgroups import CpuLimiter, InstanceGroups

        users = _instance_users(settings) if os.geteuid() == 0 else None
        return ProcessBackend(state_dir=settings.home, python=settings.python, host=settings.host,
                              advertise_host=settings.effective_advertise_host, cpu=CpuLimiter(),
                              groups=InstanceGroups(), runtime_memory=settings.instance_runtime_memory,
                              pids=settings.instance_pids, stream_stall_s=settings.stream_stall_s,
                              spares=settings.spare_processes, spares_max=settings.spare_max,
                              preload=tuple(m.strip() for m in settings.spare_preload.split(",") if m.strip()),
                              users=users, cpu_pool=False,    # each worker agent prepares the pool it needs
                              passed_env=tuple(n.strip() for n in settings.instance_env_pass.split(",") if n.strip()))
    if settings.runtime == "docker":
        from worker.backends.docker import DockerBackend

        return DockerBackend.from_settings(settings)
    raise ValueError(f"unknown runtime {settings.runtime!r}; known: process, docker")


def _closed_folders(python: str) -> list[str]:
    """The folders above the interpreter, its environment and Dilu that others cannot traverse."""
    targets = (os.path.realpath(python), python, sys.prefix, os.path.dirname(os.path.dirname(dilu.__file__)))
    closed = {str(folder) for target in targets for folder in Path(target).parents
              if folder.is_dir() and not folder.stat().st_mode & 0o001}
    return sorted(closed)


def _instance_users(settings: WorkerSettings) -> UidRegistry:
    """A root worker's users for instances: one per function, from ``DILU_INSTANCE_UIDS``. A
    worker whose Python those users cannot run refuses to start (instance code never runs as
    root, and never silently falls back to it)."""
    first, last = parse_range(settings.instance_uids)
    python = settings.python or sys.executable
    problem = runtime_problem(python, InstanceUser(first, first, f"uid {first}"), Path("/"))
    if problem is not None:
        closed = _closed_folders(python)
        fix = f"`chmod o+x {' '.join(closed)}` opens traversal only" if closed else "make it readable by others"
        raise RuntimeError(
            f"instance code never runs as root, and the unprivileged instance users (uids {first}-{last}) cannot "
            f"start the instance runtime with {python} ({problem}). Let them reach that Python ({fix}), point "
            "DILU_PYTHON at an interpreter they can run, or run Dilu as a user other than root")
    problem = private_temp_problem(python)
    if problem is not None:
        raise RuntimeError(
            "a root worker gives each instance a private /tmp and /dev/shm (a mount namespace of its own), and "
            f"cannot here ({problem}): run it with CAP_SYS_ADMIN, or as a user other than root")
    return UidRegistry(settings.uid_registry or DEFAULT_REGISTRY, (first, last), settings.home)
