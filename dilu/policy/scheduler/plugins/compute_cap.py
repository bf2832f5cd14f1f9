"""Filter: the sum of compute requests (or limits) on a GPU stays within a cap.

Dilu admits up to 1.0 of requests (guarantees never overlap) and 1.5 of limits (bursts may
overlap, since they rarely coincide). With ``batch_yields`` (Dilu's isolation: batch work is held
while latency work runs, so a batch instance's burst never overlaps a latency burst) a batch
instance counts at its request against latency limits, and at its limit against other batch
work's limits. CPU devices are not compute-sliced and always pass.
"""

from __future__ import annotations

import numpy as np

from dilu.policy.scheduler.framework import ClusterSnapshot, Device, PlacementRequest

NAME_REQUESTS = "ComputeRequests"
NAME_LIMITS = "ComputeLimits"
EPSILON = 1e-9


def totals(request: PlacementRequest, device: Device | ClusterSnapshot, *, of: str,
           batch_yields: bool = False) -> list:
    """What each cap would hold with ``request`` added: one total, or with ``batch_yields`` two
    (latency limits with batch requests; batch limits, for a batch request). Works on one
    ``Device`` or on a snapshot's arrays alike."""
    if of == "request":
        return [device.sm_requested + request.sm_request]
    if not batch_yields:
        return [device.sm_limited + request.sm_limit]
    latency_limits = device.sm_limited - device.sm_limited_batch
    if request.cls == "latency":
        return [latency_limits + device.sm_requested_batch + request.sm_limit]
    return [latency_limits + device.sm_requested_batch + request.sm_request,
            device.sm_limited_batch + request.sm_limit]


def fits(request: PlacementRequest, device: Device, *, of: str, cap: float, batch_yields: bool = False) -> bool:
    if device.kind != "gpu":
        return True
    return all(total <= cap + EPSILON for total in totals(request, device, of=of, batch_yields=batch_yields))


class ComputeCap:
    def __init__(self, of: str, cap: float, batch_yields: bool = False) -> None:
        self.of, self.cap, self.batch_yields = of, cap, batch_yields
        self.name = NAME_REQUESTS if of == "request" else NAME_LIMITS

    def filter(self, request: PlacementRequest, snapshot: ClusterSnapshot) -> np.ndarray:
        within = np.ones(len(snapshot), dtype=bool)
        for total in totals(request, snapshot, of=self.of, batch_yields=self.batch_yields):
            within &= total <= self.cap + EPSILON
        return within | ~snapshot.is_gpu

    def explain(self, request: PlacementRequest, snapshot: ClusterSnapshot, turned_away: np.ndarray) -> str:
        asked = request.sm_request if self.of == "request" else request.sm_limit
        held = snapshot.sm_requested if self.of == "request" else snapshot.sm_limited
        room = float(np.max(np.where(turned_away, self.cap - held, -np.inf)))
        return (f"it asks for a compute {self.of} of {asked:g} (resources.sm_{self.of}) and the most any GPU has "
                f"left is {max(room, 0.0):g} of {self.cap:g}")


def parse_args(args: dict, name: str, default: float, flags: tuple[str, ...] = ()) -> tuple[float, dict]:
    """A plugin's ``cap`` (in (0, 4], ``default`` when absent) and boolean ``flags``; ValueError
    naming ``name`` for anything else."""
    unknown = set(args) - {"cap", *flags}
    if unknown:
        raise ValueError(f"{name}: unknown arguments {sorted(unknown)}")
    cap = float(args.get("cap", default))
    if not 0 < cap <= 4:
        raise ValueError(f"{name}: cap must be in (0, 4], got {cap}")
    for flag in flags:
        if not isinstance(args.get(flag, False), bool):
            raise ValueError(f"{name}: {flag} must be true or false")
    return cap, {flag: args.get(flag, False) for flag in flags}


def requests_factory(args: dict) -> ComputeCap:
    cap, _ = parse_args(args, NAME_REQUESTS, 1.0)
    return ComputeCap("request", cap)


def limits_factory(args: dict) -> ComputeCap:
    cap, flags = parse_args(args, NAME_LIMITS, 1.5, ("batch_yields",))
    return ComputeCap("limit", cap, **flags)
