"""Score: prefer a GPU where every limit, batch work's included, still fits the cap.

``ComputeLimits`` with ``batch_yields`` lets a latency instance's limit overlap a batch
instance's (batch work is held while latency work runs), which packs more latency work beside
training; but each neighbour holds training for the time it serves. So an overlap is a fallback:
a GPU whose limits stay apart wins while one exists, an overlapping one only when none does.
"""

from __future__ import annotations

import numpy as np

from dilu.policy.scheduler.framework import ClusterSnapshot, Device, PlacementRequest
from dilu.policy.scheduler.plugins.compute_cap import EPSILON, fits, parse_args, totals

NAME = "LimitsApart"


def score(request: PlacementRequest, device: Device, cap: float = 1.5) -> float:
    return 100.0 if fits(request, device, of="limit", cap=cap) else 0.0


class LimitsApart:
    name = NAME

    def __init__(self, cap: float) -> None:
        self.cap = cap

    def score(self, request: PlacementRequest, snapshot: ClusterSnapshot) -> np.ndarray:
        (total,) = totals(request, snapshot, of="limit")
        return np.where(total <= self.cap + EPSILON, 100.0, 0.0)


def factory(args: dict) -> LimitsApart:
    cap, _ = parse_args(args, NAME, 1.5)
    return LimitsApart(cap)
