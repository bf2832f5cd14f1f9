"""Filter: GPU functions on GPUs, CPU-only functions on the CPU, ``auto`` anywhere."""

from __future__ import annotations

import numpy as np

from dilu.policy.scheduler.framework import ClusterSnapshot, Device, PlacementRequest

NAME = "DeviceKind"


def fits(request: PlacementRequest, device: Device) -> bool:
    if request.gpu is True or request.gpus > 1:
        return device.kind == "gpu"
    if request.gpu is False:
        return device.kind == "cpu"
    return True


class DeviceKind:
    name = NAME

    def filter(self, request: PlacementRequest, snapshot: ClusterSnapshot) -> np.ndarray:
        if request.gpu is True or request.gpus > 1:
            return snapshot.is_gpu.copy()
        if request.gpu is False:
            return ~snapshot.is_gpu
        return np.ones(len(snapshot), dtype=bool)


def factory(args: dict) -> DeviceKind:
    if args:
        raise ValueError(f"{NAME} takes no arguments, got {sorted(args)}")
    return DeviceKind()
