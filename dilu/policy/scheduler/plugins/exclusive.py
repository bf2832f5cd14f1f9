"""Filter: only empty devices (the whole-GPU baseline)."""

from __future__ import annotations

import numpy as np

from dilu.policy.scheduler.framework import ClusterSnapshot, Device, PlacementRequest

NAME = "Exclusive"


def fits(request: PlacementRequest, device: Device) -> bool:
    return not device.functions


class Exclusive:
    name = NAME

    def filter(self, request: PlacementRequest, snapshot: ClusterSnapshot) -> np.ndarray:
        return ~(snapshot.has_latency | snapshot.has_batch)


def factory(args: dict) -> Exclusive:
    if args:
        raise ValueError(f"{NAME} takes no arguments, got {sorted(args)}")
    return Exclusive()
