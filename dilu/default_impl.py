"""Factories for the replaceable parts, chosen by configuration only."""

from __future__ import annotations

import socket

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


def create_backend(settings: WorkerSettings) -> RuntimeBackend:
    if settings.runtime == "process":
        from worker.backends.process import ProcessBackend

        from worker.cgroups import CpuLimiter

        return ProcessBackend(state_dir=settings.home, python=settings.python, host=settings.host,
                              advertise_host=settings.effective_advertise_host, cpu=CpuLimiter(),
                              spares=settings.spare_processes)
    if settings.runtime == "docker":
        from worker.backends.docker import DockerBackend

        return DockerBackend.from_settings(settings)
    raise ValueError(f"unknown runtime {settings.runtime!r}; known: process, docker")


def create_http_client() -> httpx.AsyncClient:
    """The pooled client used to reach instances and workers."""
    return httpx.AsyncClient(limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256),
                             timeout=httpx.Timeout(30.0, connect=5.0))


def worker_id(device: DeviceInfo, name: str | None = None) -> str:
    host = name or socket.gethostname()
    if device.kind != "gpu":
        return f"{host}-cpu"
    return f"{host}-{'fakegpu' if device.fake else 'gpu'}{device.index}"
