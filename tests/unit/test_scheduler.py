"""The scheduler: each plugin alone (vectorised form = scalar helper), the policies, gang placement."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dilu.policy.scheduler import ClusterSnapshot, Device, PlacementRequest, create_scheduler
from dilu.policy.scheduler.plugins import (
    active,
    affinity,
    best_fit,
    complementary,
    compute_cap,
    device_kind,
    exclusive,
    limits_apart,
    memory_fit,
    priority_pair,
)
from dilu.policy.scheduler.registry import build

GiB = 2**30


def make_gpu(name: str, node: str = "n0", *, sm: float = 0.0, limit: float = 0.0, mem: int = 0,
             latency: tuple[str, ...] = (), batch: tuple[str, ...] = (), kind: str = "gpu",
             batch_part: float | None = None) -> Device:
    """``batch_part``: the share of ``sm`` and ``limit`` batch work holds (default: all of it on a
    GPU of batch work alone, none otherwise)."""
    part = batch_part if batch_part is not None else 1.0 if batch and not latency else 0.0
    return Device(name, node, kind=kind, memory_bytes=40 * GiB, memory_used=mem * GiB, sm_requested=sm,
                  sm_limited=limit, sm_requested_batch=part * sm, sm_limited_batch=part * limit,
                  functions=frozenset(latency + batch), latency_functions=frozenset(latency),
                  batch_functions=frozenset(batch))


def make_request(name: str = "f", cls: str = "latency", sm: float = 0.3, limit: float = 0.6, mem: int = 4,
                 **kw) -> PlacementRequest:
    return PlacementRequest(name, mem * GiB, sm, limit, cls, **kw)


CLUSTER = [
    make_gpu("empty"),
    make_gpu("cpu", kind="cpu"),
    make_gpu("half-batch", sm=0.5, limit=0.8, mem=10, batch=("train",)),
    make_gpu("full-memory", mem=39, latency=("x",)),
    make_gpu("lat-only", sm=0.2, limit=0.4, mem=4, latency=("other",)),
    make_gpu("limits-high", sm=0.3, limit=1.3, mem=4, batch=("b2",)),
]
SNAP = ClusterSnapshot.of(CLUSTER)


@pytest.mark.parametrize("request_", [make_request(), make_request(cls="batch", gpu=True),
                                      make_request(gpu=False), make_request(sm=0.8, limit=0.9, mem=30)])
def test_vectorised_plugins_agree_with_their_scalar_helpers(request_: PlacementRequest) -> None:
    checks = [
        (device_kind.DeviceKind(), lambda d: device_kind.fits(request_, d)),
        (memory_fit.MemoryFit(), lambda d: memory_fit.fits(request_, d)),
        (compute_cap.ComputeCap("request", 1.0), lambda d: compute_cap.fits(request_, d, of="request", cap=1.0)),
        (compute_cap.ComputeCap("limit", 1.5), lambda d: compute_cap.fits(request_, d, of="limit", cap=1.5)),
        (compute_cap.ComputeCap("limit", 1.5, batch_yields=True),
         lambda d: compute_cap.fits(request_, d, of="limit", cap=1.5, batch_yields=True)),
        (exclusive.Exclusive(), lambda d: exclusive.fits(request_, d)),
        (priority_pair.PriorityPair(), lambda d: priority_pair.fits(request_, d)),
    ]
    for plugin, scalar in checks:
        assert list(plugin.filter(request_, SNAP)) == [scalar(d) for d in CLUSTER], plugin.name
    partner_set = affinity.partners(request_, SNAP.devices)
    scores = [
        (best_fit.BestFit2D(0.6, 0.4, "request"), lambda d: best_fit.score(request_, d)),
        (complementary.Complementary(), lambda d: complementary.score(request_, d)),
        (active.ActiveFirst(), lambda d: active.score(request_, d)),
        (limits_apart.LimitsApart(1.5), lambda d: limits_apart.score(request_, d, 1.5)),
        (affinity.Affinity(), lambda d: affinity.score(request_, d, partner_set)),
    ]
    for plugin, scalar in scores:
        assert np.allclose(plugin.score(request_, SNAP), [scalar(d) for d in CLUSTER]), plugin.name


@pytest.mark.parametrize(("label", "policy", "request_", "cluster", "expected"), [
    ("latency beside batch over an empty gpu", "dilu", make_request(), CLUSTER, ("half-batch",)),
    ("batch beside latency", "dilu", make_request("t2", "batch"), CLUSTER, ("lat-only",)),
    ("cpu-only function", "dilu", make_request(gpu=False), CLUSTER, ("cpu",)),
    ("limits kept apart while a gpu allows it", "dilu", make_request(sm=0.3, limit=0.6),
     [make_gpu("limits-high", sm=0.3, limit=1.3, batch=("b",)), make_gpu("fresh")], ("fresh",)),
    ("a latency limit overlaps batch work's when no gpu keeps them apart", "dilu", make_request(sm=0.3, limit=0.6),
     [make_gpu("limits-high", sm=0.3, limit=1.3, batch=("b",))], ("limits-high",)),
    ("latency limits alone still cap at 1.5", "dilu", make_request(sm=0.3, limit=0.6),
     [make_gpu("latency-high", sm=0.3, limit=1.3, latency=("x",)), make_gpu("fresh")], ("fresh",)),
    ("batch limits never overlap each other", "dilu", make_request("t2", "batch", sm=0.3, limit=1.0),
     [make_gpu("training", sm=0.3, limit=1.0, batch=("t1",)), make_gpu("fresh")], ("fresh",)),
    ("requests never exceed 1.0", "dilu", make_request(sm=0.6, limit=0.6),
     [make_gpu("busy", sm=0.5, limit=0.5, batch=("b",)), make_gpu("fresh")], ("fresh",)),
    ("exclusive takes an empty gpu", "exclusive", make_request(), CLUSTER, ("empty",)),
    ("static slices cap limits at 1.0", "static-limits", make_request(sm=0.3, limit=0.6),
     [make_gpu("half", sm=0.2, limit=0.5, batch=("b",)), make_gpu("fresh")], ("fresh",)),
    ("request-only ignores limits", "request-only", make_request(sm=0.3, limit=0.6),
     [make_gpu("half", sm=0.2, limit=1.4, batch=("b",)), make_gpu("fresh")], ("half",)),
    ("time-sharing pairs latency with batch, one of each", "time-sharing", make_request(sm=0.9, limit=1.0),
     [make_gpu("two-lat", latency=("x",)), make_gpu("batch", sm=0.8, limit=1.0, batch=("b",))], ("batch",)),
    ("best fit picks the fuller gpu", "request-only", make_request(sm=0.2, limit=0.2),
     [make_gpu("a", sm=0.2, batch=("b",)), make_gpu("b", sm=0.6, batch=("c",))], ("b",)),
])
def test_policies(label: str, policy: str, request_: PlacementRequest, cluster: list[Device],
                  expected: tuple[str, ...]) -> None:
    decision = create_scheduler(policy).place(request_, ClusterSnapshot.of(cluster))
    assert decision.ok and decision.devices == expected, (label, decision)


def test_a_batch_limit_counts_at_its_request_against_latency_limits_only() -> None:
    """A training job (0.3 / 1.0) beside a latency instance (0.4 / 1.0): latency limits 1.0 plus
    the training's request 0.3 leave 0.2 for another latency limit, and no room for a second
    training job's limit beside the first."""
    gpu = replace(make_gpu("shared", sm=0.7, limit=2.0, latency=("web",), batch=("train",)),
                  sm_requested_batch=0.3, sm_limited_batch=1.0)
    fits = compute_cap.fits
    assert fits(make_request(sm=0.1, limit=0.2), gpu, of="limit", cap=1.5, batch_yields=True)
    assert not fits(make_request(sm=0.1, limit=0.3), gpu, of="limit", cap=1.5, batch_yields=True)
    assert not fits(make_request("t2", "batch", sm=0.1, limit=0.6), gpu, of="limit", cap=1.5, batch_yields=True)
    assert not fits(make_request(sm=0.1, limit=0.2), gpu, of="limit", cap=1.5), "without it all limits add up"


def test_affinity_keeps_a_latency_function_with_the_batch_jobs_it_already_shares() -> None:
    cluster = [
        make_gpu("g0", sm=0.6, latency=("web",), batch=("train",)),
        make_gpu("g1", sm=0.3, batch=("train",)),      # the same training job's other GPU
        make_gpu("g2", sm=0.3, batch=("other-train",)),  # complementary too, but no history
    ]
    decision = create_scheduler("dilu").place(make_request("web", sm=0.3), ClusterSnapshot.of(cluster))
    assert decision.devices == ("g1",)


def test_nothing_fits_says_why() -> None:
    decision = create_scheduler("dilu").place(make_request(mem=100), SNAP)
    assert not decision.ok and "MemoryFit rejected" in decision.reason


def test_nothing_fits_says_why_in_plain_words_with_the_amounts() -> None:
    scheduler = create_scheduler("dilu")
    memory = scheduler.place(make_request(mem=900), SNAP).reason
    assert memory.startswith("it asks for 900.0 GiB of memory (resources.memory) and the most any worker has free "
                             "is 40.0 GiB (empty, of 40.0 GiB)"), memory
    cpu_only = ClusterSnapshot.of([make_gpu("host-cpu", kind="cpu")])
    gpu = scheduler.place(make_request(gpu=True), cpu_only).reason
    assert gpu.startswith("it needs a GPU (resources.gpu: true) and no worker has one"), gpu
    compute = scheduler.place(make_request(sm=0.9, limit=0.95, gpu=True),
                              ClusterSnapshot.of([make_gpu("g0", sm=0.5, limit=0.5)])).reason
    assert "compute request of 0.9 (resources.sm_request) and the most any GPU has left is 0.5 of 1" in compute
    simulated = ClusterSnapshot.of([Device("sim", "n0", simulated=True)])
    assert scheduler.place(make_request(), simulated).reason.startswith(
        "its gpu: auto does not run on a simulated GPU")


def test_gang_placement_keeps_a_multi_gpu_job_on_one_node() -> None:
    cluster = [make_gpu("a0", "a"), make_gpu("a1", "a", mem=39, latency=("x",)),
               make_gpu("b0", "b"), make_gpu("b1", "b"), make_gpu("b2", "b", kind="cpu")]
    decision = create_scheduler("dilu").place(make_request("job", "batch", gpus=2), ClusterSnapshot.of(cluster))
    assert decision.ok and decision.devices == ("b0", "b1")
    too_big = create_scheduler("dilu").place(make_request("job", "batch", gpus=3), ClusterSnapshot.of(cluster))
    assert not too_big.ok and "no node has 3" in too_big.reason


def test_snapshot_after_a_placement_counts_it() -> None:
    after = SNAP.with_placement([0], make_request("new", sm=0.3, limit=0.6))
    assert after.sm_requested[0] == pytest.approx(0.3) and after.devices[0].latency_functions == {"new"}
    assert SNAP.sm_requested[0] == 0.0, "the original snapshot is unchanged"
    job = make_request("job", "batch", sm=0.2, limit=1.0)
    trained = after.with_placement([0], job)
    assert (trained.sm_requested_batch[0], trained.sm_limited_batch[0]) == pytest.approx((0.2, 1.0))
    assert trained.devices[0].sm_limited_batch == pytest.approx(1.0)
    gone = trained.without(0, job)
    assert (gone.sm_requested_batch[0], gone.sm_limited_batch[0], gone.sm_limited[0]) == pytest.approx((0, 0, 0.6))


@pytest.mark.parametrize(("name", "args", "message"), [
    ("NoSuchPlugin", {}, "unknown scheduler plugin"),
    ("ComputeRequests", {"cap": 0}, "cap must be in"),
    ("BestFit2D", {"sm_weight": 0.9}, "add up to 1"),
    ("MemoryFit", {"x": 1}, "takes no arguments"),
])
def test_registry_validates(name: str, args: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build(name, args)


def test_unknown_policy() -> None:
    with pytest.raises(ValueError, match="known: dilu"):
        create_scheduler("magic")
