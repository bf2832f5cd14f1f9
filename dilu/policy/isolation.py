"""Isolation of latency work from background work on one GPU.

A GPU without MPS runs one process's kernels at a time in the order they were queued, so a
latency request waits behind whatever background work is already on the device. The shim
therefore releases a batch instance's work (shim/src/release.c) under two rules this module sets:

- **hold**: while a latency instance on the GPU serves a request, batch launches wait; they go on
  the moment the last request ends. Latency instances never wait for tokens while serving.
- **window**: a batch instance keeps at most ``window_s`` of device time (in its tokens, at its
  measured cost per token, times the vertical scaler's batch factor) launched and unfinished, so
  a request that arrives waits for at most that much background work. Unbounded while no latency
  instance shares the GPU.
- **floor**: training must not starve under a saturating latency load. A batch instance that
  wanted to run in the period that ended (its launches were held) and whose device share over the
  last ``floor_window_s`` is below its floor (``floor_share``, or its slice's request if smaller)
  is exempt from the hold for the next period, with a window of one period's device time, so that
  on a time-sliced GPU it gets a slice's worth of the device when its turn comes rather than one
  kernel. The floor is a guard against starvation, not the slice's guarantee: a profiled training
  job requests nearly the whole GPU, and honouring that under every latency burst would leave
  nothing to isolate.

Pure: ``decide(ctx, state) -> (IsolationDecision, new_state)``, called by the token manager every
period; ``shares_while_serving`` is the same rule at the simulator's time scale.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class IsolationParams:
    window_s: float = 0.0003      # device time a batch instance may have queued beside latency work
    floor_share: float = 0.1      # the device share a held batch instance keeps, over floor_window_s
    floor_window_s: float = 0.5


@dataclass(frozen=True)
class BatchPeriod:
    """What one batch instance did in the period that just ended."""

    instance_id: str
    request: float                # its slice's guaranteed share
    device_s: float               # device time of the launches it made in the period
    held: bool                    # some of its launches waited (for latency work or its window)
    ns_per_token: float           # its measured device time per token


@dataclass(frozen=True)
class IsolationContext:
    period_s: float
    latency_present: bool         # a latency instance is registered on the GPU
    batch: tuple[BatchPeriod, ...]
    batch_factor: float = 1.0     # the vertical scaler's squeeze of batch work (KLC emergencies)
    params: IsolationParams = IsolationParams()


@dataclass(frozen=True)
class IsolationState:
    used: dict[str, tuple[float, ...]] = field(default_factory=dict)   # device seconds per period


@dataclass(frozen=True)
class IsolationDecision:
    windows: dict[str, int]       # tokens per batch instance; 0 = unbounded
    floors: frozenset[str]        # batch instances exempt from the hold for the next period


def floor_of(request: float, params: IsolationParams) -> float:
    """A batch instance's floor: ``floor_share``, or its slice's request when that is smaller."""
    return min(request, params.floor_share) if request > 0 else params.floor_share


def window_tokens(window_s: float, ns_per_token: float) -> int:
    """A window of ``window_s`` device time in tokens costing ``ns_per_token`` each (at least one)."""
    return max(1, int(window_s * 1e9 / max(ns_per_token, 1e-9)))


def decide(ctx: IsolationContext, state: IsolationState) -> tuple[IsolationDecision, IsolationState]:
    params = ctx.params
    keep = max(1, round(params.floor_window_s / ctx.period_s))
    used: dict[str, tuple[float, ...]] = {}
    windows: dict[str, int] = {}
    floors: set[str] = set()
    for item in ctx.batch:
        history = (state.used.get(item.instance_id, ()) + (item.device_s,))[-keep:]
        used[item.instance_id] = history
        if not ctx.latency_present:
            windows[item.instance_id] = 0
            continue
        share = sum(history) / (len(history) * ctx.period_s)
        if item.held and share < floor_of(item.request, params):
            floors.add(item.instance_id)
            window_s = ctx.period_s
        else:
            window_s = params.window_s * min(1.0, max(0.0, ctx.batch_factor))
        windows[item.instance_id] = window_tokens(window_s, item.ns_per_token)
    return IsolationDecision(windows, frozenset(floors)), IsolationState(used)


@dataclass(frozen=True)
class Occupant:
    """An instance on a GPU, as the simulator sees it for one tick."""

    instance_id: str
    cls: str                      # "latency" | "batch"
    request: float
    limit: float
    serving: bool                 # latency: requests waiting or in progress; batch: always runs


def shares_while_serving(occupants: tuple[Occupant, ...], free_shares: dict[str, float],
                         params: IsolationParams = IsolationParams()) -> dict[str, float]:
    """Device shares while at least one latency instance serves: batch instances keep only their
    floors, serving latency instances split the rest in proportion to their limits (the shim does
    not gate them while they serve, so one alone has the device), idle ones get nothing.
    With no latency instance serving, ``free_shares`` (the vertical scaler's) stand."""
    if not any(o.cls == "latency" and o.serving for o in occupants):
        return dict(free_shares)
    batch = [o for o in occupants if o.cls != "latency"]
    serving = [o for o in occupants if o.cls == "latency" and o.serving]
    shares = {o.instance_id: min(free_shares.get(o.instance_id, 0.0), floor_of(o.request, params)) for o in batch}
    left = max(0.0, 1.0 - sum(shares.values()))
    wanted = sum(o.limit for o in serving) or 1.0
    for item in occupants:
        if item.cls == "latency":
            shares[item.instance_id] = left * item.limit / wanted if item.serving else 0.0
    return shares
