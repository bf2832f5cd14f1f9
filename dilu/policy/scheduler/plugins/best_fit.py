"""Score: 2D best fit - prefer the device left fullest in compute and memory.

cost = w_sm x (1 - compute requested after) + w_mem x (1 - memory used after) (lower is better);
score = 100 x (1 - cost). ``by`` chooses which compute sum counts (requests, or limits for the
static-slice baseline).
"""

from __future__ import annotations

import numpy as np

from dilu.policy.scheduler.framework import ClusterSnapshot, Device, PlacementRequest

NAME = "BestFit2D"


def score(request: PlacementRequest, device: Device, *, sm_weight: float = 0.6, memory_weight: float = 0.4,
          by: str = "request") -> float:
    compute = (device.sm_requested + request.sm_request) if by == "request" else \
        (device.sm_limited + request.sm_limit)
    memory = (device.memory_used + request.memory_bytes) / device.memory_bytes
    cost = sm_weight * (1 - min(compute, 1.0)) + memory_weight * (1 - min(memory, 1.0))
    return 100.0 * (1 - cost)


class BestFit2D:
    name = NAME

    def __init__(self, sm_weight: float, memory_weight: float, by: str) -> None:
        self.sm_weight, self.memory_weight, self.by = sm_weight, memory_weight, by

    def score(self, request: PlacementRequest, snapshot: ClusterSnapshot) -> np.ndarray:
        compute = (snapshot.sm_requested + request.sm_request) if self.by == "request" else \
            (snapshot.sm_limited + request.sm_limit)
        memory = (snapshot.memory_used + request.memory_bytes) / snapshot.memory_total
        cost = self.sm_weight * (1 - np.minimum(compute, 1.0)) + self.memory_weight * (1 - np.minimum(memory, 1.0))
        return 100.0 * (1 - cost)


def factory(args: dict) -> BestFit2D:
    unknown = set(args) - {"sm_weight", "memory_weight", "by"}
    if unknown:
        raise ValueError(f"{NAME}: unknown arguments {sorted(unknown)}")
    sm_weight, memory_weight = float(args.get("sm_weight", 0.6)), float(args.get("memory_weight", 0.4))
    by = args.get("by", "request")
    if sm_weight < 0 or memory_weight < 0 or abs(sm_weight + memory_weight - 1.0) > 1e-9:
        raise ValueError(f"{NAME}: weights must be >= 0 and add up to 1")
    if by not in ("request", "limit"):
        raise ValueError(f"{NAME}: by must be 'request' or 'limit'")
    return BestFit2D(sm_weight, memory_weight, by)
