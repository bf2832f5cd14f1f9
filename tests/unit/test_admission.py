"""One slice owner and one admission: unprofiled instances count as they run, resizes pass the
same filters as placements."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from dilu.db.models import FunctionRow, InstanceRow
from dilu.policy.scheduler import ClusterSnapshot, PlacementRequest, create_scheduler
from dilu.policy.scheduler.resize import Resize, admit_resize
from dilu.slices import DEFAULT_SLICE, effective_slice
from dilu.snapshot import build_snapshot
from dilu.spec import spec_from_dict
from tests.builders import make_spec_dict, make_worker
from tests.unit.test_scheduler import make_gpu, make_request

GiB = 2**30
DILU = create_scheduler("dilu")


class Profile:
    def __init__(self, status: str = "done", kind: str = "inference", batch: int = 8) -> None:
        self.status, self.kind, self.batch = status, kind, batch
        self.sm_request, self.sm_limit = 0.2, 0.6


@pytest.mark.parametrize(("label", "resources", "batching", "profile", "expect"), [
    ("pinned slice wins", {"sm_request": 0.3, "sm_limit": 0.5}, {}, Profile(), (0.3, 0.5, 1)),
    ("profile applies, its batch within the spec's bound", {}, {"max_batch_size": 4}, Profile(), (0.2, 0.6, 4)),
    ("no profile: the default slice, concrete", {}, {}, None, (DEFAULT_SLICE.request, DEFAULT_SLICE.limit, 1)),
    ("failed profile: the default slice", {}, {}, Profile(status="failed"), (DEFAULT_SLICE.request,
                                                                             DEFAULT_SLICE.limit, 1)),
])
def test_effective_slice(label: str, resources: dict, batching: dict, profile, expect: tuple) -> None:
    spec = make_spec_dict(resources={"memory": "1Gi", **resources}, batching=batching)
    chosen = effective_slice(spec_from_dict(spec), profile)
    assert (chosen.compute.request, chosen.compute.limit, chosen.batch) == pytest.approx(expect), label


@pytest.mark.parametrize(("policy", "fit", "why"), [
    ("dilu", 1, "ComputeLimits"),          # limits 1.0 each against the 1.5 cap
    ("request-only", 4, "ComputeRequests"),  # requests 0.25 each against the 1.0 cap
])
def test_unprofiled_instances_count_at_their_default_slice(policy: str, fit: int, why: str) -> None:
    scheduler = create_scheduler(policy)
    chosen = effective_slice(spec_from_dict(make_spec_dict(resources={"memory": "1Gi", "gpu": True})), None)
    request = PlacementRequest("f", GiB, chosen.compute.request, chosen.compute.limit, "latency", True)
    snapshot = ClusterSnapshot.of([make_gpu("g0")])
    placed = 0
    while (decision := scheduler.place(request, snapshot)).ok:
        snapshot = snapshot.with_placement([snapshot.index(decision.devices[0])], request)
        placed += 1
        assert placed < 10, "placement never stops"
    assert placed == fit and why in decision.reason, decision


def test_snapshot_counts_what_rows_record() -> None:
    now = datetime.now(UTC)
    rows = [InstanceRow(id=f"i{n}", function="f", function_version=1, worker_id="g", state="ready",
                        memory_bytes=GiB, sm_request=0.25, sm_limit=1.0, created_at=now, role="serve")
            for n in range(3)]
    function = FunctionRow(name="f", version=1, spec=make_spec_dict("f"), status="ready", source_dir="/x")
    snapshot = build_snapshot([make_worker("g", kind="gpu", memory=40 * GiB)], rows, [function])
    assert snapshot.devices[0].sm_requested == pytest.approx(0.75)
    assert snapshot.devices[0].sm_limited == pytest.approx(3.0)


@pytest.mark.parametrize(("label", "neighbour", "new", "ok", "reason"), [
    ("grows into free capacity", (0.3, 0.6), (0.6, 0.9), True, ""),
    ("requests beyond the GPU are refused", (0.5, 0.5), (0.6, 0.9), False, "compute requests would total 1.10 > 1"),
    ("limits beyond the cap are refused", (0.2, 1.0), (0.3, 0.6), False, "short by 0.10"),
    ("shrinking always fits", (0.7, 1.0), (0.1, 0.2), True, ""),
])
def test_resize_admission(label: str, neighbour: tuple, new: tuple, ok: bool, reason: str) -> None:
    """A function at request 0.3 / limit 0.4 on g0 beside a neighbour; its own current slice is
    taken off before the new one is checked."""
    mine = make_request("mine", sm=0.3, limit=0.4, mem=1)
    gpu = make_gpu("g0", sm=0.3 + neighbour[0], limit=0.4 + neighbour[1], mem=2, latency=("mine", "other"))
    verdict = admit_resize(DILU, ClusterSnapshot.of([gpu]), [Resize("g0", mine, *new)])
    assert verdict.ok == ok, (label, verdict)
    assert reason in verdict.reason, (label, verdict)
    if not ok:
        assert verdict.reason.startswith("g0:") and verdict.device_id == "g0"


def test_two_instances_on_one_gpu_are_checked_together() -> None:
    mine = make_request("mine", sm=0.3, limit=0.3, mem=1)
    gpu = make_gpu("g0", sm=0.6, limit=0.6, mem=2, latency=("mine",))
    assert admit_resize(DILU, ClusterSnapshot.of([gpu]), [Resize("g0", mine, 0.5, 0.5)] * 2).ok
    verdict = admit_resize(DILU, ClusterSnapshot.of([gpu]), [Resize("g0", mine, 0.6, 0.6)] * 2)
    assert not verdict.ok and "1.20" in verdict.reason
