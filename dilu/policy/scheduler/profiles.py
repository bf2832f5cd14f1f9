"""Scheduling policies as configurations of one pipeline: Dilu's and the baselines."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from dilu.policy.scheduler.framework import Scheduler
from dilu.policy.scheduler.registry import build


class Policy(StrEnum):
    DILU = "dilu"
    EXCLUSIVE = "exclusive"        # whole GPUs
    STATIC_LIMITS = "static-limits"  # fixed slices sized by the limit (limits add up to <= 1)
    REQUEST_ONLY = "request-only"  # packing by requests alone, no limit cap, no preferences
    TIME_SHARING = "time-sharing"  # one latency + one batch function per GPU (priority time-sharing)


Plugins = list[tuple[str, dict[str, Any]]]

PROFILES: dict[Policy, tuple[Plugins, Plugins]] = {
    Policy.DILU: (
        [("DeviceKind", {}), ("MemoryFit", {}), ("ComputeRequests", {"cap": 1.0}),
         ("ComputeLimits", {"cap": 1.5, "batch_yields": True})],
        [("Affinity", {}), ("LimitsApart", {"cap": 1.5}), ("Complementary", {}), ("ActiveFirst", {}),
         ("BestFit2D", {})],
    ),
    Policy.EXCLUSIVE: ([("DeviceKind", {}), ("Exclusive", {})], [("BestFit2D", {})]),
    Policy.STATIC_LIMITS: (
        [("DeviceKind", {}), ("MemoryFit", {}), ("ComputeLimits", {"cap": 1.0})],
        [("ActiveFirst", {}), ("BestFit2D", {"by": "limit"})],
    ),
    Policy.REQUEST_ONLY: (
        [("DeviceKind", {}), ("MemoryFit", {}), ("ComputeRequests", {"cap": 1.0})],
        [("ActiveFirst", {}), ("BestFit2D", {})],
    ),
    Policy.TIME_SHARING: (
        [("DeviceKind", {}), ("MemoryFit", {}), ("PriorityPair", {})],
        [("Complementary", {}), ("ActiveFirst", {}), ("BestFit2D", {})],
    ),
}


def create_scheduler(policy: str | Policy = Policy.DILU) -> Scheduler:
    """The scheduler for a policy name; raises ValueError naming the known ones."""
    try:
        chosen = Policy(policy)
    except ValueError:
        raise ValueError(f"unknown scheduling policy {policy!r}; known: "
                         f"{', '.join(p.value for p in Policy)}") from None
    filters, scores = PROFILES[chosen]
    return Scheduler(chosen.value, [build(n, a) for n, a in filters], [build(n, a) for n, a in scores])
