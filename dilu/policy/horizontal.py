"""Horizontal scaling: add instances as soon as an overload grows past what vertical scaling can
absorb, remove them lazily, when capacity has stayed unused.

Every ``interval_s`` the controller records a sample: a second's request rate and the requests
outstanding (in flight or queued, streams for their whole duration). A sample is *over* N
instances when its rate exceeds N x per-instance throughput, when more requests are outstanding
than N instances answer within the latency target (N x throughput x target, Little's law), or
when more are outstanding than N instances hold at their target concurrency (occupancy: a
stream of 10 s is one request in a rate but occupies its slot all along): clients with bounded
connection pools send no faster than they are answered, so under overload their rate stalls at
what is served while their requests pile up. Scale out when the instances already run at their compute
limits (vertical headroom is used up) and either the newest sample is over N with more requests
outstanding than the sample before (the trend: waiting for a count of overloaded seconds would
let a burst miss its SLO for that long, and then for a cold start) or, over a sliding window of
``window`` samples, at least ``out_samples`` are over N; scale in when at least ``in_samples`` are under N - 1 by both
measures. The window is cleared after acting, so the next decision needs fresh evidence. Scaling
from zero is not decided here but in ``dilu.policy.replicas`` (at once, when a request waits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple


@dataclass(frozen=True)
class HorizontalParams:
    interval_s: float = 1.0
    window: int = 60
    out_samples: int = 20
    in_samples: int = 60       # a quiet minute: bursts a minute apart keep their instance
    trend: bool = True         # the newest sample over with the backlog growing: scale out now


@dataclass(frozen=True)
class HorizontalContext:
    now: float
    current: int
    min_instances: int
    max_instances: int
    rate_per_s: float                 # requests in the last second
    throughput_per_instance: float    # from the profile
    queued: int = 0                   # requests waiting for an instance
    at_vertical_limit: bool = True    # every instance already runs at its compute limit
    params: HorizontalParams = HorizontalParams()
    in_flight: int = 0                # requests the instances have and have not answered yet
    latency_target_s: float = math.inf   # the function's p99 target (inf: outstanding requests never count)
    target_concurrency: float = math.inf  # requests in flight per instance before another is added


class Sample(NamedTuple):
    rate_per_s: float
    outstanding: int     # in flight + queued when the sample was taken


@dataclass(frozen=True)
class HorizontalState:
    samples: tuple[Sample, ...] = ()
    last_sample_at: float | None = None
    previous: Sample | None = None    # the sample before the newest, kept when the window clears


@dataclass(frozen=True)
class ScaleDecision:
    desired: int
    reason: str = ""
    changed: bool = field(default=False)


def decide(ctx: HorizontalContext, state: HorizontalState) -> tuple[ScaleDecision, HorizontalState]:
    params = ctx.params

    def clamp(n: int) -> int:
        return max(ctx.min_instances, min(ctx.max_instances, n))

    if state.last_sample_at is not None and ctx.now - state.last_sample_at < params.interval_s:
        return ScaleDecision(ctx.current), state
    newest = Sample(ctx.rate_per_s, ctx.in_flight + ctx.queued)
    samples = (state.samples + (newest,))[-params.window:]
    before = state.samples[-1] if state.samples else state.previous
    state = HorizontalState(samples, ctx.now, before)
    capacity = ctx.throughput_per_instance
    if capacity <= 0 or ctx.current == 0:
        return ScaleDecision(ctx.current), state
    holds = capacity * ctx.latency_target_s    # outstanding requests one instance answers in time

    holds = min(holds, ctx.target_concurrency)

    def over(sample: Sample, instances: int) -> bool:
        return sample.rate_per_s > instances * capacity or sample.outstanding > instances * holds

    def under(sample: Sample, instances: int) -> bool:
        return sample.rate_per_s < instances * capacity and sample.outstanding <= instances * holds

    above = [s for s in samples if over(s, ctx.current)]
    # On the trend: a second over capacity whose backlog grew since the second before.
    rising = params.trend and before is not None and over(newest, ctx.current) and \
        newest.outstanding > before.outstanding
    if rising:
        above = [newest]
    if (rising or len(above) >= params.out_samples) and ctx.current < ctx.max_instances:
        if not ctx.at_vertical_limit:
            return ScaleDecision(ctx.current, "overloaded, but instances still have vertical headroom"), state
        # Sized by the median rate over and by the median occupancy over (at the target), at
        # least one more; a backlog seen only against the latency target adds one instance.
        rates = sorted(s.rate_per_s for s in above)
        by_occupancy = _occupancy_need(sorted(s.outstanding for s in above), ctx.target_concurrency)
        desired = clamp(max(ctx.current + 1, math.ceil(rates[len(rates) // 2] / capacity), by_occupancy))
        backlog = f" or {holds:.3g} outstanding per instance" if math.isfinite(holds) else ""
        return ScaleDecision(desired, f"{len(above)}/{len(samples)} samples above {ctx.current} x "
                                      f"{capacity:g} req/s{backlog}", True), HorizontalState((), ctx.now, newest)
    below = [s for s in samples if under(s, ctx.current - 1)]
    if len(below) >= params.in_samples and ctx.current > max(ctx.min_instances, 1):
        return ScaleDecision(ctx.current - 1, f"{len(below)}/{len(samples)} samples below "
                                              f"{ctx.current - 1} x {capacity:g} req/s", True), \
            HorizontalState((), ctx.now, newest)
    return ScaleDecision(ctx.current), state


def _occupancy_need(outstanding: list[int], target: float) -> int:
    """Instances that hold the median of ``outstanding`` (sorted) at ``target`` each (0: no target)."""
    if not outstanding or not math.isfinite(target) or target <= 0:
        return 0
    return math.ceil(outstanding[len(outstanding) // 2] / target)
