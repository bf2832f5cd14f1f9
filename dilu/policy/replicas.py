"""How many instances a function should have now: scale from zero, keep-alive, scale to zero.

A pure function of a frozen context. The lazy sliding-window scaler of a later issue refines
the "under load" branch; the other branches stay.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ReplicaContext:
    now: float                       # unix seconds
    status: str                      # deploying | ready | failed
    min_instances: int
    max_instances: int
    keep_alive_s: float
    current: int                     # starting + ready instances of the current version
    in_flight: int = 0               # requests being served
    queued: int = 0                  # requests waiting for an instance
    last_active_at: float | None = None  # last request, or when the deployment became ready
    concurrency_per_instance: int = 2


@dataclass(frozen=True)
class ReplicaDecision:
    desired: int
    reason: str


def desired_instances(ctx: ReplicaContext) -> ReplicaDecision:
    if ctx.status == "failed":
        return ReplicaDecision(0, "function failed to start; redeploy to retry")
    if ctx.status == "deploying":
        return ReplicaDecision(_clamp(ctx, max(ctx.min_instances, 1, ctx.current)),
                               "verifying the new deployment starts")
    demand = ctx.in_flight + ctx.queued
    if demand > 0:
        needed = math.ceil(demand / max(1, ctx.concurrency_per_instance))
        desired = _clamp(ctx, max(needed, ctx.current, ctx.min_instances, 1))
        if ctx.current == 0:
            return ReplicaDecision(desired, f"scale from zero: {demand} request(s) waiting")
        if desired > ctx.current:
            return ReplicaDecision(desired, f"{demand} concurrent request(s) need {needed} instance(s)")
        return ReplicaDecision(desired, "serving")
    idle_s = math.inf if ctx.last_active_at is None else ctx.now - ctx.last_active_at
    if idle_s >= ctx.keep_alive_s:
        if ctx.current > ctx.min_instances:
            return ReplicaDecision(ctx.min_instances,
                                   f"idle for {min(idle_s, 1e9):.0f}s >= keep-alive {ctx.keep_alive_s:g}s")
        return ReplicaDecision(_clamp(ctx, ctx.min_instances), "at minimum")
    return ReplicaDecision(_clamp(ctx, max(ctx.current, ctx.min_instances)), "within keep-alive")


def _clamp(ctx: ReplicaContext, value: int) -> int:
    return max(ctx.min_instances, min(ctx.max_instances, value))
