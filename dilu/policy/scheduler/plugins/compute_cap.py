"""Filter: the sum of compute requests (or limits) on a GPU stays within a cap.

Dilu admits up to 1.0 of requests (guarantees never overlap) and 1.5 of limits (bursts may
overlap, since they rarely coincide). CPU devices are not compute-sliced and always pass.
"""

from __future__ import annotations

import numpy as np

from dilu.policy.scheduler.framework import ClusterSnapshot, Device, PlacementRequest

NAME_REQUESTS = "ComputeRequests"
NAME_LIMITS = "ComputeLimits"
EPSILON = 1e-9


def fits(request: PlacementRequest, device: Device, *, of: str, cap: float) -> bool:
    if device.kind != "gpu":
        return True
    used, wanted = (device.sm_requested, request.sm_request) if of == "request" else \
        (device.sm_limited, request.sm_limit)
    return used + wanted <= cap + EPSILON


class ComputeCap:
    def __init__(self, of: str, cap: float) -> None:
        self.of, self.cap = of, cap
        self.name = NAME_REQUESTS if of == "request" else NAME_LIMITS

    def filter(self, request: PlacementRequest, snapshot: ClusterSnapshot) -> np.ndarray:
        used, wanted = (snapshot.sm_requested, request.sm_request) if self.of == "request" else \
            (snapshot.sm_limited, request.sm_limit)
        return (used + wanted <= self.cap + EPSILON) | ~snapshot.is_gpu


def _cap(args: dict, name: str, default: float) -> float:
    unknown = set(args) - {"cap"}
    if unknown:
        raise ValueError(f"{name}: unknown arguments {sorted(unknown)}")
    cap = float(args.get("cap", default))
    if not 0 < cap <= 4:
        raise ValueError(f"{name}: cap must be in (0, 4], got {cap}")
    return cap


def requests_factory(args: dict) -> ComputeCap:
    return ComputeCap("request", _cap(args, NAME_REQUESTS, 1.0))


def limits_factory(args: dict) -> ComputeCap:
    return ComputeCap("limit", _cap(args, NAME_LIMITS, 1.5))
