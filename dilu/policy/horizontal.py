"""Horizontal scaling, lazily: add instances only when an overload outlasts what vertical scaling
can absorb, remove them when capacity has stayed unused.

Every ``interval_s`` the controller records the last second's request rate. Over a sliding window
of ``window`` samples: scale out when at least ``out_samples`` exceed N x per-instance throughput
*and* the instances already run at their compute limits (vertical headroom is used up); scale in
when at least ``in_samples`` are below (N - 1) x throughput. The window is cleared after acting,
so the next decision needs fresh evidence. Scaling from zero is not decided here but in
``dilu.policy.replicas`` (at once, when a request waits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class HorizontalParams:
    interval_s: float = 1.0
    window: int = 40
    out_samples: int = 20
    in_samples: int = 30


@dataclass(frozen=True)
class HorizontalContext:
    now: float
    current: int
    min_instances: int
    max_instances: int
    rate_per_s: float                 # requests in the last second
    throughput_per_instance: float    # from the profile
    queued: int = 0
    at_vertical_limit: bool = True    # every instance already runs at its compute limit
    params: HorizontalParams = HorizontalParams()


@dataclass(frozen=True)
class HorizontalState:
    samples: tuple[float, ...] = ()
    last_sample_at: float | None = None


@dataclass(frozen=True)
class ScaleDecision:
    desired: int
    reason: str = ""
    changed: bool = field(default=False)


def decide(ctx: HorizontalContext, state: HorizontalState) -> tuple[ScaleDecision, HorizontalState]:
    params = ctx.params
    clamp = lambda n: max(ctx.min_instances, min(ctx.max_instances, n))  # noqa: E731
    if state.last_sample_at is not None and ctx.now - state.last_sample_at < params.interval_s:
        return ScaleDecision(ctx.current), state
    samples = (state.samples + (ctx.rate_per_s,))[-params.window:]
    state = HorizontalState(samples, ctx.now)
    capacity = ctx.throughput_per_instance
    if capacity <= 0 or ctx.current == 0:
        return ScaleDecision(ctx.current), state
    over = [s for s in samples if s > ctx.current * capacity]
    if len(over) >= params.out_samples and ctx.current < ctx.max_instances:
        if not ctx.at_vertical_limit:
            return ScaleDecision(ctx.current, "overloaded, but instances still have vertical headroom"), state
        needed = math.ceil(sorted(over)[len(over) // 2] / capacity)
        desired = clamp(max(ctx.current + 1, needed))
        return ScaleDecision(desired, f"{len(over)}/{len(samples)} samples above {ctx.current} x "
                                      f"{capacity:g} req/s", True), HorizontalState((), ctx.now)
    under = [s for s in samples if s < (ctx.current - 1) * capacity]
    if len(under) >= params.in_samples and ctx.current > max(ctx.min_instances, 1):
        return ScaleDecision(ctx.current - 1, f"{len(under)}/{len(samples)} samples below "
                                              f"{ctx.current - 1} x {capacity:g} req/s", True), \
            HorizontalState((), ctx.now)
    return ScaleDecision(ctx.current), state
