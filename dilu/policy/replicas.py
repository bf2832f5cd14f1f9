"""How many instances a function should have now: scale from zero, keep-alive, scale to zero.

A pure function of a frozen context, and the one place that decides scaling from zero. Under
load the lazy horizontal scaler's count applies (``lazy_desired``); when idle, keep-alive's
verdict (``dilu.policy.keepalive``) does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dilu.messages import FunctionStatus
from dilu.policy.keepalive import Verdict


@dataclass(frozen=True)
class ReplicaContext:
    status: str                      # deploying | ready | failed
    min_instances: int
    max_instances: int
    current: int                     # starting + ready instances of the current version
    starting: int = 0                # of ``current``, instances not ready yet
    in_flight: int = 0               # requests being served
    queued: int = 0                  # requests waiting for an instance
    concurrency_per_instance: int = 2
    lazy_desired: int | None = None      # the horizontal scaler's count, when the function is profiled
    lazy_reason: str = ""                 # why the horizontal scaler wants ``lazy_desired``
    keep: Verdict = Verdict.HOLD          # keep-alive's verdict for an idle function
    keep_reason: str = "within keep-alive"
    expected: bool = False                # a workflow request will need it soon (loading in the slack)
    release_idle: bool = False            # only workflows use it, and they load it again in time (slack, pre-warm)


@dataclass(frozen=True)
class ReplicaDecision:
    desired: int
    reason: str
    recheck_in_s: float | None = None   # decide again by then even if nothing happens (a pre-warm due)


def desired_instances(ctx: ReplicaContext) -> ReplicaDecision:
    if ctx.status == FunctionStatus.FAILED:
        return ReplicaDecision(0, "function failed to start; redeploy to retry")
    if ctx.status == FunctionStatus.PROFILING:
        return ReplicaDecision(0, "profiling the new version")
    if ctx.status == FunctionStatus.DEPLOYING:
        return ReplicaDecision(_clamp(ctx, max(ctx.min_instances, 1, ctx.current)),
                               "verifying the new deployment starts")
    demand = ctx.in_flight + ctx.queued
    if demand > 0:
        if ctx.current == 0:
            return ReplicaDecision(_clamp(ctx, max(ctx.min_instances, 1)),
                                   f"scale from zero: {demand} request(s) waiting")
        if ctx.lazy_desired is not None:
            desired = _clamp(ctx, max(ctx.lazy_desired, 1))
            return ReplicaDecision(desired, (ctx.lazy_reason or "horizontal scaler") if desired != ctx.current
                                   else "serving")
        if ctx.starting > 0 and ctx.in_flight == 0:
            # Requests queued behind a cold start wait for it; they are no measure of load yet.
            return ReplicaDecision(_clamp(ctx, max(ctx.current, ctx.min_instances)), "waiting for a starting instance")
        needed = math.ceil(demand / max(1, ctx.concurrency_per_instance))
        desired = _clamp(ctx, max(needed, ctx.current, ctx.min_instances, 1))
        if desired > ctx.current:
            return ReplicaDecision(desired, f"{demand} concurrent request(s) need {needed} instance(s)")
        return ReplicaDecision(desired, "serving")
    if ctx.expected:   # a workflow request will reach it soon: load it now, or keep what runs
        if ctx.current == 0:
            return ReplicaDecision(_clamp(ctx, max(ctx.min_instances, 1)), "pre-load: a workflow request needs it soon")
        return ReplicaDecision(_clamp(ctx, max(ctx.current, ctx.min_instances)),
                               "kept: a workflow request needs it soon")
    if ctx.release_idle and ctx.current > ctx.min_instances:
        return ReplicaDecision(ctx.min_instances, "workflow node idle: released until a workflow needs it again")
    if ctx.keep == Verdict.UNLOAD:
        if ctx.current > ctx.min_instances:
            return ReplicaDecision(ctx.min_instances, ctx.keep_reason)
        return ReplicaDecision(_clamp(ctx, ctx.min_instances), "at minimum")
    if ctx.keep == Verdict.WARM and ctx.current == 0:
        return ReplicaDecision(_clamp(ctx, 1), f"pre-warm: {ctx.keep_reason}")
    if ctx.lazy_desired is not None and ctx.current > 0:
        desired = _clamp(ctx, max(ctx.lazy_desired, 1))
        return ReplicaDecision(desired, (ctx.lazy_reason or "horizontal scaler") if desired != ctx.current
                               else ctx.keep_reason)
    return ReplicaDecision(_clamp(ctx, max(ctx.current, ctx.min_instances)), ctx.keep_reason)


def _clamp(ctx: ReplicaContext, value: int) -> int:
    return max(ctx.min_instances, min(ctx.max_instances, value))
