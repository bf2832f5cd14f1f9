"""Filter: memory is never oversubscribed."""

from __future__ import annotations

import numpy as np

from dilu.policy.scheduler.framework import ClusterSnapshot, Device, PlacementRequest

NAME = "MemoryFit"


def fits(request: PlacementRequest, device: Device) -> bool:
    return device.memory_used + request.memory_bytes <= device.memory_bytes


class MemoryFit:
    name = NAME

    def filter(self, request: PlacementRequest, snapshot: ClusterSnapshot) -> np.ndarray:
        return snapshot.memory_used + request.memory_bytes <= snapshot.memory_total


def factory(args: dict) -> MemoryFit:
    if args:
        raise ValueError(f"{NAME} takes no arguments, got {sorted(args)}")
    return MemoryFit()
