"""Lazy horizontal scaling with a fake clock."""

from __future__ import annotations

import pytest

from dilu.policy.horizontal import HorizontalContext, HorizontalParams, HorizontalState, decide

P = HorizontalParams(interval_s=1.0, window=10, out_samples=5, in_samples=8)


def feed(rates: list[float], *, current: int = 2, throughput: float = 10.0, at_limit: bool = True,
         min_instances: int = 0, max_instances: int = 5) -> list:
    state, decisions, now = HorizontalState(), [], 0.0
    for rate in rates:
        now += 1.0
        decision, state = decide(HorizontalContext(now, current, min_instances, max_instances, rate, throughput,
                                                   at_vertical_limit=at_limit, params=P), state)
        decisions.append(decision)
        if decision.changed:
            current = decision.desired
    return decisions


@pytest.mark.parametrize(("label", "rates", "kwargs", "expect_changes"), [
    ("a short burst is absorbed", [25, 25, 25, 25] + [15] * 6, {}, []),
    ("a persistent overload scales out", [25] * 5, {}, [3]),
    ("scale out sizes for the median overload", [45] * 5, {}, [5]),
    ("no scale out while vertical headroom remains", [25] * 8, {"at_limit": False}, []),
    ("sustained low load scales in", [5] * 8, {}, [1]),
    ("never below the minimum", [0] * 20, {"current": 1, "min_instances": 1}, []),
    ("capped at the maximum", [200] * 5, {"max_instances": 4}, [4]),
])
def test_lazy_scaling(label: str, rates: list[float], kwargs: dict, expect_changes: list[int]) -> None:
    changes = [d.desired for d in feed(rates, **kwargs) if d.changed]
    assert changes == expect_changes, label


def test_scaling_from_zero_is_left_to_the_replica_policy() -> None:
    decision, _ = decide(HorizontalContext(1.0, 0, 0, 3, 0.0, 10.0, queued=1, params=P), HorizontalState())
    assert not decision.changed and decision.desired == 0


def test_samples_are_taken_once_per_interval() -> None:
    state = HorizontalState()
    for now in (1.0, 1.2, 1.4, 2.1):
        _, state = decide(HorizontalContext(now, 1, 0, 3, 5.0, 10.0, params=P), state)
    assert len(state.samples) == 2


def test_the_window_clears_after_acting() -> None:
    state, now = HorizontalState(), 0.0
    for _ in range(5):
        now += 1.0
        decision, state = decide(HorizontalContext(now, 2, 0, 5, 25.0, 10.0, params=P), state)
    assert decision.changed and state.samples == ()
