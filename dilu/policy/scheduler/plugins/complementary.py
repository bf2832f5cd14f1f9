"""Score: prefer complementary pairs - a latency function beside batch work, batch work beside
latency functions - since their demands peak at different times."""

from __future__ import annotations

import numpy as np

from dilu.policy.scheduler.framework import ClusterSnapshot, Device, PlacementRequest

NAME = "Complementary"


def score(request: PlacementRequest, device: Device) -> float:
    other = bool(device.batch_functions) if request.cls == "latency" else bool(device.latency_functions)
    same = bool(device.latency_functions) if request.cls == "latency" else bool(device.batch_functions)
    return 100.0 if other and not same else 50.0 if other else 0.0


class Complementary:
    name = NAME

    def score(self, request: PlacementRequest, snapshot: ClusterSnapshot) -> np.ndarray:
        other = snapshot.has_batch if request.cls == "latency" else snapshot.has_latency
        same = snapshot.has_latency if request.cls == "latency" else snapshot.has_batch
        return np.where(other & ~same, 100.0, np.where(other, 50.0, 0.0))


def factory(args: dict) -> Complementary:
    if args:
        raise ValueError(f"{NAME} takes no arguments, got {sorted(args)}")
    return Complementary()
