"""Filter: GPU functions on GPUs, CPU-only functions on the CPU, ``auto`` anywhere but a simulated
GPU (one of the fake driver runs no framework's kernels: a torch function would fail there)."""

from __future__ import annotations

import numpy as np

from dilu.policy.scheduler.framework import ClusterSnapshot, Device, PlacementRequest

NAME = "DeviceKind"


def fits(request: PlacementRequest, device: Device) -> bool:
    if request.gpu is True or request.gpus > 1:
        return device.kind == "gpu"
    if request.gpu is False:
        return device.kind == "cpu"
    return not device.simulated


class DeviceKind:
    name = NAME

    def filter(self, request: PlacementRequest, snapshot: ClusterSnapshot) -> np.ndarray:
        if request.gpu is True or request.gpus > 1:
            return snapshot.is_gpu.copy()
        if request.gpu is False:
            return ~snapshot.is_gpu
        return ~snapshot.is_simulated

    def explain(self, request: PlacementRequest, snapshot: ClusterSnapshot, turned_away: np.ndarray) -> str:
        if request.gpu is True or request.gpus > 1:
            gpus = int(np.count_nonzero(snapshot.is_gpu))
            asked = "a GPU" if request.gpus <= 1 else f"{request.gpus} GPUs on one host"
            return (f"it needs {asked} (resources.gpu: true) and no worker has one" if not gpus
                    else f"it needs {asked} and {gpus} GPU(s) are known")
        if request.gpu is False:
            return "it runs on the CPU only (resources.gpu: false) and no worker is a CPU worker"
        return "its gpu: auto does not run on a simulated GPU, and no other worker is known"


def factory(args: dict) -> DeviceKind:
    if args:
        raise ValueError(f"{NAME} takes no arguments, got {sorted(args)}")
    return DeviceKind()
