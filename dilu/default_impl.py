"""Factories for the replaceable parts, chosen by configuration only."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

import httpx

from dilu.config import CommonSettings, WorkerSettings
from dilu.messages import DeviceInfo
from dilu.policy.scheduler import Scheduler
from dilu.policy.scheduler import create_scheduler as create_policy_scheduler
from dilu.state.base import StateStore
from worker.backends.base import RuntimeBackend


def create_store(settings: CommonSettings) -> StateStore:
    """Redis when DILU_REDIS_URL is set, else the in-process store."""
    if settings.redis_url:
        from dilu.state.redis_store import RedisStore

        return RedisStore(settings.redis_url, settings.redis_prefix)
    from dilu.state.memory import MemoryStore

    return MemoryStore()


def create_scheduler(name: str = "dilu") -> Scheduler:
    """The placement pipeline for a policy: dilu, exclusive, static-limits or request-only."""
    return create_policy_scheduler(name)


log = logging.getLogger(__name__)


def create_backend(settings: WorkerSettings) -> RuntimeBackend:
    if settings.runtime == "process":
        from worker.backends.process import ProcessBackend

        from worker.cgroups import CpuLimiter

        user = _instance_user(settings) if os.geteuid() == 0 else None
        return ProcessBackend(state_dir=settings.home, python=settings.python, host=settings.host,
                              advertise_host=settings.effective_advertise_host, cpu=CpuLimiter(),
                              spares=settings.spare_processes, spares_max=settings.spare_max,
                              preload=tuple(m.strip() for m in settings.spare_preload.split(",") if m.strip()),
                              user=user, cpu_pool=False)   # each worker agent prepares the pool it needs
    if settings.runtime == "docker":
        from worker.backends.docker import DockerBackend

        return DockerBackend.from_settings(settings)
    raise ValueError(f"unknown runtime {settings.runtime!r}; known: process, docker")


def _instance_user(settings: WorkerSettings):  # noqa: ANN202 - worker.sandbox.InstanceUser | None
    """The user a root worker runs instances as. ``auto`` (the `dilu up` default): ``nobody`` when
    it can start the runtime, else the worker's own user, said loudly; a named user must work."""
    import sys

    from worker.sandbox import resolve_user, runtime_problem

    automatic = settings.instance_user == "auto"
    name = "nobody" if automatic else settings.instance_user
    python = settings.python or sys.executable
    try:
        user = resolve_user(name)
        problem = runtime_problem(python, user, Path("/"))
    except ValueError as exc:
        problem, user = str(exc), None
    if problem is None:
        return user
    fix = (f"make the Python environment ({sys.prefix}, {python}) and Dilu readable by {name!r} (a Python "
           "under /root is not), or name another user in DILU_INSTANCE_USER")
    if not automatic:
        raise RuntimeError(f"instances would run as {name!r}, who cannot start the instance runtime "
                           f"({problem}): {fix}")
    log.warning("INSTANCE CODE RUNS AS ROOT: %r cannot start the instance runtime (%s); to run instances "
                "unprivileged, %s", name, problem, fix)
    return None


def create_http_client() -> httpx.AsyncClient:
    """The pooled client used to reach instances and workers."""
    return httpx.AsyncClient(limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256),
                             timeout=httpx.Timeout(30.0, connect=5.0))


def worker_id(device: DeviceInfo, name: str | None = None) -> str:
    host = name or socket.gethostname()
    if device.kind != "gpu":
        return f"{host}-cpu"
    return f"{host}-{'fakegpu' if device.fake else 'gpu'}{device.index}"
