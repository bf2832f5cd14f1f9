"""The controller's cluster snapshot: live workers with what their active instances hold."""

from __future__ import annotations

from datetime import UTC, datetime

from dilu.db.models import FunctionRow, InstanceRow
from dilu.snapshot import build_snapshot
from tests.builders import make_spec_dict, make_worker

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def row(instance: str, function: str, worker: str, state: str = "ready", sm: float = 0.2) -> InstanceRow:
    return InstanceRow(id=instance, function=function, function_version=1, worker_id=worker, state=state,
                       memory_bytes=2**30, sm_request=sm, sm_limit=sm * 2, created_at=NOW)


def function(name: str, cls: str) -> FunctionRow:
    return FunctionRow(name=name, version=1, spec=make_spec_dict(name, **{"class": cls}), source_dir="/x",
                       status="ready", created_at=NOW, updated_at=NOW, requests_total=0)


def test_snapshot_sums_active_instances_per_worker_and_knows_their_classes() -> None:
    workers = [make_worker("g0", kind="gpu"), make_worker("g1", kind="gpu")]
    rows = [row("a", "web", "g0"), row("b", "train", "g0", sm=0.5), row("c", "web", "g1", state="stopped"),
            row("d", "web", "elsewhere")]
    snapshot = build_snapshot(workers, rows, [function("web", "latency"), function("train", "batch")])
    g0, g1 = snapshot.devices
    assert g0.sm_requested == 0.7 and g0.sm_limited == 1.4 and g0.memory_used == 2 * 2**30
    assert g0.latency_functions == {"web"} and g0.batch_functions == {"train"}
    assert g1.functions == frozenset() and g1.memory_used == 0, "ended instances hold nothing"
