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
    lazy_desired: int | None = None      # the horizontal scaler's count, when the function is profiled
    prewarm_after_s: float | None = None  # keep-alive histogram: unload, then pre-warm this long after use
    lazy_reason: str = ""                 # why the horizontal scaler wants ``lazy_desired``


@dataclass(frozen=True)
class ReplicaDecision:
    desired: int
    reason: str


def desired_instances(ctx: ReplicaContext) -> ReplicaDecision:
    if ctx.status == "failed":
        return ReplicaDecision(0, "function failed to start; redeploy to retry")
    if ctx.status == "profiling":
        return ReplicaDecision(0, "profiling the new version")
    if ctx.status == "deploying":
        return ReplicaDecision(_clamp(ctx, max(ctx.min_instances, 1, ctx.current)),
                               "verifying the new deployment starts")
    demand = ctx.in_flight + ctx.queued
    if demand > 0:
        if ctx.current == 0:
            return ReplicaDecision(_clamp(ctx, max(ctx.min_instances, 1)), f"scale from zero: {demand} request(s) waiting")
        if ctx.lazy_desired is not None:
            desired = _clamp(ctx, max(ctx.lazy_desired, 1))
            return ReplicaDecision(desired, (ctx.lazy_reason or "horizontal scaler") if desired != ctx.current
                                   else "serving")
        needed = math.ceil(demand / max(1, ctx.concurrency_per_instance))
        desired = _clamp(ctx, max(needed, ctx.current, ctx.min_instances, 1))
        if desired > ctx.current:
            return ReplicaDecision(desired, f"{demand} concurrent request(s) need {needed} instance(s)")
        return ReplicaDecision(desired, "serving")
    idle_s = math.inf if ctx.last_active_at is None else ctx.now - ctx.last_active_at
    if ctx.prewarm_after_s is not None and idle_s < ctx.keep_alive_s:
        if idle_s < ctx.prewarm_after_s:
            if ctx.current > ctx.min_instances:
                return ReplicaDecision(ctx.min_instances, f"unloaded until the pre-warm at "
                                                          f"{ctx.prewarm_after_s:.1f}s after the last request")
            return ReplicaDecision(_clamp(ctx, ctx.min_instances), "waiting to pre-warm")
        if ctx.current == 0:
            return ReplicaDecision(_clamp(ctx, 1), f"pre-warm: the next request is due (idle {idle_s:.1f}s)")
        return ReplicaDecision(_clamp(ctx, ctx.current), "within keep-alive")
    if idle_s >= ctx.keep_alive_s:
        if ctx.current > ctx.min_instances:
            return ReplicaDecision(ctx.min_instances,
                                   f"idle for {min(idle_s, 1e9):.0f}s >= keep-alive {ctx.keep_alive_s:g}s")
        return ReplicaDecision(_clamp(ctx, ctx.min_instances), "at minimum")
    if ctx.lazy_desired is not None and ctx.current > 0:
        desired = _clamp(ctx, max(ctx.lazy_desired, 1))
        return ReplicaDecision(desired, (ctx.lazy_reason or "horizontal scaler") if desired != ctx.current
                               else "within keep-alive")
    return ReplicaDecision(_clamp(ctx, max(ctx.current, ctx.min_instances)), "within keep-alive")


def _clamp(ctx: ReplicaContext, value: int) -> int:
    return max(ctx.min_instances, min(ctx.max_instances, value))
