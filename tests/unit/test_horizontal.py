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


def feed_backlog(samples: list[tuple[float, int]], *, current: int = 1, throughput: float = 10.0,
                 target_s: float = 0.5) -> list:
    """Samples of (rate, requests outstanding); one instance answers 10 x 0.5 = 5 in time."""
    state, decisions, now = HorizontalState(), [], 0.0
    for rate, outstanding in samples:
        now += 1.0
        decision, state = decide(HorizontalContext(now, current, 0, 4, rate, throughput, params=P,
                                                   in_flight=outstanding, latency_target_s=target_s), state)
        decisions.append(decision)
        if decision.changed:
            current = decision.desired
    return decisions


@pytest.mark.parametrize(("label", "samples", "expect_changes"), [
    # A client with a bounded connection pool sends only as fast as it is answered: its rate
    # stalls just under the capacity while its requests pile up.
    ("a backlog at the capacity scales out by one", [(9.5, 40)] * 5, [2]),
    ("a short backlog that stops growing is absorbed", [(9.5, 40)] * 3 + [(9.5, 3)] * 7, []),
    ("a growing backlog scales out on the trend, not after a count", [(9.5, 3), (9.5, 20)], [2]),
    ("... and again while it keeps growing", [(9.5, 3), (9.5, 20), (9.5, 40)], [2, 3]),
    ("a backlog that stops growing waits for the count", [(9.5, 3), (9.5, 20), (9.5, 20), (9.5, 20)], [2]),
    ("a rate over the capacity with a growing backlog is sized by that rate",
     [(5.0, 2), (35.0, 30)], [4]),
    ("a growing backlog still answered in time is no trend", [(9.5, 1), (9.5, 2), (9.5, 4)], []),
    ("requests answered in time are no overload", [(9.5, 5)] * 10, []),
])
def test_requests_piling_up_count_as_overload(label: str, samples: list, expect_changes: list[int]) -> None:
    changes = [d.desired for d in feed_backlog(samples) if d.changed]
    assert changes == expect_changes, label


def test_no_trend_scale_out_while_vertical_headroom_remains() -> None:
    state, now = HorizontalState(), 0.0
    for outstanding in (3, 20, 40):
        now += 1.0
        decision, state = decide(HorizontalContext(now, 1, 0, 4, 9.5, 10.0, params=P, at_vertical_limit=False,
                                                   in_flight=outstanding, latency_target_s=0.5), state)
    assert not decision.changed and "vertical headroom" in decision.reason


def test_a_backlog_holds_off_scaling_in() -> None:
    quiet_but_piled_up = [(5.0, 8)] * 8   # more than one instance answers in time, not more than two
    assert not [d for d in feed_backlog(quiet_but_piled_up, current=2) if d.changed]
    assert [d.desired for d in feed_backlog([(5.0, 2)] * 8, current=2) if d.changed] == [1]


def test_without_a_latency_target_only_the_rate_counts() -> None:
    assert not [d for d in feed_backlog([(9.5, 1000)] * 10, target_s=float("inf")) if d.changed]


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


def feed_occupancy(outstanding: list[int], *, current: int = 1, target: float = 4, max_instances: int = 8) -> list:
    """One sample a second with no arrivals to speak of (long streams): only occupancy varies."""
    state, changes, now = HorizontalState(), [], 0.0
    for count in outstanding:
        now += 1.0
        decision, state = decide(HorizontalContext(now, current, 0, max_instances, 0.2, 10.0, params=P,
                                                   in_flight=count, target_concurrency=target), state)
        if decision.changed:
            changes.append(decision.desired)
            current = decision.desired
    return changes


@pytest.mark.parametrize(("label", "outstanding", "kwargs", "expect_changes"), [
    ("saturating streams scale out at once, sized to the target", [0, 8], {"target": 2}, [4]),
    ("full occupancy with no new arrivals scales out after the window", [8] * 5, {}, [2]),
    ("occupancy within the target is no overload", [4] * 10, {}, []),
    ("capped at the maximum", [0, 40], {"target": 2, "max_instances": 3}, [3]),
    ("occupancy that still needs both instances keeps them", [6] * 10, {"current": 2}, []),
    ("occupancy that fits one instance scales in", [3] * 8, {"current": 2}, [1]),
    ("without a target occupancy alone never scales", [0, 100] + [100] * 8, {"target": float("inf")}, []),
])
def test_occupancy_counts_whatever_the_rate(label: str, outstanding: list[int], kwargs: dict,
                                            expect_changes: list[int]) -> None:
    assert feed_occupancy(outstanding, **kwargs) == expect_changes, label
