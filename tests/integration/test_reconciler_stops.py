"""A reconcile pass that stops an instance: the instance leaves the published routes first, and
its worker is told at once, not after the pass has gone through every other function."""

from __future__ import annotations

import httpx
import pytest

from dilu.controller.reconciler import Reconciler
from dilu.db import repo
from dilu.db.models import InstanceRow, utcnow
from dilu.default_impl import create_scheduler
from dilu.messages import READY, FunctionStatus, InstanceStatus, StartInstance
from dilu.state.memory import MemoryStore
from dilu.worker_client import WorkerDirectory
from tests.builders import make_spec_dict, make_worker
from tests.integration.test_reconciler_starts import HeldStartsWorker

pytestmark = pytest.mark.integration

PINNED = {"memory": "64Mi", "gpu": False, "sm_request": 0.5, "sm_limit": 0.5}   # no profiling


class RecordingWorker(HeldStartsWorker):
    """Notes, in order, each stop it is told (with the routes of that instance's function the
    state store held then) and each start; it takes start orders at once."""

    def __init__(self, store: MemoryStore) -> None:
        super().__init__(store)
        self.release.set()
        self.calls: list[tuple] = []

    async def start_instance(self, request: StartInstance) -> InstanceStatus:
        self.calls.append(("start", request.function))
        return await super().start_instance(request)

    async def stop_instance(self, instance_id: str) -> None:
        function = self.statuses[instance_id].function
        routed = {e.instance_id for e in (await self.store.get_routes()).get(function, [])}
        self.calls.append(("stop", instance_id, routed))
        await super().stop_instance(instance_id)


def _function(sessions, name: str, versions: int = 1) -> None:
    with sessions() as session:
        for version in range(1, versions + 1):
            spec = make_spec_dict(name, resources=PINNED, scaling={"min_instances": 1}, env={"V": str(version)})
            repo.upsert_function(session=session, spec=spec, source_dir="/code")
        repo.set_function_status(session=session, name=name, version=versions, status=FunctionStatus.READY.value)


def _ready_instance(sessions, worker: RecordingWorker, instance_id: str, function: str, version: int) -> None:
    endpoint = f"http://127.0.0.1:9/{instance_id}"
    with sessions() as session:
        repo.create_instance(session=session, row=InstanceRow(
            id=instance_id, function=function, function_version=version, worker_id="w1", state=READY,
            endpoint=endpoint, memory_bytes=64 * 2**20, sm_request=0.5, sm_limit=0.5))
    worker.statuses[instance_id] = InstanceStatus(instance_id, function, version, READY, endpoint=endpoint)


async def test_a_stopped_instance_is_unrouted_then_stopped_before_the_pass_moves_on(sessions) -> None:
    _function(sessions, "fa", versions=2)     # its version-1 instance is replaced: stopped
    _function(sessions, "fb")                 # reconciled after fa: needs a start
    with sessions() as session:
        repo.upsert_workers(session=session, workers=[make_worker("w1")], now=utcnow())
    store = MemoryStore()
    await store.heartbeat(make_worker("w1"), ttl_s=60)
    worker = RecordingWorker(store)
    _ready_instance(sessions, worker, "fa-old", "fa", 1)
    _ready_instance(sessions, worker, "fa-new", "fa", 2)
    async with httpx.AsyncClient() as http:
        directory = WorkerDirectory(http, None)
        directory.register_local("w1", worker)
        reconciler = Reconciler(sessions=sessions, store=store, directory=directory, scheduler=create_scheduler())
        try:
            await reconciler.reconcile_once()
        finally:
            await reconciler.shutdown()
    assert ("stop", "fa-old", {"fa-new"}) in worker.calls, (
        f"fa-old was not stopped after leaving the routes (fa-new staying): {worker.calls}")
    assert worker.calls.index(("stop", "fa-old", {"fa-new"})) < worker.calls.index(("start", "fb")), (
        f"the stop waited for the rest of the pass: {worker.calls}")
    assert {e.instance_id for e in (await store.get_routes())["fa"]} == {"fa-new"}
