"""The one scaling composition the controller and the simulator call, with a fake clock."""

from __future__ import annotations

from dilu.messages import FunctionStatus
from dilu.policy.autoscale import ScalingInputs, ScalingParams, ScalingState, observe_second, plan
from dilu.policy.horizontal import HorizontalParams
from dilu.policy.keepalive import KeepAliveParams

PARAMS = ScalingParams(HorizontalParams(window=10, out_samples=5, in_samples=8), KeepAliveParams(min_samples=3))


def run(samples: list[tuple[float, int]], *, current: int = 1, **inputs) -> list[int]:
    """Feeds one second per (rate, queued) sample; returns the counts decided, acting on each."""
    state, counts = ScalingState(), []
    for second, (rate, queued) in enumerate(samples, start=1):
        if rate:
            state = observe_second(state, float(second), int(rate), PARAMS)
        decision, state = plan(ScalingInputs(now=float(second), current=current, max_instances=4, rate_per_s=rate,
                                             queued=queued, throughput_per_instance=10.0, latency_target_s=0.5,
                                             idle_s=0.0 if rate else 30.0, **inputs), state, PARAMS)
        current = decision.desired
        counts.append(current)
    return counts


def test_a_request_for_a_function_at_zero_starts_one_at_once() -> None:
    decision, _ = plan(ScalingInputs(now=1.0, current=0, max_instances=4, queued=3), ScalingState(), PARAMS)
    assert decision.desired == 1 and "scale from zero" in decision.reason


def test_a_growing_backlog_over_the_capacity_scales_out_within_two_seconds() -> None:
    assert run([(30.0, 10), (30.0, 40)]) == [1, 3]


def test_the_same_backlog_with_vertical_headroom_waits() -> None:
    assert run([(30.0, 10), (30.0, 40)], at_vertical_limit=False) == [1, 1]


def test_an_unprofiled_function_scales_by_concurrency_alone() -> None:
    decision, _ = plan(ScalingInputs(now=1.0, current=1, max_instances=4, in_flight=2, queued=4,
                                     concurrency_per_instance=2), ScalingState(), PARAMS)
    assert decision.desired == 3


def test_idle_past_the_fixed_keep_alive_unloads_to_the_minimum() -> None:
    decision, _ = plan(ScalingInputs(now=100.0, current=2, max_instances=4, idle_s=61.0, keep_alive_s=60.0,
                                     min_instances=1), ScalingState(), PARAMS)
    assert decision.desired == 1 and "keep-alive" in decision.reason


def test_a_baselines_count_replaces_the_lazy_scaler() -> None:
    decision, state = plan(ScalingInputs(now=1.0, current=1, max_instances=4, queued=5, rate_per_s=35.0,
                                         throughput_per_instance=10.0), ScalingState(), PARAMS, by_rate=4)
    assert decision.desired == 4 and state.horizontal.samples == (), "the lazy scaler did not run"


def test_a_deploying_function_is_verified_with_one_instance() -> None:
    decision, _ = plan(ScalingInputs(now=1.0, current=0, max_instances=4, status=FunctionStatus.DEPLOYING),
                       ScalingState(), PARAMS)
    assert decision.desired == 1


def test_an_unloaded_function_asks_to_be_decided_again_when_its_pre_warm_is_due() -> None:
    """Bursts every 40 s: unloaded at 5 s idle, it is to be decided again before the next burst,
    whatever else happens (nothing may bring it up for a decision before then)."""
    state = ScalingState()
    for start in range(0, 200, 40):
        for second in range(start, start + 3):
            state = observe_second(state, float(second), 1, PARAMS)
    unloaded, state = plan(ScalingInputs(now=205.0, current=1, idle_s=5.0, cold_start_s=1.0), state, PARAMS)
    assert unloaded.desired == 0 and unloaded.recheck_in_s is not None and 20 < unloaded.recheck_in_s < 40
    due, _ = plan(ScalingInputs(now=205.0 + unloaded.recheck_in_s + 0.01, current=0,
                                idle_s=5.0 + unloaded.recheck_in_s + 0.01, cold_start_s=1.0), state, PARAMS)
    assert due.desired == 1 and due.reason.startswith("pre-warm")


def test_a_target_of_two_with_eight_in_flight_asks_for_four_instances() -> None:
    """Before a profile by the replica rule at once; after one by the horizontal rule's trend
    (the second before had less in flight)."""
    for profiled in (None, 10.0):
        for most, expect in ((6, 4), (3, 3)):     # within max_instances
            state = ScalingState()
            for second, in_flight in ((1.0, 0), (2.0, 8)):
                decision, state = plan(ScalingInputs(
                    now=second, current=1, max_instances=most, in_flight=in_flight, rate_per_s=0.5,
                    concurrency_per_instance=2, target_concurrency=2, throughput_per_instance=profiled,
                    idle_s=0.0), state, PARAMS)
            assert decision.desired == expect, (profiled, most, decision)
