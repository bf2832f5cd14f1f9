"""Filter: memory is never oversubscribed."""

from __future__ import annotations

import numpy as np

from dilu.policy.scheduler.framework import ClusterSnapshot, Device, PlacementRequest, gib

NAME = "MemoryFit"


def fits(request: PlacementRequest, device: Device) -> bool:
    return device.memory_used + request.memory_bytes <= device.memory_bytes


class MemoryFit:
    name = NAME

    def filter(self, request: PlacementRequest, snapshot: ClusterSnapshot) -> np.ndarray:
        return snapshot.memory_used + request.memory_bytes <= snapshot.memory_total

    def explain(self, request: PlacementRequest, snapshot: ClusterSnapshot, turned_away: np.ndarray) -> str:
        free = snapshot.memory_total - snapshot.memory_used
        best = int(np.argmax(np.where(turned_away, free, -1.0)))
        device = snapshot.devices[best]
        return (f"it asks for {gib(request.memory_bytes)} of memory (resources.memory) and the most any worker "
                f"has free is {gib(free[best])} ({device.id}, of {gib(device.memory_bytes)})")


def factory(args: dict) -> MemoryFit:
    if args:
        raise ValueError(f"{NAME} takes no arguments, got {sorted(args)}")
    return MemoryFit()
