"""Two controllers on PostgreSQL and Redis, with a worker and a gateway as real processes: the
leader is killed -9, then (restarted as a standby) the new leader is paused 15 s, each time under
16 clients' invokes and with a deploy in flight. A standby leads within 5 s (the lease's contract:
3 s and a retry), the deploy completes on the instance already started (none started twice), no
invoke fails, and nothing the paused leader did after it woke was written."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import select

from dilu.db.models import InstanceRow, ScalingEventRow
from tests.cluster import CLIENTS, Cluster, Load
from tests.conftest import FIXTURE_FUNCTIONS
from tests.waiting import eventually

# It measures how the platform reacts to load: it runs with no other test beside it (scripts/test).
pytestmark = pytest.mark.alone

TAKEOVER_BOUND_S = 5.0


def _taken_over(cluster: Cluster, by: str, after_term: int, since: float) -> tuple[int, float]:
    """Waits until ``by`` leads in a newer term; that term and how long after ``since`` (the
    database's clock) it took the lease."""
    def leads() -> tuple[int, float] | None:
        holder, term, acquired_at, _ = cluster.lease()
        return (term, acquired_at - since) if holder == by and term is not None and term > after_term else None

    return eventually(leads, timeout=30, interval=0.05, what=f"controller {by} to lead")


def _one_start_completes(cluster: Cluster, name: str, deploying: subprocess.Popen, release: Path) -> None:
    release.write_text("go")
    out, _ = deploying.communicate(timeout=180)
    assert deploying.returncode == 0, out
    serving = [r for r in cluster.rows(name) if r.role == "serve"]
    assert [r.state for r in serving] == ["ready"], [(r.id, r.state, r.error) for r in serving]
    assert cluster.worker_runs(name) == [serving[0].id], "an instance was started twice"


def test_a_standby_takes_over_a_killed_and_a_paused_leader_under_load(tmp_path: Path, postgres_url: str,
                                                                      redis_prefix: str,
                                                                      instance_visible_dir: Path) -> None:
    cluster = Cluster(tmp_path, postgres_url, redis_prefix)
    load = None
    try:
        first = cluster.controller("first")
        eventually(lambda: cluster.lease()[0] == "first", timeout=30, what="the first controller to lead")
        cluster.controller("second")
        ok = shutil.copytree(FIXTURE_FUNCTIONS / "ok", tmp_path / "ok")
        (ok / "model.yaml").write_text((ok / "model.yaml").read_text().replace(
            "scaling:\n", "scaling:\n  min_instances: 1\n  max_instances: 1\n"))
        cluster.deploy(ok)
        load = Load(cluster.gateway.url, "ok")

        # 1. The leader is killed -9 while a deploy's instance is starting.
        release = instance_visible_dir / "release-one"
        deploying = cluster.deploy_in_background("one", release)
        eventually(lambda: cluster.worker_runs("one"), timeout=60, what="the deploy's start to reach the worker")
        _, old_term, _, _ = cluster.lease()
        killed_at = cluster.database_now()
        first.process.kill()
        new_term, took_s = _taken_over(cluster, "second", old_term, killed_at)
        assert took_s < TAKEOVER_BOUND_S, f"the standby led {took_s:.1f} s after the leader was killed"
        _one_start_completes(cluster, "one", deploying, release)
        status = cluster.http.get("/v1/status").json()["controller"]
        assert (status["leader"], status["term"]) == ("second", new_term)

        # 2. The first comes back as a standby; the leader is paused 15 s with a deploy starting.
        again = cluster.controller("first-again")
        eventually(lambda: "standing by" in again.log(), timeout=30, what="the restarted controller to stand by")
        release = instance_visible_dir / "release-two"
        deploying = cluster.deploy_in_background("two", release)
        eventually(lambda: cluster.worker_runs("two"), timeout=60, what="the deploy's start to reach the worker")
        paused = next(r for r in cluster.roles if r.log_path.name == "controller-second.log")
        paused_at = cluster.database_now()
        os.kill(paused.process.pid, signal.SIGSTOP)
        newest, took_s = _taken_over(cluster, "first-again", new_term, paused_at)
        assert took_s < TAKEOVER_BOUND_S, f"the standby led {took_s:.1f} s after the leader was paused"
        _one_start_completes(cluster, "two", deploying, release)
        eventually(lambda: cluster.database_now() - paused_at >= 15, timeout=60, interval=0.5,
                   what="the pause to last 15 s")
        os.kill(paused.process.pid, signal.SIGCONT)
        eventually(lambda: "no longer leading" in paused.log(), timeout=30, what="the paused leader to stand by")
        assert cluster.lease()[:2] == ("first-again", newest)

        # What the paused leader decided after it woke never landed: no event or instance of its
        # term is newer than the takeover.
        with cluster.sessions() as session:
            late_events = session.scalars(select(ScalingEventRow).where(ScalingEventRow.term == new_term)).all()
            late_rows = session.scalars(select(InstanceRow).where(InstanceRow.term == new_term)).all()
        taken_at = cluster.lease()[2]
        assert [(e.action, e.reason) for e in late_events if e.at.timestamp() > taken_at] == []
        assert [r.id for r in late_rows if r.created_at.timestamp() > taken_at] == []
        assert [r.state for r in cluster.rows("ok") if r.role == "serve"] == ["ready"], "ok was restarted"

        answers = load.stop()
        load = None
        failed = [a for a in answers if a != 200]
        assert len(answers) >= CLIENTS and failed == [], f"{len(failed)} of {len(answers)} failed: {failed[:5]}"
    finally:
        if load is not None:
            load.stop()
        cluster.close()
