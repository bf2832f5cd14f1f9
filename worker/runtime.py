"""A worker's runtime backend, chosen by configuration: how it starts instances, and as whom."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from dilu.config import WorkerSettings, parse_range
from dilu.local_sockets import SocketFolder, open_folder
from worker.backends.base import RuntimeBackend
from worker.reach import describe
from worker.sandbox import (
    interpreter_problem,
    platform_paths,
    platform_reach,
    private_temp_problem,
    runtime_problem,
)
from worker.uids import DEFAULT_REGISTRY, InstanceUser, UidRegistry

log = logging.getLogger(__name__)


def create_backend(settings: WorkerSettings) -> RuntimeBackend:
    """The runtime backend DILU_RUNTIME names: child processes, or Docker containers."""
    if settings.runtime == "process":
        from worker.backends.process import ProcessBackend
        from worker.cgroups import CpuLimiter, InstanceGroups

        if os.geteuid() == 0:
            users = _instance_users(settings)
        else:
            users = None
            if settings.python:
                _check_interpreter(settings.python, "DILU_PYTHON")
        return ProcessBackend(state_dir=settings.home, python=settings.python, host=settings.host,
                              advertise_host=settings.effective_advertise_host, cpu=CpuLimiter(),
                              groups=InstanceGroups(), runtime_memory=settings.instance_runtime_memory,
                              pids=settings.instance_pids, stream_stall_s=settings.stream_stall_s,
                              spares=settings.spare_processes, spares_max=settings.spare_max,
                              preload=tuple(m.strip() for m in settings.spare_preload.split(",") if m.strip()),
                              preload_keep_s=settings.spare_preload_keep_s,
                              users=users, cpu_pool=False,    # each worker agent prepares the pool it needs
                              sockets=_swept(open_folder(settings.instance_sockets_folder)),
                              passed_env=tuple(n.strip() for n in settings.instance_env_pass.split(",") if n.strip()))
    if settings.runtime == "docker":
        from worker.backends.docker import DockerBackend

        return DockerBackend.from_settings(settings)
    raise ValueError(f"unknown runtime {settings.runtime!r}; known: process, docker")


def _swept(sockets: SocketFolder | None) -> SocketFolder | None:
    """The folder, without the sockets of instances an earlier worker on this host left behind."""
    if sockets is not None:
        try:
            sockets.sweep()
        except OSError as exc:
            log.warning("could not sweep %s: %s", sockets.path, exc)
    return sockets


def _unreadable(paths: list[str]) -> list[str]:
    """The folders among ``paths`` and above them that others cannot read or traverse."""
    closed = set()
    for path in paths:
        for folder in (Path(path), *Path(path).parents):
            if folder.is_dir() and (folder.stat().st_mode & 0o005) != 0o005:
                closed.add(str(folder))
    return sorted(closed)


def _check_interpreter(python: str, named: str) -> None:
    """Refuses an instance interpreter that cannot import Dilu's instance runtime, naming that cause."""
    problem = interpreter_problem(python)
    if problem is not None:
        raise RuntimeError(
            f"instances cannot run with {python} ({named}): it cannot import Dilu's instance runtime ({problem}). "
            f"Instances need a Python with Dilu installed: leave DILU_PYTHON unset to use the one running Dilu "
            f"({sys.executable}), or install Dilu into that one")


def _instance_users(settings: WorkerSettings) -> UidRegistry:
    """A root worker's users for instances: one per function, from ``DILU_INSTANCE_UIDS``. Their
    view of the host reaches the worker's Python and Dilu even below a folder others cannot
    traverse (``worker.reach``); a worker whose Python they still cannot run refuses to start
    (instance code never runs as root, and never silently falls back to it)."""
    first, last = parse_range(settings.instance_uids)
    python = settings.python or sys.executable
    _check_interpreter(python, "DILU_PYTHON" if settings.python else "this Python")
    problem = private_temp_problem(python)
    if problem is not None:
        raise RuntimeError(
            "a root worker gives each instance a private /tmp and /dev/shm (a mount namespace of its own), and "
            f"cannot here ({problem}): run it with CAP_SYS_ADMIN, or as a user other than root")
    reach = platform_reach(python)
    problem = runtime_problem(python, InstanceUser(first, first, f"uid {first}"), reach)
    if problem is not None:
        folders = [f for f in _unreadable(platform_paths(python)) if not any(f == c.folder for c in reach)]
        fix = f"`chmod o+rx {' '.join(folders)}`" if folders else "files readable by others"
        raise RuntimeError(
            f"instance code never runs as root, and the unprivileged instance users (uids {first}-{last}) cannot "
            f"start the instance runtime with {python} ({problem}). They need its folders readable ({fix}), "
            "or DILU_PYTHON at an interpreter they can read, or Dilu run as a user other than root")
    if reach:
        log.info("instances run as unprivileged users; in their view %s", describe(reach))
    return UidRegistry(settings.uid_registry or DEFAULT_REGISTRY, (first, last), settings.home)
