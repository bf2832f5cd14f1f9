"""First-fit placement over a snapshot of workers."""

from __future__ import annotations

import pytest

from dilu.policy.placement import FirstFitScheduler, PlacementRequest, WorkerView

GiB = 2**30
CPU = WorkerView(id="cpu", device_kind="cpu", memory_bytes=16 * GiB)
GPU_A = WorkerView(id="gpu-a", device_kind="gpu", memory_bytes=40 * GiB)
GPU_B = WorkerView(id="gpu-b", device_kind="gpu", memory_bytes=40 * GiB)


@pytest.mark.parametrize(("label", "request_", "workers", "expected", "reason"), [
    ("auto prefers a GPU", PlacementRequest("f", GiB), [CPU, GPU_A], "gpu-a", "first fit"),
    ("auto falls back to the CPU", PlacementRequest("f", GiB), [CPU], "cpu", "first fit"),
    ("gpu true never lands on the CPU", PlacementRequest("f", GiB, gpu=True), [CPU], None, "needs a GPU"),
    ("gpu false never lands on a GPU", PlacementRequest("f", GiB, gpu=False), [GPU_A, CPU], "cpu", "first fit"),
    ("memory is never oversubscribed",
     PlacementRequest("f", 10 * GiB), [WorkerView("gpu-a", "gpu", 40 * GiB, memory_used=35 * GiB), GPU_B],
     "gpu-b", "first fit"),
    ("compute requests stay within 100%",
     PlacementRequest("f", GiB, sm_request=0.5, sm_limit=0.5),
     [WorkerView("gpu-a", "gpu", 40 * GiB, sm_requested=0.6, sm_limited=0.6)], None, "exceed 100%"),
    ("compute limits stay within 150%",
     PlacementRequest("f", GiB, sm_request=0.1, sm_limit=0.6),
     [WorkerView("gpu-a", "gpu", 40 * GiB, sm_requested=0.2, sm_limited=1.0)], None, "exceed 150%"),
    ("no worker at all", PlacementRequest("f", GiB), [], None, "no live worker"),
])
def test_first_fit(label: str, request_: PlacementRequest, workers: list[WorkerView], expected: str | None,
                   reason: str) -> None:
    decision = FirstFitScheduler().place(request_, workers)
    assert decision.worker_id == expected, label
    assert reason in decision.reason, decision.reason
