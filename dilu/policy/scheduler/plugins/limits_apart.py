"""Score: prefer a GPU where every limit, batch work's included, still fits the cap.

``ComputeLimits`` with ``batch_yields`` lets a latency instance's limit overlap a batch
instance's (batch work is held while latency work runs), which packs more latency work beside
training; but each neighbour holds training for the time it serves. So an overlap is a fallback:
a GPU whose limits stay apart wins while one exists, an overlapping one only when none does.
"""

from __future__ import annotations

import numpy as np

from dilu.policy.scheduler.framework import ClusterSnapshot, Device, PlacementRequest

NAME = "LimitsApart"
EPSILON = 1e-9


def score(request: PlacementRequest, device: Device, cap: float = 1.5) -> float:
    return 100.0 if device.sm_limited + request.sm_limit <= cap + EPSILON else 0.0


class LimitsApart:
    name = NAME

    def __init__(self, cap: float) -> None:
        self.cap = cap

    def score(self, request: PlacementRequest, snapshot: ClusterSnapshot) -> np.ndarray:
        return np.where(snapshot.sm_limited + request.sm_limit <= self.cap + EPSILON, 100.0, 0.0)


def factory(args: dict) -> LimitsApart:
    unknown = set(args) - {"cap"}
    if unknown:
        raise ValueError(f"{NAME}: unknown arguments {sorted(unknown)}")
    cap = float(args.get("cap", 1.5))
    if not 0 < cap <= 4:
        raise ValueError(f"{NAME}: cap must be in (0, 4], got {cap}")
    return LimitsApart(cap)
