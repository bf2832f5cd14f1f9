"""Keep-alive and pre-warming from a per-function histogram of idle times.

Each gap between two of a function's requests that the controller can see (it counts requests
per second, so gaps are whole seconds, one or more) is an idle time. The decision, taken every
pass with the time idle so far ``t``, conditions the histogram on ``t``: only the idle times
longer than ``t`` say when the next request can still come. With ``head`` the 5th percentile
of those, the next request is unlikely before ``head``:

- ``t`` under ``burst_s``: the function is inside a burst; keep (never unload between the
  requests of a burst).
- ``head - t`` shorter than a cold start (the function version's measured cold-start time plus
  a margin) plus ``min_unload_s``: the next request is due too soon for unloading to pay (an
  instance unloaded for a few seconds saves little and costs a start); keep it warm, and
  pre-warm one if none runs.
- otherwise: unload now; the instance is pre-warmed once ``t`` reaches ``head`` less the
  cold start, so it is ready when the next request is due.
- ``t`` beyond every idle time seen: the histogram knows nothing of what comes next, so the
  spec's fixed ``keep_alive_s`` applies (a function that has only seen steady traffic is not
  unloaded at its first pause).

New functions (fewer than ``min_samples`` idle times) keep the spec's fixed ``keep_alive_s``.
Times are seconds; ``now`` is always an argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True)
class KeepAliveParams:
    min_samples: int = 10
    history: int = 500
    head_percentile: float = 5.0
    margin: float = 0.15          # widens the cold-start lead
    burst_s: float = 2.0          # idle less than this is inside a burst
    lead_s: float = 1.0           # pre-warm this much earlier than the cold start alone needs
    min_unload_s: float = 10.0    # unload only when the instance would stay unloaded this long
    min_later: int = 1            # idle times longer than the current one needed to predict from them
    request_worth_gb_s: float = 50.0  # idle memory (GB x s) worth one request not delayed by a cold start
    rate_weight: float = 0.2      # of the newest busy second in the busy-second rate (a moving average)
    weighed_extension: float = 1.0   # without a prediction, hold up to this x the keep-alive longer when
                                     # the memory held is worth less than the requests a cold start delays


@dataclass(frozen=True)
class KeepAliveState:
    idle_times: tuple[float, ...] = ()
    last_request_at: float | None = None
    busy_rate: float = 0.0        # requests per second in the seconds that had any (moving average)


class Verdict(StrEnum):
    HOLD = "hold"       # keep what runs, start nothing
    WARM = "warm"       # keep what runs, and have at least one instance (pre-warm)
    UNLOAD = "unload"   # down to the minimum


@dataclass(frozen=True)
class KeepAliveDecision:
    verdict: Verdict
    mode: str           # "histogram" | "fixed"
    reason: str
    prewarm_at_idle_s: float | None = None   # unloaded now, warmed again at this much idle time


def observe(state: KeepAliveState, request_at: float, params: KeepAliveParams = KeepAliveParams(),
            gap_min_s: float = 1.0, requests: int = 1) -> KeepAliveState:
    """Records ``requests`` arriving at ``request_at`` (a second's count, for the controller); a gap
    of at least ``gap_min_s`` since the previous one is an idle time."""
    rate = requests if state.busy_rate == 0 else \
        (1 - params.rate_weight) * state.busy_rate + params.rate_weight * requests
    if state.last_request_at is None or request_at <= state.last_request_at:
        return KeepAliveState(state.idle_times, request_at if state.last_request_at is None
                              else max(state.last_request_at, request_at), rate)
    gap = request_at - state.last_request_at
    idle = (state.idle_times + (gap,))[-params.history:] if gap >= gap_min_s else state.idle_times
    return KeepAliveState(idle, request_at, rate)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def decide(state: KeepAliveState, idle_s: float, *, fixed_keep_alive_s: float, cold_start_s: float,
           params: KeepAliveParams = KeepAliveParams(), memory_gb: float = 0.0) -> KeepAliveDecision:
    """What to do with a function that has been idle for ``idle_s`` (no request waiting); an
    instance holds ``memory_gb`` while it waits (0: holding is taken to cost nothing, so the
    histogram alone decides)."""
    idle = list(state.idle_times)
    if len(idle) < params.min_samples:
        return _weighed(state, idle_s, fixed_keep_alive_s, cold_start_s, params, memory_gb,
                        f"{len(idle)} idle times so far")
    if idle_s < params.burst_s:
        return KeepAliveDecision(Verdict.HOLD, "histogram", "inside a burst")
    later = [t for t in idle if t > idle_s]
    if len(later) < params.min_later:
        return _weighed(state, idle_s, fixed_keep_alive_s, cold_start_s, params, memory_gb,
                        f"longer than all but {len(later)} of {len(idle)} idle times seen")
    head = percentile(later, params.head_percentile)
    lead = cold_start_s * (1 + params.margin) + params.lead_s
    if head - idle_s <= lead:
        return KeepAliveDecision(Verdict.WARM, "histogram", f"next request due in {max(0.0, head - idle_s):.1f}s, "
                                                            f"within a {cold_start_s:.1f}s cold start")
    if head - idle_s <= lead + params.min_unload_s:
        return KeepAliveDecision(Verdict.HOLD, "histogram", f"next request due in {head - idle_s:.1f}s: "
                                                            "too soon to unload")
    # Unloading risks a cold start when the next request comes before the pre-warmed instance is
    # ready: as often as that happened among the idle times seen (smoothed, so that few of them
    # are no proof of safety), and then a busy second's requests wait for it. It pays only when
    # the memory held until the pre-warm is worth more than those requests.
    wake = head - lead
    early = sum(1 for t in later if t < head)
    risk = (early + 1) / (len(later) + 2)
    saved = memory_gb * sum(min(t, wake) - idle_s for t in later) / len(later)
    delayed = state.busy_rate * cold_start_s
    if memory_gb > 0 and saved < params.request_worth_gb_s * risk * delayed:
        return KeepAliveDecision(Verdict.HOLD, "histogram", f"unloading {memory_gb:g} GB until the pre-warm "
                                                            f"saves less than a {risk:.0%} risk of a cold start "
                                                            f"delaying {delayed:.0f} requests is worth")
    return KeepAliveDecision(Verdict.UNLOAD, "histogram", f"next request not due for {head - idle_s:.1f}s; "
                                                          f"pre-warm at {head - lead:.1f}s idle",
                             prewarm_at_idle_s=head - lead)


def _weighed(state: KeepAliveState, idle_s: float, keep_alive_s: float, cold_start_s: float,
             params: KeepAliveParams, memory_gb: float, why: str) -> KeepAliveDecision:
    """The fixed keep-alive, held once more (up to ``weighed_extension`` x) when nothing predicts
    the next request but holding the memory that long is worth less than the requests a cold
    start would delay, at even odds (the histogram's prior with no idle time seen)."""
    extension = params.weighed_extension * keep_alive_s
    if keep_alive_s <= idle_s < keep_alive_s + extension and memory_gb > 0:
        delayed = state.busy_rate * cold_start_s
        if memory_gb * extension < params.request_worth_gb_s * 0.5 * delayed:
            return KeepAliveDecision(Verdict.HOLD, "fixed", f"past keep-alive {keep_alive_s:g}s ({why}), held: "
                                                            f"{memory_gb:g} GB for {extension:g}s is worth less "
                                                            f"than even odds of delaying {delayed:.0f} requests")
    return _fixed(idle_s, keep_alive_s, why)


def _fixed(idle_s: float, keep_alive_s: float, why: str) -> KeepAliveDecision:
    if idle_s < keep_alive_s:
        return KeepAliveDecision(Verdict.HOLD, "fixed", f"within keep-alive ({why})")
    return KeepAliveDecision(Verdict.UNLOAD, "fixed",
                             f"idle for {min(idle_s, 1e9):.0f}s >= keep-alive {keep_alive_s:g}s")
