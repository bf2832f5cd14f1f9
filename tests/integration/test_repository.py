"""Repository functions against a migrated SQLite file and a migrated PostgreSQL database."""

from __future__ import annotations

from datetime import timedelta

import pytest

from dilu.db import repo
from dilu.db.models import InstanceRow, utcnow
from tests.builders import make_spec_dict, make_worker


def _instance(instance_id: str, function: str = "fn", worker: str = "w1", state: str = "ready") -> InstanceRow:
    return InstanceRow(id=instance_id, function=function, function_version=1, worker_id=worker, state=state,
                       memory_bytes=1024, created_at=utcnow())


def test_redeploy_bumps_version_and_resets_status(sessions) -> None:
    with sessions() as session:
        row, created = repo.upsert_function(session=session, spec=make_spec_dict("fn"), source_dir="/a")
        assert created and row.version == 1 and row.status == "deploying"
        assert repo.set_function_status(session=session, name="fn", version=1, status="failed", error="boom")
        row, created = repo.upsert_function(session=session, spec=make_spec_dict("fn", batching={"max_batch_size": 4}),
                                            source_dir="/b")
        assert not created and row.version == 2 and row.status == "deploying" and row.error is None
    with sessions() as session:
        stored = repo.get_function(session=session, name="fn")
        assert stored.spec["batching"]["max_batch_size"] == 4 and stored.source_dir == "/b"
        assert stored.created_at.tzinfo is not None


def test_stale_status_does_not_overwrite_a_newer_version(sessions) -> None:
    with sessions() as session:
        repo.upsert_function(session=session, spec=make_spec_dict("fn"), source_dir="/a")
        repo.upsert_function(session=session, spec=make_spec_dict("fn"), source_dir="/a")
        assert not repo.set_function_status(session=session, name="fn", version=1, status="failed", error="old")
        assert repo.get_function(session=session, name="fn").status == "deploying"


def test_lost_worker_takes_its_instances_with_it(sessions) -> None:
    now = utcnow()
    with sessions() as session:
        repo.upsert_function(session=session, spec=make_spec_dict("fn"), source_dir="/a")
        repo.upsert_workers(session=session, workers=[make_worker("w1"), make_worker("w2")], now=now)
        repo.create_instance(session=session, row=_instance("i1", worker="w1"))
        repo.create_instance(session=session, row=_instance("i2", worker="w2"))
        repo.mark_workers_lost(session=session, worker_ids=["w1"], now=now)
    with sessions() as session:
        states = {r.id: r.state for r in repo.list_instances(session=session)}
        assert states == {"i1": "lost", "i2": "ready"}
        assert {w.id: w.state for w in repo.list_workers(session=session)} == {"w1": "lost", "w2": "alive"}
        assert [r.id for r in repo.list_instances(session=session, active_only=True)] == ["i2"]


def test_delete_function_removes_its_instances(sessions) -> None:
    with sessions() as session:
        repo.upsert_function(session=session, spec=make_spec_dict("fn"), source_dir="/a")
        repo.create_instance(session=session, row=_instance("i1"))
        assert repo.delete_function(session=session, name="fn")
        assert not repo.delete_function(session=session, name="fn")
        assert repo.list_instances(session=session) == []


def test_request_counts_and_events(sessions) -> None:
    with sessions() as session:
        repo.upsert_function(session=session, spec=make_spec_dict("fn"), source_dir="/a")
        repo.add_request_counts(session=session, counts={"fn": 3})
        repo.add_request_counts(session=session, counts={"fn": 4, "ghost": 1})
        assert repo.get_function(session=session, name="fn").requests_total == 7
        for i in range(5):
            repo.record_event(session=session, function="fn", action="scale-up", reason=f"r{i}")
        assert [e.reason for e in repo.list_events(session=session, function="fn", limit=2)] == ["r3", "r4"]


def test_prune_keeps_the_newest_ended_instances(sessions) -> None:
    base = utcnow()
    with sessions() as session:
        repo.upsert_function(session=session, spec=make_spec_dict("fn"), source_dir="/a")
        for i in range(5):
            row = _instance(f"i{i}", state="stopped")
            row.created_at = base + timedelta(seconds=i)
            repo.create_instance(session=session, row=row)
        repo.create_instance(session=session, row=_instance("live"))
        repo.prune_instances(session=session, keep_ended=2)
        assert sorted(r.id for r in repo.list_instances(session=session)) == ["i3", "i4", "live"]


def test_concurrent_deploys_of_one_name_get_every_version_once(sessions) -> None:
    from concurrent.futures import ThreadPoolExecutor
    from threading import Barrier

    spec = {"name": "race", "handler": "h:H"}
    start = Barrier(10)

    def deploy(n: int) -> tuple[int, bool]:
        start.wait()
        with sessions() as session:
            row, created = repo.upsert_function(session=session, spec={**spec, "model": {"n": n}}, source_dir="/x")
            return row.version, created

    with ThreadPoolExecutor(10) as pool:
        results = list(pool.map(deploy, range(10)))
    assert sorted(version for version, _ in results) == list(range(1, 11))   # no gaps, no repeats
    assert [created for _, created in results].count(True) == 1
    with sessions() as session:
        assert repo.get_function(session=session, name="race").version == 10


def test_paging_lists_each_lasting_function_exactly_once_while_others_come_and_go(sessions) -> None:
    with sessions() as session:
        for i in range(30):
            repo.upsert_function(session=session, spec=make_spec_dict(f"fn-{i:02d}"), source_dir="/a")
    seen: list[str] = []
    gone: set[str] = set()
    cursor = None
    page = 0
    while True:
        with sessions() as session:
            rows = repo.functions_page(session=session, after=cursor, limit=7)
            seen += [row.name for row in rows]
            # Between pages: some functions are deleted (listed already, and not yet), others are
            # added before and after the cursor.
            page += 1
            for name in (f"fn-{page:02d}", f"fn-{29 - page:02d}"):
                if repo.delete_function(session=session, name=name):
                    gone.add(name)
            repo.upsert_function(session=session, spec=make_spec_dict(f"fn-{page:02d}a"), source_dir="/a")
            repo.upsert_function(session=session, spec=make_spec_dict(f"zz-{page}"), source_dir="/a")
        if len(rows) < 7:
            break
        cursor = rows[-1].name
    assert len(seen) == len(set(seen))                                   # nothing twice
    lasting = {f"fn-{i:02d}" for i in range(30)} - gone
    assert lasting <= set(seen)                                          # every lasting one once
    with sessions() as session:
        details = repo.details_of(session=session, functions=repo.functions_page(session=session, after=None,
                                                                                 limit=3))
        assert set(details.instances) == {"fn-00", "fn-01a", "fn-02a"} and details.profiles == {}


def test_instance_pages_follow_creation_then_id_even_when_instances_share_a_moment(sessions) -> None:
    moment = utcnow()
    with sessions() as session:
        repo.upsert_function(session=session, spec=make_spec_dict("fn"), source_dir="/a")
        for index, instance_id in enumerate(["fn-c", "fn-a", "fn-b", "fn-d", "fn-e"]):
            row = _instance(instance_id, state="stopped" if instance_id == "fn-d" else "ready")
            row.created_at = moment + timedelta(seconds=1 if index >= 3 else 0)   # three share one moment
            repo.create_instance(session=session, row=row)
    pages, after = [], None
    while True:
        with sessions() as session:
            rows = repo.instances_page(session=session, function="fn", active_only=False, after=after, limit=2)
        pages.append([row.id for row in rows])
        if len(rows) < 2:
            break
        after = (rows[-1].created_at, rows[-1].id)   # the cursor round-trips the stored time exactly
    assert pages == [["fn-a", "fn-b"], ["fn-c", "fn-d"], ["fn-e"]]
    with sessions() as session:
        active = repo.instances_page(session=session, function="fn", active_only=True, after=None, limit=None)
    assert [row.id for row in active] == ["fn-a", "fn-b", "fn-c", "fn-e"]


def test_event_pages_go_back_in_time_each_oldest_first(sessions) -> None:
    with sessions() as session:
        for index in range(5):
            repo.record_event(session=session, function="fn", action="scale_up", reason=f"r{index}")
        repo.record_event(session=session, function="other", action="scale_up", reason="elsewhere")
        newest = repo.list_events(session=session, function="fn", limit=2)
        older = repo.list_events(session=session, function="fn", limit=2, before=newest[0].id)
        oldest = repo.list_events(session=session, function="fn", limit=2, before=older[0].id)
    assert [[e.reason for e in page] for page in (newest, older, oldest)] == [["r3", "r4"], ["r1", "r2"], ["r0"]]


def test_functions_match_on_part_of_their_name_and_the_unsettled_are_found(sessions) -> None:
    with sessions() as session:
        for name in ("img-resize", "img-crop", "text-sum", "video-img"):
            repo.upsert_function(session=session, spec=make_spec_dict(name), source_dir="/a")
        for name in ("img-resize", "text-sum"):
            repo.set_function_status(session=session, name=name, version=1, status="ready")
        assert repo.count_functions(session=session) == 4
        assert repo.count_functions(session=session, containing="img") == 3
        assert [r.name for r in repo.functions_page(session=session, after=None, limit=2, containing="img")] == [
            "img-crop", "img-resize"]
        assert [r.name for r in repo.unsettled_functions(session=session, limit=5)] == ["img-crop", "video-img"]
        assert repo.count_functions(session=session, containing="-") == 4     # what the routes' pattern allows
        with pytest.raises(ValueError):
            repo.count_functions(session=session, containing="%")
