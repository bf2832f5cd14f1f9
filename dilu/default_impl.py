"""Factories for the replaceable parts every role shares, chosen by configuration only (the
worker's runtime backend is the worker's own: ``worker.runtime``)."""

from __future__ import annotations

import httpx

from dilu.config import CommonSettings
from dilu.policy.scheduler import Scheduler
from dilu.policy.scheduler import create_scheduler as create_policy_scheduler
from dilu.state.base import StateStore


def create_store(settings: CommonSettings) -> StateStore:
    """Redis when DILU_REDIS_URL is set, else the in-process store."""
    if settings.redis_url:
        from dilu.state.redis_store import RedisStore

        return RedisStore(settings.redis_url, settings.redis_prefix)
    from dilu.state.memory import MemoryStore

    return MemoryStore()


def store_for_another_loop(settings: CommonSettings, store: StateStore) -> StateStore:
    """The state store for code on another event loop of this process: the in-process store
    itself (it is shared, and safe across threads), or a Redis client of its own (a client's
    connections belong to the loop that opened them)."""
    if settings.redis_url:
        return create_store(settings)
    return store


def create_scheduler(name: str = "dilu") -> Scheduler:
    """The placement pipeline for a policy: dilu, exclusive, static-limits or request-only."""
    return create_policy_scheduler(name)


def create_http_client() -> httpx.AsyncClient:
    """The pooled client used to reach instances and workers."""
    return httpx.AsyncClient(limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256),
                             timeout=httpx.Timeout(30.0, connect=5.0))
