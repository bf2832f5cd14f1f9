"""Filter: at most one latency (high-priority) and one batch (low-priority) function per device,
the shape of priority time-sharing (TGS-like): the batch work runs in what the latency work
leaves, so two of a kind would compete at one priority."""

from __future__ import annotations

import numpy as np

from dilu.policy.scheduler.framework import ClusterSnapshot, Device, PlacementRequest

NAME = "PriorityPair"


def fits(request: PlacementRequest, device: Device) -> bool:
    return not (device.latency_functions if request.cls == "latency" else device.batch_functions)


class PriorityPair:
    name = NAME

    def filter(self, request: PlacementRequest, snapshot: ClusterSnapshot) -> np.ndarray:
        return ~(snapshot.has_latency if request.cls == "latency" else snapshot.has_batch)


def factory(args: dict) -> PriorityPair:
    if args:
        raise ValueError(f"{NAME} takes no arguments, got {sorted(args)}")
    return PriorityPair()
