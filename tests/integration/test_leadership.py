"""Controllers' leadership on SQLite and PostgreSQL: one leads, a standby takes over a lease that
is no longer renewed, and what the deposed leader still sends is refused (database, workers)."""

from __future__ import annotations

import asyncio
from functools import partial
from pathlib import Path

import httpx
import pytest
from sqlalchemy import update

from dilu.controller.leadership import Leadership, fenced_sessions
from dilu.controller.reconciler import Reconciler
from dilu.db import lease, repo
from dilu.db.engine import make_engine, make_session_factory
from dilu.db.models import InstanceRow, LeaseRow, utcnow
from dilu.default_impl import create_scheduler
from dilu.fencing import TERM_HEADER, Deposed
from dilu.messages import STARTING, STOPPED, DeviceInfo, FunctionStatus, WorkerInfo
from dilu.state.memory import MemoryStore
from dilu.worker_client import WorkerDirectory
from tests.builders import make_spec_dict, make_worker
from tests.fake_workers import RecordingWorker
from tests.waiting import async_eventually
from worker.agent import WorkerAgent
from worker.api import create_worker_api
from worker.backends.process import ProcessBackend
from worker.cgroups import CpuLimiter

TTL_S = 0.6


def _events(sessions) -> list[tuple[str, int | None]]:
    with sessions() as session:
        return [(e.reason, e.term) for e in repo.list_events(session=session)]


async def test_a_standby_takes_over_a_lease_no_longer_renewed_and_the_old_terms_writes_are_refused(sessions) -> None:
    ttl_s = 1.5      # long enough that a renewal on a loaded machine is never late
    first, second = Leadership(sessions, "first", ttl_s), Leadership(sessions, "second", ttl_s)
    old = await first.acquire()
    keeping = asyncio.create_task(first.keep())
    waiting = asyncio.create_task(second.acquire())
    done, _ = await asyncio.wait({waiting}, timeout=2 * ttl_s)     # two leases' worth of renewals
    assert not done, "a standby took the lease while its leader renewed it"
    keeping.cancel()                                                # the leader stops (as if paused)
    new = await asyncio.wait_for(waiting, 10)
    assert new == old + 1

    refused: list[bool] = []
    with fenced_sessions(sessions, old, lambda: refused.append(True))() as session, pytest.raises(Deposed) as late:
        repo.record_event(session=session, function="f", action="scale-up", reason="late", term=old)
    assert refused and f"term {old}" in str(late.value) and f"term {new} leads now" in str(late.value)
    with fenced_sessions(sessions, new)() as session:
        repo.record_event(session=session, function="f", action="scale-up", reason="current", term=new)
    assert _events(sessions) == [("current", new)]
    with sessions() as session:
        assert not lease.renew(session=session, holder="first", term=old, ttl_s=TTL_S)

    await second.release(new)                                       # a stopping leader: taken over at once
    assert await asyncio.wait_for(first.acquire(), ttl_s) == new + 1


async def test_the_keeper_returns_when_another_controller_holds_the_lease(sessions) -> None:
    leader = Leadership(sessions, "leader", TTL_S)
    term = await leader.acquire()
    keeping = asyncio.create_task(leader.keep())
    with sessions() as session:       # the lease ends early (as after a pause past it) and another takes it
        session.execute(update(LeaseRow).values(expires_at=0.0))
        session.commit()
        assert lease.try_acquire(session=session, holder="other", ttl_s=60) == term + 1
    await asyncio.wait_for(keeping, 10)
    assert leader.lost.is_set() and leader.term is None


async def test_a_leader_cut_off_from_the_database_stops_acting_within_its_lease(sessions) -> None:
    leader = Leadership(sessions, "leader", TTL_S)
    await leader.acquire()
    # The database becomes unreachable (a port nothing listens on).
    unreachable = make_engine("postgresql+psycopg://postgres@127.0.0.1:9/none?connect_timeout=1")
    leader.sessions = make_session_factory(unreachable)
    await asyncio.wait_for(leader.keep(), 10 * TTL_S)
    assert leader.lost.is_set()
    unreachable.dispose()


async def test_a_fenced_write_that_is_refused_stops_the_keeper_at_once(sessions) -> None:
    leader = Leadership(sessions, "leader", 60.0)        # renewals far apart: only the refusal can end it
    term = await leader.acquire()
    keeping = asyncio.create_task(leader.keep())
    with sessions() as session:
        session.execute(update(LeaseRow).values(term=term + 1, holder="other"))
        session.commit()
    with fenced_sessions(sessions, term, partial(leader.deposed, term))() as session, pytest.raises(Deposed):
        repo.record_event(session=session, function="f", action="scale-up", reason="late", term=term)
    await asyncio.wait_for(keeping, 10)


async def test_a_worker_refuses_orders_of_a_term_older_than_one_it_was_sent(tmp_path: Path) -> None:
    info = WorkerInfo(id="w", host="test", url=None,
                      device=DeviceInfo(kind="cpu", uuid=None, name="cpu", memory_bytes=2**33))
    agent = WorkerAgent(info=info, backend=ProcessBackend(state_dir=tmp_path, cpu=CpuLimiter()), store=MemoryStore(),
                        logs_dir=tmp_path / "logs")
    transport = httpx.ASGITransport(app=create_worker_api(agent))
    async with httpx.AsyncClient(transport=transport, base_url="http://worker") as http:
        assert (await http.get("/v1/instances", headers={TERM_HEADER: "5"})).status_code == 200
        late = await http.delete("/v1/instances/f-1", headers={TERM_HEADER: "4"})
        assert late.status_code == 409
        assert late.json()["error"] == "refused: this order comes from controller term 4, and term 5 leads now"
        assert (await http.delete("/v1/instances/f-1", headers={TERM_HEADER: "5"})).status_code == 200
        assert (await http.delete("/v1/instances/f-1", headers={TERM_HEADER: "six"})).status_code == 400
    await agent.shutdown()


async def test_a_start_the_old_leader_placed_but_never_ordered_is_placed_again_not_failed(sessions) -> None:
    pinned = {"memory": "64Mi", "gpu": False, "sm_request": 0.5, "sm_limit": 0.5}
    with sessions() as session:
        repo.upsert_function(session=session, spec=make_spec_dict("fa", resources=pinned,
                                                                  scaling={"min_instances": 1}), source_dir="/code")
        repo.upsert_workers(session=session, workers=[make_worker("w1")], now=utcnow())
        # Term 1 placed an instance and stopped before its order reached the worker.
        repo.create_instance(session=session, row=InstanceRow(id="fa-old", function="fa", function_version=1,
                                                              worker_id="w1", state=STARTING, memory_bytes=64 * 2**20,
                                                              sm_request=0.5, sm_limit=0.5, term=1))
        assert lease.try_acquire(session=session, holder="new", ttl_s=60) == 1
        session.execute(update(LeaseRow).values(term=2))
        session.commit()
    store = MemoryStore()
    await store.heartbeat(make_worker("w1"), ttl_s=60)
    async with httpx.AsyncClient() as http:
        directory = WorkerDirectory(http, None)
        worker = RecordingWorker()
        directory.register_local("w1", worker)
        reconciler = Reconciler(sessions=fenced_sessions(sessions, 2), store=store, directory=directory,
                                scheduler=create_scheduler(), term=2)
        try:
            await reconciler.reconcile_once()

            async def placed_again() -> bool:
                return len(worker.statuses) == 1

            await async_eventually(placed_again, timeout=20, what="a new instance to be ordered")
        finally:
            await reconciler.shutdown()
    with sessions() as session:
        rows = {r.id: r for r in repo.list_instances(session=session, function="fa")}
        function = repo.get_function(session=session, name="fa")
    assert rows["fa-old"].state == STOPPED and "never started" in rows["fa-old"].error
    assert function.status == FunctionStatus.DEPLOYING.value, function.error
    (new_id,) = worker.statuses
    assert rows[new_id].term == 2 and rows[new_id].state == STARTING
    assert ("instance fa-old was placed by the controller of term 1, which stopped before its worker started it",
            2) in _events(sessions)
