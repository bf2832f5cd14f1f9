"""Profiling: the smallest compute share (and the batch size) that meets a function's need.

Searches run trials through a ``TrialRunner`` (a real one starts the function with a pinned slice
and drives load; ``TableRunner`` answers from a measured profile table) and are pure otherwise.

- Inference, ``hybrid_growth_search``: start at SM 10 %, batch 1; efficacy = throughput / SM %.
  While the SLO holds the batch doubles; when it fails the SM grows by 10 %; the search stops
  when the SLO still fails after the SM grew, when efficacy falls, or at the bounds.
- ``grid_search`` tries every (batch, SM) and is the baseline the hybrid search is compared with.
- Training, ``training_search``: binary search over SM in 5 % steps for the smallest share that
  keeps >= 98 % of the full-GPU throughput.
- The limit (cost-effective burst share) is the knee of the chosen batch's throughput curve:
  the smallest SM, at or above the request, whose throughput reaches ``KNEE`` (90 %) of the
  throughput at 100 % - past it, more compute buys less than a tenth more work. It is found by
  a binary search over 10 % steps (a few extra trials), or read off the grid.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

KNEE = 0.9


@dataclass(frozen=True)
class TrialResult:
    latency_s: float          # time of one batch
    throughput_per_s: float   # requests per second at that batch


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


def _knee(run: _Recorder, batch: int, low: int, step: int = 10) -> int:
    """Smallest SM >= ``low`` (in ``step`` % steps) whose throughput reaches KNEE of the 100 % one."""
    full = run(batch, 100)
    if full is None:
        return 100
    candidates = list(range(low, 101, step))
    if candidates[-1] != 100:
        candidates.append(100)
    return _smallest_share_reaching(run, batch, candidates, KNEE, full)


def hybrid_growth_search(runner: TrialRunner, slo_s: float, *, max_batch: int = 32, start_sm: int = 10,
                         sm_step: int = 10) -> Profile:
    run = _Recorder(runner)
    sm, batch = start_sm, 1
    best: tuple[int, int, TrialResult] | None = None
    raised_since_best = False
    while True:
        result = run(batch, sm)
        if result is not None and result.latency_s <= slo_s:
            if best is not None and result.throughput_per_s / sm < best[2].throughput_per_s / best[1]:
                break  # efficacy falls: a larger batch is not worth its share
            best, raised_since_best = (batch, sm, result), False
            if batch * 2 > max_batch:
                break
            batch *= 2
            continue
        if raised_since_best or sm + sm_step > 100:
            break  # the SLO still fails after the SM grew, or the GPU is used up
        sm += sm_step
        raised_since_best = best is not None
    if best is None:
        worst = run(1, 100)
        return Profile("inference", 1.0, 1.0, 1, worst.throughput_per_s if worst else 0.0,
                       worst.latency_s if worst else float("inf"), run.count, meets_slo=False, history=run.history())
    batch, sm, result = best
    limit = _knee(run, batch, sm)
    return Profile("inference", sm / 100, max(sm, limit) / 100, batch, result.throughput_per_s, result.latency_s,
                   run.count, history=run.history())


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


def training_search(runner: TrialRunner, *, batch: int, threshold: float = 0.98, step: int = 5) -> Profile:
    """Binary search for the smallest SM (``step`` % steps) keeping ``threshold`` of full throughput."""
    run = _Recorder(runner)
    full = run(batch, 100)
    if full is None:
        raise ValueError(f"the training job cannot run at batch {batch} on a whole GPU")
    sm = _smallest_share_reaching(run, batch, list(range(step, 101, step)), threshold, full)
    result = run(batch, sm)
    return Profile("training", sm / 100, sm / 100, batch, result.throughput_per_s, result.latency_s, run.count,
                   history=run.history())


class TableRunner:
    """Answers trials from a profile table (``batch,sm_pct,latency_s,throughput_per_s``); SM
    points between measured ones are interpolated linearly; unmeasured batches are None."""

    def __init__(self, rows: Iterable[tuple[int, int, float, float]]) -> None:
        self.points: dict[int, dict[int, TrialResult]] = {}
        for batch, sm, latency, throughput in rows:
            self.points.setdefault(int(batch), {})[int(sm)] = TrialResult(float(latency), float(throughput))

    @classmethod
    def from_csv(cls, path: str | Path) -> "TableRunner":
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
