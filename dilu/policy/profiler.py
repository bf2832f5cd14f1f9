"""Profiling: the smallest compute share (and the batch size) that meets a function's need.

Searches run trials through a ``TrialRunner`` (a real one drives a live instance whose slice is
resized per trial; ``TableRunner`` answers from a measured profile table) and are pure otherwise.

- Inference, ``hybrid_growth_search``: walks the SLO frontier (for batch 1, 2, 4, ... the
  smallest share whose p99 meets the SLO) comparing efficacy - throughput per % of compute -
  as the share grows, with a tolerance; see its docstring. The batch never exceeds the spec's
  ``max_batch_size``: that bound is the user's (memory, or a model that cannot batch more).
- ``grid_search`` tries every (batch, SM) and is the baseline the hybrid search is judged by.
- The inference limit (cost-effective burst share) is the knee of the chosen batch's
  throughput curve: the smallest SM, at or above the request, whose throughput reaches ``KNEE``
  (90 %) of the throughput at 100 % - past it, more compute buys less than a tenth more work.
- Training, ``training_search``: a training loop has no SLO, only a rate of progress. Its limit
  is the smallest share keeping ``SATURATED`` (98 %) of its full-device rate (more is waste);
  its request is the knee, the smallest share keeping ``KNEE`` (90 %) of it - what it is
  guaranteed, while it bursts to the limit whenever latency work leaves room. Both come from
  binary searches over 5 % steps that share their trials.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Protocol

KNEE = 0.9          # the limit of inference, the request of training: this share of full throughput
SATURATED = 0.98    # the limit of training: more share than this buys under 2 % more progress
SATURATION = 0.05   # a share step that shortens the batch by under 5 % of its growth: compute-saturated
TIGHT = 0.85        # a frontier point at >= 85 % of the SLO is latency-bound (worth one step up)
POLISH_RANGE = 0.1  # ... if its efficacy is within 10 % of the best
UNREACHABLE = 1.25  # a miss needing over this x the whole device even at linear speed-up is infeasible


@dataclass(frozen=True)
class TrialResult:
    latency_s: float          # p99 of one request (a profile table: the time of one batch)
    throughput_per_s: float   # requests (training: work units) per second
    batch_formed: float | None = None  # the mean batch the runtime actually formed, when observed


class TrialRunner(Protocol):
    def trial(self, batch: int, sm_pct: int) -> TrialResult | None:
        """Runs the function at ``batch`` with ``sm_pct`` % of the device; None if it cannot run
        there (for example, too little memory at that share). Must be deterministic enough to
        compare trials; may be slow (it is a measurement)."""


@dataclass(frozen=True)
class Profile:
    kind: str                 # "inference" | "training"
    sm_request: float         # 0-1
    sm_limit: float           # 0-1
    batch: int
    throughput_per_s: float   # of one instance at the request share
    latency_s: float
    trials: int
    meets_slo: bool = True
    history: tuple[tuple[int, int, float, float], ...] = field(default=(), repr=False)  # (batch, sm, lat, tput)
    search_trials: int = 0    # trials spent finding the request and batch (the rest found the limit)
    batch_formed: float | None = None  # the mean batch the runtime formed at the request, when observed


def batch_below_bound(found: Profile, bound: int, slo_s: float) -> str | None:
    """Why the profile's batch is below the spec's ``max_batch_size`` (``bound``), from its own
    trials: the next larger batch tried missed the SLO at every share, or served fewer requests
    per % of the device; None when the batch is the bound (pure)."""
    if found.kind != "inference" or found.batch >= bound:
        return None
    larger = [row for row in found.history if row[0] > found.batch]
    if not larger:
        return f"batch {found.batch} of up to {bound}: larger batches were not tried"
    tried = min(row[0] for row in larger)
    rows = [row for row in larger if row[0] == tried]
    meeting = [row for row in rows if row[2] <= slo_s]
    if not meeting:
        fastest = min(row[2] for row in rows)
        return (f"batch {found.batch} of up to {bound}: batch {tried} misses the p99 target at every share tried "
                f"({fastest * 1000:.1f} ms at best, target {slo_s * 1000:.1f} ms)")
    best = max(row[3] / max(row[1], 1) for row in meeting)
    chosen = found.throughput_per_s / max(found.sm_request * 100, 1e-9)
    return (f"batch {found.batch} of up to {bound}: batch {tried} serves {best:.3g} req/s per % of the device "
            f"against {chosen:.3g} at batch {found.batch}")


class _Recorder:
    """Counts and caches trials (a search never pays twice for the same point)."""

    def __init__(self, runner: TrialRunner) -> None:
        self.runner = runner
        self.results: dict[tuple[int, int], TrialResult | None] = {}

    def __call__(self, batch: int, sm: int) -> TrialResult | None:
        key = (batch, sm)
        if key not in self.results:
            self.results[key] = self.runner.trial(batch, sm)
        return self.results[key]

    @property
    def count(self) -> int:
        return len(self.results)

    def history(self) -> tuple[tuple[int, int, float, float], ...]:
        return tuple((b, s, r.latency_s, r.throughput_per_s) for (b, s), r in self.results.items() if r)


def _smallest_share_reaching(run: _Recorder, batch: int, shares: list[int], fraction: float,
                             full: TrialResult) -> int:
    """Binary search: the smallest of ``shares`` whose throughput reaches ``fraction`` of ``full``
    (assumes throughput grows with the share; the last share is the answer if none reaches it)."""
    lo, hi = 0, len(shares) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        result = run(batch, shares[mid])
        if result is not None and result.throughput_per_s >= fraction * full.throughput_per_s:
            hi = mid
        else:
            lo = mid + 1
    return shares[lo]


def _bisect(passes: Callable[[int], bool], failing: int, passing: int) -> int:
    """The first index in (``failing``, ``passing``] that passes, assuming passing is monotone."""
    while passing - failing > 1:
        middle = (failing + passing) // 2
        if passes(middle):
            passing = middle
        else:
            failing = middle
    return passing


def _knee(run: _Recorder, batch: int, low: int, step: int = 10) -> int:
    """Smallest SM >= ``low`` (in ``step`` % steps) whose throughput reaches KNEE of the 100 % one.

    Throughput curves are concave, so the knee lies at or below where the straight line from
    ``low`` to 100 % reaches the target; the search bisects the shares up to that bound (a
    gallop up from ``low`` cost two more trials where the knee sits high, as on gpt2_large).
    """
    full, start = run(batch, 100), run(batch, low)
    if full is None or start is None:
        return 100
    target = KNEE * full.throughput_per_s
    if start.throughput_per_s >= target:
        return low
    fraction = (target - start.throughput_per_s) / max(1e-12, full.throughput_per_s - start.throughput_per_s)
    chord = low + fraction * (100 - low)
    candidates = [s for s in range(low + step, 100, step) if s < chord + step] + [100]

    def reaches(i: int) -> bool:
        if candidates[i] == 100:
            return True
        result = run(batch, candidates[i])
        return result is not None and result.throughput_per_s >= target

    return candidates[_bisect(reaches, -1, len(candidates) - 1)]


class _Frontier(Enum):
    INFEASIBLE = "infeasible"   # even the whole device misses the SLO at this batch
    PRUNED = "pruned"           # the share this batch needs cannot beat the best efficacy found


def _efficacy(result: TrialResult, sm: int) -> float:
    return result.throughput_per_s / sm


def _frontier(run: _Recorder, batch: int, shares: list[int], floor: int, slo_s: float,
              bound: float | None) -> int | _Frontier:
    """Index of the smallest share (from ``floor``) at which ``batch`` meets the SLO.

    Latency falls as the share grows, so each failed trial predicts the share needed (latency
    taken as inversely proportional to the share), the prediction is tried next, and a pass
    is narrowed by bisection. The walk gives up early when more compute no longer shortens
    the batch (saturation), and prunes when a failed trial's efficacy is already below
    ``bound``: throughput per share does not rise with the share for a fixed batch, so a
    larger share cannot do better.
    """
    def meets(i: int) -> bool:
        result = run(batch, shares[i])
        return result is not None and result.latency_s <= slo_s

    low = floor
    if meets(low):
        return low
    previous: tuple[int, TrialResult] | None = None
    while True:
        result = run(batch, shares[low])
        if result is not None and bound is not None and _efficacy(result, shares[low]) < bound:
            return _Frontier.PRUNED
        if result is not None and previous is not None and _saturated(previous, (shares[low], result)):
            return _Frontier.INFEASIBLE
        guess = low + 1
        if result is not None:
            need = shares[low] * result.latency_s / slo_s
            if need > shares[-1] * UNREACHABLE:
                return _Frontier.INFEASIBLE
            guess = max(low + 1, next((i for i, s in enumerate(shares) if s >= need), len(shares) - 1))
        if guess >= len(shares):
            return _Frontier.INFEASIBLE
        if meets(guess):
            break
        if guess == len(shares) - 1:
            return _Frontier.INFEASIBLE
        if result is not None:
            previous = (shares[low], result)
        low = guess
    return _bisect(meets, low, guess)


def _saturated(before: tuple[int, TrialResult], after: tuple[int, TrialResult]) -> bool:
    """Whether growing the share bought (almost) no shorter batch: under 5 % of the share's growth."""
    (sm_a, a), (sm_b, b) = before, after
    return a.latency_s / b.latency_s - 1 < SATURATION * (sm_b / sm_a - 1)


def _batches(max_batch: int) -> list[int]:
    """1, 2, 4, ... up to ``max_batch`` (which is included even when not a power of two)."""
    batches = [1]
    while batches[-1] * 2 <= max_batch:
        batches.append(batches[-1] * 2)
    if batches[-1] != max_batch:
        batches.append(max_batch)
    return batches


def hybrid_growth_search(runner: TrialRunner, slo_s: float, *, max_batch: int = 32, start_sm: int = 10,
                         sm_step: int = 10, tolerance: float = 0.05, patience: int = 2, polish: int = 1) -> Profile:
    """The most efficient (batch, share) that meets the SLO, and the knee limit of that batch.

    Walks the SLO frontier: for batch 1, 2, 4, ... (never above ``max_batch``, the spec's bound)
    the smallest share that meets the SLO, starting from the previous batch's share (a larger
    batch never needs less). Efficacy (throughput per % of share) is compared as the share
    grows; a batch whose efficacy falls more than ``tolerance`` below the best counts as a fall
    and ``patience`` falls in a row end the walk (the paper stops at the first fall; one more
    look gets past the dips that real profiles have). Frontier points whose latency is close to
    the SLO are then tried one share step up (``polish`` of them, the most latency-bound
    first): there a little more compute can raise efficacy. A miss that would need more than
    the whole device even if latency fell in proportion to the share ends the walk untried.
    Raises nothing; an SLO no trial meets gives the whole device with ``meets_slo=False``.
    """
    run = _Recorder(runner)
    shares = list(range(start_sm, 101, sm_step))
    if shares[-1] != 100:
        shares.append(100)
    best: tuple[float, int, int] | None = None   # (efficacy, batch, share)
    tight: list[tuple[float, int, int]] = []     # frontier points whose latency is near the SLO
    floor, falls = 0, 0
    for batch in _batches(max_batch):
        found = _frontier(run, batch, shares, floor, slo_s, None if best is None else best[0] * (1 - tolerance))
        if found is _Frontier.INFEASIBLE:
            break
        if found is _Frontier.PRUNED:
            falls += 1
            floor = min(floor + 1, len(shares) - 1)
            if falls >= patience:
                break
            continue
        sm = shares[found]
        result = run(batch, sm)
        efficacy = _efficacy(result, sm)
        if result.latency_s >= TIGHT * slo_s:
            tight.append((efficacy, batch, sm))
        if best is None or efficacy > best[0]:
            best, falls = (efficacy, batch, sm), 0
        elif efficacy < best[0] * (1 - tolerance):
            falls += 1
            if falls >= patience:
                break
        floor = found
    if best is not None:
        best = _polish(run, best, tight, slo_s, polish, sm_step)
    if best is None:
        worst = run(1, 100)
        return Profile("inference", 1.0, 1.0, 1, worst.throughput_per_s if worst else 0.0,
                       worst.latency_s if worst else float("inf"), run.count, meets_slo=False, history=run.history())
    _, batch, sm = best
    result = run(batch, sm)
    search_trials = run.count
    limit = _knee(run, batch, sm, sm_step)
    return Profile("inference", sm / 100, max(sm, limit) / 100, batch, result.throughput_per_s, result.latency_s,
                   run.count, history=run.history(), search_trials=search_trials, batch_formed=result.batch_formed)


def _polish(run: _Recorder, best: tuple[float, int, int], tight: list[tuple[float, int, int]], slo_s: float,
            count: int, step: int) -> tuple[float, int, int]:
    """Tries latency-bound frontier points within 10 % of the best one share step up, the one
    closest to its SLO first (the most latency-bound gains the most from more compute)."""
    candidates = [c for c in tight if c[0] >= best[0] * (1 - POLISH_RANGE)]
    candidates.sort(key=lambda c: run(c[1], c[2]).latency_s, reverse=True)
    for _, batch, sm in candidates[:count]:
        if sm + step > 100:
            continue
        result = run(batch, sm + step)
        if result is not None and result.latency_s <= slo_s and _efficacy(result, sm + step) > best[0]:
            best = (_efficacy(result, sm + step), batch, sm + step)
    return best


def grid_search(runner: TrialRunner, slo_s: float, *, batches: Iterable[int] = (1, 2, 4, 8, 16, 32),
                sms: Iterable[int] = range(10, 101, 10)) -> Profile:
    """Every point: the most efficient (batch, SM) within the SLO, smaller SM on ties."""
    run = _Recorder(runner)
    batches, sms = list(batches), list(sms)
    best: tuple[float, int, int, TrialResult] | None = None
    for batch in batches:
        for sm in sms:
            result = run(batch, sm)
            if result is None or result.latency_s > slo_s:
                continue
            key = (result.throughput_per_s / sm, -sm)
            if best is None or key > (best[0], -best[1]):
                best = (key[0], sm, batch, result)
    if best is None:
        return Profile("inference", 1.0, 1.0, 1, 0.0, float("inf"), run.count, meets_slo=False,
                       history=run.history())
    _, sm, batch, result = best
    full = run(batch, 100)
    limit = next((s for s in sms if s >= sm and (r := run(batch, s)) is not None and full is not None
                  and r.throughput_per_s >= KNEE * full.throughput_per_s), 100)
    return Profile("inference", sm / 100, limit / 100, batch, result.throughput_per_s, result.latency_s,
                   run.count, history=run.history())


def training_search(runner: TrialRunner, *, batch: int, step: int = 5) -> Profile:
    """Request: the smallest share (``step`` % steps) keeping KNEE of the full-device rate;
    limit: the smallest keeping SATURATED of it. The limit's search starts at the request."""
    run = _Recorder(runner)
    full = run(batch, 100)
    if full is None:
        raise ValueError(f"the training job cannot run at batch {batch} on a whole GPU")
    shares = list(range(step, 101, step))
    request = _smallest_share_reaching(run, batch, shares, KNEE, full)
    search_trials = run.count
    limit = _smallest_share_reaching(run, batch, [s for s in shares if s >= request], SATURATED, full)
    result = run(batch, request)
    return Profile("training", request / 100, limit / 100, batch, result.throughput_per_s, result.latency_s,
                   run.count, history=run.history(), search_trials=search_trials)


class TableRunner:
    """Answers trials from a profile table (``batch,sm_pct,latency_s,throughput_per_s``); SM
    points between measured ones are interpolated linearly; unmeasured batches are None."""

    def __init__(self, rows: Iterable[tuple[int, int, float, float]]) -> None:
        self.points: dict[int, dict[int, TrialResult]] = {}
        for batch, sm, latency, throughput in rows:
            self.points.setdefault(int(batch), {})[int(sm)] = TrialResult(float(latency), float(throughput))

    @classmethod
    def from_csv(cls, path: str | Path) -> TableRunner:
        with open(path, newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            return cls((int(float(r["batch"])), int(float(r["sm_pct"])), float(r["latency_s"]),
                        float(r["throughput_per_s"])) for r in reader)

    @property
    def batches(self) -> list[int]:
        return sorted(self.points)

    def trial(self, batch: int, sm_pct: int) -> TrialResult | None:
        curve = self.points.get(batch)
        if not curve:
            return None
        if sm_pct in curve:
            return curve[sm_pct]
        below = [s for s in curve if s < sm_pct]
        above = [s for s in curve if s > sm_pct]
        if not below or not above:
            return None
        low, high = max(below), min(above)
        weight = (sm_pct - low) / (high - low)
        a, b = curve[low], curve[high]
        return TrialResult(a.latency_s + weight * (b.latency_s - a.latency_s),
                           a.throughput_per_s + weight * (b.throughput_per_s - a.throughput_per_s))
