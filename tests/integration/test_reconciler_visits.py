"""The reconcile pass visits only functions where something may be decided: an idle function
(scaled to zero, no traffic, nothing pending) waits for the next resync, and demand for it is
reconciled at the next pass, without waiting for one; an event wakes the pass that reconciles
its function."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time

import httpx
import pytest

from dilu.config import ControllerSettings
from dilu.controller.reconciler import Reconciler
from dilu.db import repo
from dilu.db.models import utcnow
from dilu.default_impl import create_scheduler
from dilu.messages import READY, FunctionStatus
from dilu.state.base import Channel
from dilu.state.memory import MemoryStore
from dilu.worker_client import WorkerDirectory
from tests.builders import make_spec_dict, make_worker
from tests.integration.test_reconciler_starts import HeldStartsWorker
from tests.waiting import async_eventually

pytestmark = pytest.mark.integration

PINNED = {"memory": "64Mi", "gpu": False, "sm_request": 0.1, "sm_limit": 0.1}   # no profiling


def _ready_function(sessions, name: str, min_instances: int) -> None:
    with sessions() as session:
        repo.upsert_function(session=session, spec=make_spec_dict(name, resources=PINNED,
                                                                  scaling={"min_instances": min_instances}),
                             source_dir="/code")
        repo.set_function_status(session=session, name=name, version=1, status=FunctionStatus.READY.value)


async def _one_worker(sessions) -> tuple[MemoryStore, HeldStartsWorker]:
    """A live worker "w1" that starts what it is told at once (its instances stay starting)."""
    with sessions() as session:
        repo.upsert_workers(session=session, workers=[make_worker("w1")], now=utcnow())
    store = MemoryStore()
    await store.heartbeat(make_worker("w1"), ttl_s=60)
    worker = HeldStartsWorker(store)
    worker.release.set()
    return store, worker


async def test_an_idle_function_waits_for_the_resync_and_demand_is_reconciled_at_once(sessions) -> None:
    for index in range(20):
        _ready_function(sessions, f"idle-{index:02d}", min_instances=0)
    _ready_function(sessions, "held", min_instances=1)        # must hold an instance: visited every pass
    store, worker = await _one_worker(sessions)
    async with httpx.AsyncClient() as http:
        directory = WorkerDirectory(http, None)
        directory.register_local("w1", worker)
        reconciler = Reconciler(sessions=sessions, store=store, directory=directory, scheduler=create_scheduler(),
                                settings=ControllerSettings(resync_interval_s=3600))
        try:
            for _ in range(4):
                await reconciler.reconcile_once()
            assert reconciler.visits["held"] == 4 and not reconciler.quiet    # its instance is still starting
            for instance_id, status in list(worker.statuses.items()):
                worker.statuses[instance_id] = dataclasses.replace(status, state=READY)
            await reconciler.reconcile_once()     # folds it ready (an event: it acted)
            await reconciler.reconcile_once()
            assert reconciler.quiet        # its instance runs, nothing else happens: the loop may slow down
            assert all(reconciler.visits[f"idle-{index:02d}"] == 1 for index in range(20))   # the first pass's resync
            # A request waits for idle-07 (scale from zero): the next pass reconciles it and starts an instance.
            await store.report_activity("gw", {"idle-07": {"in_flight": 0, "queued": 1, "last_request_at": None}},
                                        {}, ttl_s=60)
            await reconciler.reconcile_once()
            assert reconciler.visits["idle-07"] == 2 and reconciler.visits["idle-08"] == 1
            assert not reconciler.quiet    # it started an instance for the request
            with sessions() as session:
                started = repo.list_instances(session=session, function="idle-07", active_only=True)
            assert len(started) == 1
            # A timer (keep-alive's pre-warm of a function it unloaded) brings its function up
            # when it is due, not before, though nothing else happens to it.
            reconciler.functions.recheck_at.update({"idle-05": time.time() + 3600, "idle-06": time.time() - 0.1})
            await reconciler.reconcile_once()
            assert reconciler.visits["idle-05"] == 1 and reconciler.visits["idle-06"] == 2
            assert "idle-06" not in reconciler.functions.recheck_at      # decided again: nothing more due
        finally:
            await reconciler.shutdown()


async def test_an_event_wakes_the_pass_that_reconciles_its_function(sessions) -> None:
    """With a pass interval and a resync far away, only events start passes: a redeploy that
    asks idle-03 to hold an instance is reconciled by the pass its event wakes (an instance
    starts), and the functions it does not name are not visited."""
    for index in range(10):
        _ready_function(sessions, f"idle-{index:02d}", min_instances=0)
    store, worker = await _one_worker(sessions)

    async def started() -> bool:
        with sessions() as session:
            return bool(repo.list_instances(session=session, function="idle-03", active_only=True))

    async with httpx.AsyncClient() as http:
        directory = WorkerDirectory(http, None)
        directory.register_local("w1", worker)
        reconciler = Reconciler(sessions=sessions, store=store, directory=directory, scheduler=create_scheduler(),
                                settings=ControllerSettings(reconcile_interval_s=3600, resync_interval_s=3600))
        loop = asyncio.create_task(reconciler.run())
        try:
            async def first_pass_done() -> bool:
                return reconciler.visits.get("idle-09") == 1
            await async_eventually(first_pass_done, timeout=30, what="the first pass")
            with sessions() as session:
                repo.upsert_function(session=session, spec=make_spec_dict("idle-03", resources=PINNED,
                                                                          scaling={"min_instances": 1}),
                                     source_dir="/code")
                repo.set_function_status(session=session, name="idle-03", version=2,
                                         status=FunctionStatus.READY.value)
            await store.publish(Channel.FUNCTIONS, {"function": "idle-03"})
            await async_eventually(started, timeout=30, what="idle-03's instance, started by its event's pass")
            assert reconciler.visits["idle-03"] >= 2
            assert all(reconciler.visits[f"idle-{index:02d}"] == 1 for index in range(10) if index != 3)
        finally:
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop
            await reconciler.shutdown()
