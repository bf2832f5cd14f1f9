"""Vertical scaling: each GPU instance's compute share for the next token period.

Pure: ``allocate(ctx, state) -> (shares, new_state)``. The token manager calls it every period
with which instances launched work in the period that ended; time is passed in.

- KLC (kernel launch cycle): a latency instance's burst of consecutive active periods (gaps
  shorter than ``idle_gap_periods`` stay inside the cycle). Cycles longer than
  ``klc_min_periods`` count; the shortest in the last ``klc_history`` is the uncontended
  baseline, and stretch = cycle / baseline.
- Batch instances share what recently active latency work's requests leave, by request, capped
  at their limits, times the batch factor. With ``isolated`` (the shim holds batch work while
  latency work is served: ``dilu.policy.isolation``) neither applies to their token rates:
  batch instances share the whole device by request up to their limits and get in fact what
  latency work leaves; the batch factor then shrinks the work they may have queued when a
  request arrives (their window), which is what stands in a latency request's way.
- Latency instances get their limit when nothing else is active on the GPU; under contention
  their request plus whatever batch work leaves unused (up to the limit), so cutting batch work
  speeds latency work up. A stretch >= ``emergency_stretch`` (``llm_emergency_stretch``
  for LLM functions) divides the factor by the stretch (floor: ``batch_floor`` of the request);
  a stretch below ``recovery_stretch`` grows it by ``recovery_factor`` at most every
  ``recovery_every_cycles`` cycles; stretches >= ``outlier_stretch`` are ignored.
- When latency work has been idle for ``latency_idle_s``, batch instances may use their limits.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class VerticalParams:
    period_s: float = 0.005
    idle_gap_periods: int = 2
    klc_min_periods: int = 6
    klc_history: int = 20
    emergency_stretch: float = 1.6
    llm_emergency_stretch: float = 1.3
    recovery_stretch: float = 1.2
    outlier_stretch: float = 4.0
    batch_floor: float = 0.01
    recovery_factor: float = 1.3
    recovery_every_cycles: int = 5
    latency_idle_s: float = 0.6
    contention_window_s: float = 0.05
    isolated: bool = True


@dataclass(frozen=True)
class InstanceSlice:
    instance_id: str
    cls: str  # "latency" | "batch"
    request: float
    limit: float
    llm: bool = False


@dataclass(frozen=True)
class KlcState:
    in_cycle: bool = False
    length: int = 0           # periods from the cycle's first to its latest active period
    pending_idle: int = 0     # idle periods since the latest active one
    history: tuple[int, ...] = ()
    last_klc: int | None = None
    last_stretch: float | None = None


@dataclass(frozen=True)
class VerticalState:
    klc: dict[str, KlcState] = field(default_factory=dict)
    last_active: dict[str, float] = field(default_factory=dict)
    batch_factor: float = 1.0
    cycles_since_change: int = 0
    events: tuple[str, ...] = ()  # what the last step decided, for telemetry and tests


@dataclass(frozen=True)
class VerticalContext:
    now: float
    slices: tuple[InstanceSlice, ...]
    active: frozenset[str]    # instances that launched (or waited) in the period just ended
    params: VerticalParams = VerticalParams()


def _baseline(history: tuple[int, ...]) -> int | None:
    return min(history) if history else None


def _step_klc(klc: KlcState, active: bool, params: VerticalParams) -> tuple[KlcState, float | None]:
    """Advances one period. Returns (state, stretch of a counted cycle that just ended)."""
    if active:
        if not klc.in_cycle:
            return replace(klc, in_cycle=True, length=1, pending_idle=0), None
        return replace(klc, length=klc.length + klc.pending_idle + 1, pending_idle=0), None
    if not klc.in_cycle:
        return klc, None
    klc = replace(klc, pending_idle=klc.pending_idle + 1)
    if klc.pending_idle < params.idle_gap_periods:
        return klc, None
    length, baseline = klc.length, _baseline(klc.history)
    ended = replace(klc, in_cycle=False, length=0, pending_idle=0)
    if length <= params.klc_min_periods:
        return ended, None
    stretch = length / baseline if baseline else 1.0
    if stretch >= params.outlier_stretch:
        return replace(ended, last_klc=length, last_stretch=stretch), None
    history = (klc.history + (length,))[-params.klc_history:]
    return replace(ended, history=history, last_klc=length, last_stretch=stretch), stretch


def allocate(ctx: VerticalContext, state: VerticalState) -> tuple[dict[str, float], VerticalState]:
    params = ctx.params
    last_active = {k: v for k, v in state.last_active.items() if k in {s.instance_id for s in ctx.slices}}
    for instance_id in ctx.active:
        last_active[instance_id] = ctx.now
    factor, since_change, events = state.batch_factor, state.cycles_since_change, []
    klcs: dict[str, KlcState] = {}

    for item in ctx.slices:
        if item.cls != "latency":
            continue
        klc, stretch = _step_klc(state.klc.get(item.instance_id, KlcState()),
                                 item.instance_id in ctx.active, params)
        klcs[item.instance_id] = klc
        emergency = params.llm_emergency_stretch if item.llm else params.emergency_stretch
        if stretch is not None:
            if stretch >= emergency:
                factor = max(params.batch_floor, factor / stretch)
                since_change = 0
                events.append(f"emergency:{item.instance_id}:{stretch:.2f}")
            else:
                since_change += 1
                if stretch < params.recovery_stretch and factor < 1.0 \
                        and since_change >= params.recovery_every_cycles:
                    factor = min(1.0, factor * params.recovery_factor)
                    since_change = 0
                    events.append(f"recovery:{item.instance_id}:{stretch:.2f}")

    def recently(instance_id: str, window: float) -> bool:
        seen = last_active.get(instance_id)
        return seen is not None and ctx.now - seen < window

    latency = [s for s in ctx.slices if s.cls == "latency"]
    batch = [s for s in ctx.slices if s.cls != "latency"]
    latency_recent = [s for s in latency if recently(s.instance_id, params.latency_idle_s)]
    shares: dict[str, float] = {}
    if not latency_recent:
        if factor != 1.0:
            events.append("latency-idle:batch-limits")
        factor, since_change = 1.0, 0
        total = sum(s.limit for s in batch)
        scale = 1.0 / total if total > 1.0 else 1.0
        for item in batch:
            shares[item.instance_id] = item.limit * scale
    else:
        pool = 1.0 if params.isolated else max(0.0, 1.0 - sum(s.request for s in latency_recent))
        weights = {s.instance_id: max(s.request, params.batch_floor) for s in batch}
        total_weight = sum(weights.values()) or 1.0
        for item in batch:
            fair = min(item.limit, pool * weights[item.instance_id] / total_weight)
            squeeze = 1.0 if params.isolated else factor    # isolated: the factor bounds the window instead
            shares[item.instance_id] = max(params.batch_floor * item.request, fair * squeeze)

    # Latency work is guaranteed its request and takes what batch work leaves, up to its limit;
    # alone on the GPU it gets its limit.
    spare = max(0.0, 1.0 - sum(s.request for s in latency_recent)
                - sum(shares[s.instance_id] for s in batch if recently(s.instance_id, params.contention_window_s)))
    contenders = [s for s in latency_recent if recently(s.instance_id, params.contention_window_s)] or latency_recent
    for item in latency:
        contended = any(recently(other.instance_id, params.contention_window_s)
                        for other in ctx.slices if other.instance_id != item.instance_id)
        if not contended:
            shares[item.instance_id] = item.limit
        else:
            extra = spare / len(contenders) if item in contenders else 0.0
            shares[item.instance_id] = min(item.limit, item.request + extra)

    new_state = VerticalState(klc=klcs, last_active=last_active, batch_factor=factor,
                              cycles_since_change=since_change, events=tuple(events))
    return shares, new_state
