"""Profiler searches against synthetic curves and the real profile tables in data/profiles."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dilu.policy.profiler import TableRunner, TrialResult, grid_search, hybrid_growth_search, training_search

PROFILES = Path(__file__).resolve().parents[2] / "data" / "profiles"


class Curve:
    """A model whose batch takes (base + per_item x batch) / share seconds, saturating at ``knee``."""

    def __init__(self, base: float, per_item: float, knee: int = 100, min_sm: int = 0) -> None:
        self.base, self.per_item, self.knee, self.min_sm = base, per_item, knee, min_sm
        self.calls: list[tuple[int, int]] = []

    def trial(self, batch: int, sm: int) -> TrialResult | None:
        self.calls.append((batch, sm))
        if sm < self.min_sm:
            return None
        effective = min(sm, self.knee) / 100
        latency = (self.base + self.per_item * batch) / effective
        return TrialResult(latency, batch / latency)


class Saturating:
    """A training loop whose rate is 1 - exp(-share / scale): no sharp knee, so request < limit."""

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def trial(self, batch: int, sm: int) -> TrialResult | None:
        rate = 100 * (1 - math.exp(-sm / self.scale))
        return TrialResult(1 / rate, rate)


@pytest.mark.parametrize(("label", "curve", "slo", "max_batch", "expect"), [
    # Efficacy (batch / (base + per_item x batch)) rises with the batch and does not depend on
    # the share, so the best point is the largest batch at the smallest share meeting the SLO.
    ("walks the frontier to the largest efficient batch", Curve(0.001, 0.001), 0.05, 32,
     {"batch": 32, "sm_request": 0.7}),
    ("never exceeds the spec's max_batch_size", Curve(0.001, 0.001), 0.05, 4, {"batch": 4, "sm_request": 0.1}),
    ("grows the share when even batch 1 misses", Curve(0.004, 0.004), 0.02, 32, {"batch": 4, "sm_request": 1.0}),
    ("a loose slo reaches the largest batch at the smallest share", Curve(0.0001, 0.0001), 10.0, 32,
     {"sm_request": 0.1, "batch": 32}),
    ("the limit is the knee of the curve", Curve(0.001, 0.001, knee=50), 0.05, 32, {"sm_limit": 0.5}),
    ("infeasible slo is reported", Curve(1.0, 1.0), 0.01, 32, {"meets_slo": False, "sm_request": 1.0}),
    ("shares the job cannot run at are skipped", Curve(0.001, 0.001, min_sm=30), 0.05, 4,
     {"sm_request": 0.3, "batch": 4}),
])
def test_hybrid_growth_search(label: str, curve: Curve, slo: float, max_batch: int, expect: dict) -> None:
    profile = hybrid_growth_search(curve, slo, max_batch=max_batch)
    for key, value in expect.items():
        assert getattr(profile, key) == pytest.approx(value), (label, profile)
    assert profile.trials == len(set(curve.calls)), "every distinct trial is counted once"
    assert max(batch for batch, _ in curve.calls) <= max_batch, "no trial above the user's batch bound"
    if profile.meets_slo:
        assert profile.latency_s <= slo


def test_training_request_is_the_knee_and_limit_the_saturation_point() -> None:
    profile = training_search(Saturating(scale=20), batch=16)
    # 1 - exp(-s/20) reaches 90 % of its value at 100 % at s = 44.9 % and 98 % at s = 72.6 %.
    assert profile.sm_request == pytest.approx(0.45)
    assert profile.sm_limit == pytest.approx(0.75)
    assert profile.search_trials < profile.trials <= 12


def test_training_search_on_a_sharp_knee_gives_request_equal_limit() -> None:
    profile = training_search(Curve(0.01, 0.01, knee=45), batch=16)
    assert (profile.sm_request, profile.sm_limit) == (pytest.approx(0.45), pytest.approx(0.45))


SLO_FACTORS = (1.25, 1.5, 2, 2.5, 3, 4, 5, 6)


@pytest.mark.parametrize("model", ["bert_base", "roberta_large", "gpt2_large", "resnet152", "llama2"])
def test_hybrid_search_matches_the_grid_with_a_quarter_of_its_trials(model: str) -> None:
    """Across an SLO sweep from 1.25x to 6x batch-1 latency at the whole device: at least 0.97 of
    the exhaustive grid's efficacy, with at most a quarter of its trials, the limit's knee
    included."""
    runner = TableRunner.from_csv(PROFILES / f"{model}.csv")
    base = runner.trial(1, 100).latency_s
    for factor in SLO_FACTORS:
        slo = base * factor
        hybrid = hybrid_growth_search(runner, slo)
        grid = grid_search(runner, slo, batches=runner.batches)
        assert hybrid.meets_slo and grid.meets_slo and hybrid.latency_s <= slo
        efficacy = (hybrid.throughput_per_s / hybrid.sm_request) / (grid.throughput_per_s / grid.sm_request)
        assert efficacy >= 0.97, (model, factor, hybrid, grid)
        assert hybrid.trials * 4 <= grid.trials, (model, factor, hybrid.trials)


def test_table_runner_interpolates_between_measured_shares() -> None:
    runner = TableRunner([(1, 10, 0.1, 10.0), (1, 20, 0.05, 20.0)])
    assert runner.trial(1, 15) == TrialResult(pytest.approx(0.075), pytest.approx(15.0))
    assert runner.trial(1, 30) is None and runner.trial(2, 10) is None


def _profile(batch: int, history: tuple, throughput: float = 100.0, request: float = 0.5):
    from dilu.policy.profiler import Profile

    return Profile("inference", request, 1.0, batch, throughput, 0.01, len(history), history=history)


@pytest.mark.parametrize(("label", "batch", "history", "says"), [
    ("the bound itself needs no reason", 16, ((16, 50, 0.02, 400.0),), None),
    ("the next batch misses the target everywhere", 1, ((1, 50, 0.01, 100.0), (2, 50, 0.2, 120.0),
                                                        (2, 100, 0.12, 150.0)),
     "batch 1 of up to 16: batch 2 misses the p99 target at every share tried (120.0 ms at best, target 100.0 ms)"),
    ("the next batch serves less per share", 1, ((1, 50, 0.01, 100.0), (2, 60, 0.05, 90.0)),
     "batch 1 of up to 16: batch 2 serves 1.5 req/s per % of the device against 2 at batch 1"),
    ("nothing larger was tried", 1, ((1, 50, 0.01, 100.0),), "larger batches were not tried"),
])
def test_a_batch_below_the_specs_bound_says_why(label: str, batch: int, history: tuple, says: str | None) -> None:
    from dilu.policy.profiler import batch_below_bound

    found = batch_below_bound(_profile(batch, history), 16, 0.1)
    assert (found is None) if says is None else (found is not None and says in found), (label, found)
