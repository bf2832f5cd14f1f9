"""Score: a latency function goes first to the GPUs of the batch jobs it already shares a GPU with
(and a batch job to the GPUs of the latency functions it already shares with), so pairs known to
get along stay together."""

from __future__ import annotations

import numpy as np

from dilu.policy.scheduler.framework import ClusterSnapshot, Device, PlacementRequest

NAME = "Affinity"


def partners(request: PlacementRequest, devices: tuple[Device, ...]) -> frozenset[str]:
    """The jobs of the other class that already share a device with ``request.function``."""
    found: set[str] = set()
    for device in devices:
        if request.function in device.functions:
            found |= device.batch_functions if request.cls == "latency" else device.latency_functions
    return frozenset(found - {request.function})


def score(request: PlacementRequest, device: Device, partner_set: frozenset[str]) -> float:
    return 100.0 if partner_set & device.functions else 0.0


class Affinity:
    name = NAME

    def score(self, request: PlacementRequest, snapshot: ClusterSnapshot) -> np.ndarray:
        result = np.zeros(len(snapshot))
        mine = snapshot.devices_of.get(request.function, frozenset())
        if not mine:
            return result
        partner_set = partners(request, tuple(snapshot.devices[i] for i in mine))
        for name in partner_set:
            result[list(snapshot.devices_of.get(name, ()))] = 100.0
        return result


def factory(args: dict) -> Affinity:
    if args:
        raise ValueError(f"{NAME} takes no arguments, got {sorted(args)}")
    return Affinity()
