"""The controller's record of workers: a worker that went silent is lost, and one that comes
back is alive again at the next pass (worker rows are not rewritten on every pass)."""

from __future__ import annotations

import httpx
import pytest

from dilu.config import ControllerSettings
from dilu.controller.reconciler import Reconciler
from dilu.db import repo
from dilu.default_impl import create_scheduler
from dilu.state.memory import MemoryStore
from dilu.worker_client import WorkerDirectory
from tests.builders import make_worker

pytestmark = pytest.mark.integration


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _states(sessions) -> dict[str, str]:
    with sessions() as session:
        return {w.id: w.state for w in repo.list_workers(session=session)}


async def test_a_lost_worker_that_heartbeats_again_is_alive_at_the_next_pass(sessions) -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    async with httpx.AsyncClient() as http:
        reconciler = Reconciler(sessions=sessions, store=store, directory=WorkerDirectory(http, None),
                                scheduler=create_scheduler(), settings=ControllerSettings(worker_ttl_s=0.001))
        try:
            await store.heartbeat(make_worker("w1"), ttl_s=5)
            await reconciler.reconcile_once()
            assert _states(sessions) == {"w1": "alive"}
            clock.now += 10                      # its heartbeat runs out
            await reconciler.reconcile_once()
            assert _states(sessions) == {"w1": "lost"}
            await store.heartbeat(make_worker("w1"), ttl_s=5)
            await reconciler.reconcile_once()
            assert _states(sessions) == {"w1": "alive"}
        finally:
            await reconciler.shutdown()


class _Idle:
    """An in-process worker running nothing (all the pass asks of it)."""

    async def list_instances(self) -> list:
        return []


async def test_the_controllers_own_in_process_worker_is_never_lost_for_a_late_heartbeat(sessions) -> None:
    """``dilu up`` on a busy host: the worker's heartbeat runs out while the process, and so the
    worker, plainly runs; its instances must not be replaced."""
    clock = Clock()
    store = MemoryStore(clock=clock)
    async with httpx.AsyncClient() as http:
        directory = WorkerDirectory(http, None)
        directory.register_local("w1", _Idle())
        reconciler = Reconciler(sessions=sessions, store=store, directory=directory,
                                scheduler=create_scheduler(), settings=ControllerSettings(worker_ttl_s=0.001))
        try:
            await store.heartbeat(make_worker("w1"), ttl_s=5)
            await reconciler.reconcile_once()
            clock.now += 10                      # its heartbeat runs out
            await reconciler.reconcile_once()
            assert _states(sessions) == {"w1": "alive"}
        finally:
            await reconciler.shutdown()
