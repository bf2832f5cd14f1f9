"""A reconcile pass with instances to start: it publishes the routes of instances that became
ready first, and does not wait on each worker's start order in turn; an instance its worker
reports ready is routed even while a pass is in progress."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from dilu.controller.reconciler import Reconciler
from dilu.db import repo
from dilu.db.models import InstanceRow, utcnow
from dilu.default_impl import create_scheduler
from dilu.messages import READY, STARTING, FunctionStatus, InstanceStatus, StartInstance
from dilu.state.base import Channel
from dilu.state.memory import MemoryStore
from dilu.worker_client import WorkerDirectory
from tests.builders import make_spec_dict, make_worker
from tests.fake_workers import RecordingWorker
from tests.waiting import async_eventually

pytestmark = pytest.mark.integration

PINNED = {"memory": "64Mi", "gpu": False, "sm_request": 0.5, "sm_limit": 0.5}   # no profiling


class HeldStartsWorker(RecordingWorker):
    """A worker whose start orders wait until ``release`` is set; it notes the routes the state
    store held when each order came, and reports the instances it was given (or told of)."""

    def __init__(self, store: MemoryStore) -> None:
        super().__init__()
        self.store = store
        self.release = asyncio.Event()
        self.routes_when_ordered: dict[str, set[str]] = {}

    async def start_instance(self, request: StartInstance) -> InstanceStatus:
        self.routes_when_ordered[request.function] = set(await self.store.get_routes())
        await self.release.wait()
        return await super().start_instance(request)


def _ready_function(sessions, name: str) -> None:
    with sessions() as session:
        repo.upsert_function(session=session, spec=make_spec_dict(name, resources=PINNED,
                                                                  scaling={"min_instances": 1}), source_dir="/code")
        repo.set_function_status(session=session, name=name, version=1, status=FunctionStatus.READY.value)


async def _controller(sessions, http: httpx.AsyncClient) -> tuple[Reconciler, HeldStartsWorker]:
    store = MemoryStore()
    await store.heartbeat(make_worker("w1"), ttl_s=60)
    directory = WorkerDirectory(http, None)
    worker = HeldStartsWorker(store)
    directory.register_local("w1", worker)
    return Reconciler(sessions=sessions, store=store, directory=directory, scheduler=create_scheduler()), worker


async def test_a_pass_does_not_wait_for_the_worker_to_take_a_start_order(sessions) -> None:
    _ready_function(sessions, "fa")
    async with httpx.AsyncClient() as http:
        reconciler, worker = await _controller(sessions, http)
        try:
            await asyncio.wait_for(reconciler.reconcile_once(), timeout=20)   # the worker still holds the order
            with sessions() as session:
                rows = repo.list_instances(session=session, active_only=True)
            assert [(r.function, r.state, r.endpoint) for r in rows] == [("fa", STARTING, None)]
            worker.release.set()

            async def endpoint_known() -> bool:
                with sessions() as session:
                    return repo.list_instances(session=session, active_only=True)[0].endpoint is not None

            await async_eventually(endpoint_known, timeout=20, what="the start order's answer to be recorded")
        finally:
            worker.release.set()
            await reconciler.shutdown()


async def test_an_instance_that_became_ready_is_routable_before_the_pass_starts_others(sessions) -> None:
    _ready_function(sessions, "fa")
    _ready_function(sessions, "fb")
    with sessions() as session:
        repo.upsert_workers(session=session, workers=[make_worker("w1")], now=utcnow())
        repo.create_instance(session=session, row=InstanceRow(id="fb-1", function="fb", function_version=1,
                                                              worker_id="w1", state=STARTING, memory_bytes=64 * 2**20,
                                                              sm_request=0.5, sm_limit=0.5))
    async with httpx.AsyncClient() as http:
        reconciler, worker = await _controller(sessions, http)
        worker.release.set()
        worker.statuses["fb-1"] = InstanceStatus("fb-1", "fb", 1, READY, endpoint="http://127.0.0.1:9/fb-1")
        try:
            await reconciler.reconcile_once()
        finally:
            await reconciler.shutdown()
    assert "fa" in worker.routes_when_ordered, "fa had no instance: the pass should have started one"
    assert "fb" in worker.routes_when_ordered["fa"], "fb's ready instance was not routable yet"


class StuckListingWorker(HeldStartsWorker):
    """A worker whose instance listing hangs until ``release`` is set: a pass that asks it for
    its report stays in progress meanwhile."""

    def __init__(self, store: MemoryStore) -> None:
        super().__init__(store)
        self.listing = asyncio.Event()

    async def list_instances(self) -> list[InstanceStatus]:
        self.listing.set()
        await self.release.wait()
        return list(self.statuses.values())


async def test_an_instance_reported_ready_is_routed_without_waiting_for_the_pass_in_progress(sessions) -> None:
    _ready_function(sessions, "fa")
    with sessions() as session:
        repo.upsert_workers(session=session, workers=[make_worker("w1"), make_worker("w2")], now=utcnow())
        repo.create_instance(session=session, row=InstanceRow(id="fa-1", function="fa", function_version=1,
                                                              worker_id="w1", state=STARTING, memory_bytes=64 * 2**20,
                                                              sm_request=0.5, sm_limit=0.5))
    store = MemoryStore()
    for worker_id in ("w1", "w2"):
        await store.heartbeat(make_worker(worker_id), ttl_s=60)
    async with httpx.AsyncClient() as http:
        directory = WorkerDirectory(http, None)
        ready_worker, stuck_worker = HeldStartsWorker(store), StuckListingWorker(store)
        ready_worker.release.set()
        directory.register_local("w1", ready_worker)
        directory.register_local("w2", stuck_worker)
        reconciler = Reconciler(sessions=sessions, store=store, directory=directory, scheduler=create_scheduler())
        loop = asyncio.create_task(reconciler.run())
        try:
            await asyncio.wait_for(stuck_worker.listing.wait(), timeout=20)   # the first pass is stuck on w2
            ready_worker.statuses["fa-1"] = InstanceStatus("fa-1", "fa", 1, READY, endpoint="http://127.0.0.1:9/fa-1")

            async def routed() -> bool:   # the worker's news, as it publishes it (again, until heard)
                await store.publish(Channel.INSTANCES, {"worker": "w1", "instance": "fa-1", "state": READY})
                return [e.instance_id for e in (await store.get_routes()).get("fa", [])] == ["fa-1"]

            await async_eventually(routed, timeout=20, what="fa-1 to be routed while the pass waits on w2")
            assert not stuck_worker.release.is_set()
            with sessions() as session:
                assert repo.get_instance(session=session, instance_id="fa-1").state == READY
        finally:
            stuck_worker.release.set()
            loop.cancel()
            await asyncio.gather(loop, return_exceptions=True)
            await reconciler.shutdown()
