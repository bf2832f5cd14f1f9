"""Score: fill active devices before waking an empty one (fewer GPUs in use, less fragmentation)."""

from __future__ import annotations

import numpy as np

from dilu.policy.scheduler.framework import ClusterSnapshot, Device, PlacementRequest

NAME = "ActiveFirst"


def score(request: PlacementRequest, device: Device) -> float:
    return 100.0 if device.functions else 0.0


class ActiveFirst:
    name = NAME

    def score(self, request: PlacementRequest, snapshot: ClusterSnapshot) -> np.ndarray:
        return np.where(snapshot.has_latency | snapshot.has_batch, 100.0, 0.0)


def factory(args: dict) -> ActiveFirst:
    if args:
        raise ValueError(f"{NAME} takes no arguments, got {sorted(args)}")
    return ActiveFirst()
