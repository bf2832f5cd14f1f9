"""Keep-alive and pre-warming from a per-function histogram of idle times.

Each gap between a function's consecutive requests is an idle time. With enough of them
(``min_samples``) and most inside the histogram's range, the policy predicts the next request:
the instance may be unloaded right after use and pre-warmed at the 5th percentile of idle times
(minus a margin), then kept until the 99th percentile (plus a margin). For new functions, or
irregular ones (too few samples, or most gaps beyond the range), a fixed keep-alive window
applies instead. Times are seconds since the last request.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KeepAliveParams:
    min_samples: int = 10
    history: int = 500
    range_s: float = 4 * 3600.0
    head_percentile: float = 5.0
    tail_percentile: float = 99.0
    margin: float = 0.15
    min_unload_s: float = 2.0   # shorter pre-warm gaps are not worth unloading for


@dataclass(frozen=True)
class KeepAliveState:
    idle_times: tuple[float, ...] = ()
    last_request_at: float | None = None


@dataclass(frozen=True)
class KeepAliveWindows:
    mode: str                   # "histogram" | "fixed"
    prewarm_after_s: float | None  # unload after use, load again this long after the last request
    keep_until_s: float         # unload this long after the last request
    reason: str


def observe(state: KeepAliveState, request_at: float, params: KeepAliveParams = KeepAliveParams(),
            gap_min_s: float = 0.5) -> KeepAliveState:
    """Records a request; a gap longer than ``gap_min_s`` since the previous one is an idle time."""
    if state.last_request_at is None or request_at <= state.last_request_at:
        return KeepAliveState(state.idle_times, request_at if state.last_request_at is None
                              else max(state.last_request_at, request_at))
    gap = request_at - state.last_request_at
    idle = (state.idle_times + (gap,))[-params.history:] if gap >= gap_min_s else state.idle_times
    return KeepAliveState(idle, request_at)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def windows(state: KeepAliveState, fixed_keep_alive_s: float,
            params: KeepAliveParams = KeepAliveParams()) -> KeepAliveWindows:
    idle = list(state.idle_times)
    if len(idle) < params.min_samples:
        return KeepAliveWindows("fixed", None, fixed_keep_alive_s, f"{len(idle)} idle times so far")
    inside = [t for t in idle if t <= params.range_s]
    if len(inside) < 0.5 * len(idle):
        return KeepAliveWindows("fixed", None, fixed_keep_alive_s, "irregular: most idle times beyond range")
    head = _percentile(inside, params.head_percentile) * (1 - params.margin)
    tail = _percentile(inside, params.tail_percentile) * (1 + params.margin)
    prewarm = head if head >= params.min_unload_s else None
    return KeepAliveWindows("histogram", prewarm, tail,
                            f"p{params.head_percentile:g}={head:.1f}s, p{params.tail_percentile:g}={tail:.1f}s "
                            f"of {len(inside)} idle times")
