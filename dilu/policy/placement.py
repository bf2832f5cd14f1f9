"""Placement: which worker gets a new instance. First fit now; the scoring scheduler replaces it.

``Scheduler.place`` is pure: it sees an immutable snapshot of workers and returns a decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

GpuWish = bool | Literal["auto"]


@dataclass(frozen=True)
class PlacementRequest:
    function: str
    memory_bytes: int
    gpu: GpuWish = "auto"
    sm_request: float | None = None
    sm_limit: float | None = None


@dataclass(frozen=True)
class WorkerView:
    """A live worker as the scheduler sees it: capacity and what its active instances hold."""

    id: str
    device_kind: str  # gpu | cpu
    memory_bytes: int
    memory_used: int = 0
    sm_requested: float = 0.0
    sm_limited: float = 0.0


@dataclass(frozen=True)
class PlacementDecision:
    worker_id: str | None
    reason: str


class Scheduler(Protocol):
    def place(self, request: PlacementRequest, workers: Sequence[WorkerView]) -> PlacementDecision:
        """Chooses a worker, or none with the reason nothing fits. Must not mutate its inputs."""


MAX_SM_REQUESTS = 1.0
MAX_SM_LIMITS = 1.5


def fits(request: PlacementRequest, worker: WorkerView) -> str | None:
    """None if ``request`` fits on ``worker``, else why not."""
    if request.gpu is True and worker.device_kind != "gpu":
        return "needs a GPU"
    if request.gpu is False and worker.device_kind != "cpu":
        return "CPU only"
    if worker.memory_used + request.memory_bytes > worker.memory_bytes:
        return "not enough memory"
    if worker.device_kind == "gpu":
        if worker.sm_requested + (request.sm_request or 0.0) > MAX_SM_REQUESTS + 1e-9:
            return "compute requests would exceed 100%"
        if worker.sm_limited + (request.sm_limit or 0.0) > MAX_SM_LIMITS + 1e-9:
            return "compute limits would exceed 150%"
    return None


class FirstFitScheduler:
    """The first worker that fits; GPU workers before the CPU for ``gpu: auto``."""

    def place(self, request: PlacementRequest, workers: Sequence[WorkerView]) -> PlacementDecision:
        ordered = sorted(workers, key=lambda w: (w.device_kind != "gpu", w.id))
        reasons = []
        for worker in ordered:
            why_not = fits(request, worker)
            if why_not is None:
                return PlacementDecision(worker.id, f"first fit on {worker.id}")
            reasons.append(f"{worker.id}: {why_not}")
        if not workers:
            return PlacementDecision(None, "no live worker")
        return PlacementDecision(None, "no worker fits (" + "; ".join(reasons) + ")")
