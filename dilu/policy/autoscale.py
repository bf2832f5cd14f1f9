"""One function's instance count, composed from the scaling policies: the one composition the
controller and the simulator both call.

Each pass (the controller's reconcile, the simulator's second) hands ``plan`` what it sees of a
function; ``plan`` runs the lazy horizontal scaler (``dilu.policy.horizontal``) when the function
is profiled, keep-alive (``dilu.policy.keepalive``) with the time idle so far, and lets
``dilu.policy.replicas`` pick between them. A baseline that scales to the rate at once passes its
own count (``by_rate``) instead of the lazy scaler's. Pure: the clock is ``inputs.now``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from dilu.messages import FunctionStatus
from dilu.policy import horizontal, keepalive
from dilu.policy.replicas import ReplicaContext, ReplicaDecision, desired_instances


@dataclass(frozen=True)
class ScalingParams:
    horizontal: horizontal.HorizontalParams = horizontal.HorizontalParams()
    keepalive: keepalive.KeepAliveParams = keepalive.KeepAliveParams()


@dataclass(frozen=True)
class ScalingState:
    horizontal: horizontal.HorizontalState = field(default_factory=horizontal.HorizontalState)
    keepalive: keepalive.KeepAliveState = field(default_factory=keepalive.KeepAliveState)


@dataclass(frozen=True)
class ScalingInputs:
    now: float
    current: int                        # starting + ready instances of the current version
    min_instances: int = 0
    max_instances: int = 1
    status: str = FunctionStatus.READY
    starting: int = 0
    in_flight: int = 0
    queued: int = 0
    concurrency_per_instance: int = 2   # unprofiled: in flight per instance before another is added
    target_concurrency: float = math.inf   # the target in flight per instance (``scaling.target_concurrency``)
    rate_per_s: float = 0.0             # requests in the newest complete second
    throughput_per_instance: float | None = None   # from the profile; None: not profiled (no lazy scaling)
    at_vertical_limit: bool = True
    latency_target_s: float = math.inf
    idle_s: float = math.inf            # since the last request (or since the function became ready)
    cold_start_s: float = 2.0           # the version's measured cold start
    keep_alive_s: float = 60.0          # the spec's fixed keep-alive
    memory_gb: float = 0.0              # what an idle instance holds
    expected: bool = False              # a workflow request will need it soon
    release_idle: bool = False          # only workflows use it, and they load it again in time


def observe_second(state: ScalingState, second: float, requests: int, params: ScalingParams = ScalingParams()
                   ) -> ScalingState:
    """Records a second in which the function had ``requests`` (its idle times and busy rate feed
    keep-alive)."""
    return ScalingState(state.horizontal, keepalive.observe(state.keepalive, second, params.keepalive,
                                                            requests=requests))


def plan(inputs: ScalingInputs, state: ScalingState, params: ScalingParams = ScalingParams(),
         by_rate: int | None = None) -> tuple[ReplicaDecision, ScalingState]:
    """How many instances the function should have now, and the policies' new state."""
    lazy, reason, horizontal_state = by_rate, "scaled to the rate" if by_rate is not None else "", state.horizontal
    if by_rate is None and inputs.throughput_per_instance and inputs.status == FunctionStatus.READY:
        decision, horizontal_state = horizontal.decide(horizontal.HorizontalContext(
            inputs.now, inputs.current, inputs.min_instances, inputs.max_instances, inputs.rate_per_s,
            inputs.throughput_per_instance, queued=inputs.queued, at_vertical_limit=inputs.at_vertical_limit,
            params=params.horizontal, in_flight=inputs.in_flight, latency_target_s=inputs.latency_target_s,
            target_concurrency=inputs.target_concurrency),
            state.horizontal)
        lazy, reason = decision.desired, decision.reason
    keep = keepalive.decide(state.keepalive, inputs.idle_s, fixed_keep_alive_s=inputs.keep_alive_s,
                            cold_start_s=inputs.cold_start_s, params=params.keepalive, memory_gb=inputs.memory_gb)
    decision = desired_instances(ReplicaContext(
        status=inputs.status, min_instances=inputs.min_instances, max_instances=inputs.max_instances,
        current=inputs.current, starting=inputs.starting, in_flight=inputs.in_flight, queued=inputs.queued,
        concurrency_per_instance=inputs.concurrency_per_instance, lazy_desired=lazy, lazy_reason=reason,
        keep=keep.verdict, keep_reason=keep.reason, expected=inputs.expected, release_idle=inputs.release_idle))
    if keep.prewarm_at_idle_s is not None and math.isfinite(inputs.idle_s):
        # Nothing else may bring the function up for a decision before its pre-warm is due.
        decision = replace(decision, recheck_in_s=max(0.0, keep.prewarm_at_idle_s - inputs.idle_s))
    return decision, ScalingState(horizontal_state, state.keepalive)
