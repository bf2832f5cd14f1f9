"""Keep-alive verdicts from the idle-time histogram, with a fake clock."""

from __future__ import annotations

import pytest

from dilu.policy.keepalive import KeepAliveParams, KeepAliveState, Verdict, decide, observe

P = KeepAliveParams(min_samples=5)


def history(gaps: list[float], requests: int = 1) -> KeepAliveState:
    """Requests ``gaps`` apart, ``requests`` in each busy second."""
    state, now = KeepAliveState(), 1000.0
    state = observe(state, now, P, requests=requests)
    for gap in gaps:
        now += gap
        state = observe(state, now, P, requests=requests)
    return state


# Bursts: 20 requests one second apart, then 40 s of silence; five of them.
BURSTY = ([1.0] * 19 + [40.0]) * 5


@pytest.mark.parametrize(("label", "gaps", "idle", "cold", "verdict", "reason"), [
    ("new function holds within the fixed window", [10, 10], 59, 1, Verdict.HOLD, "within keep-alive"),
    ("new function unloads past the fixed window", [10, 10], 60, 1, Verdict.UNLOAD, "keep-alive 60s"),
    ("never unloads inside a burst", BURSTY, 1.5, 1, Verdict.HOLD, "inside a burst"),
    ("unloads once the burst is over", BURSTY, 2.5, 1, Verdict.UNLOAD, "pre-warm at"),
    ("pre-warms a cold start ahead of the next burst", BURSTY, 38.0, 1, Verdict.WARM, "next request due"),
    ("a slower cold start pre-warms earlier", BURSTY, 30.0, 8, Verdict.WARM, "8.0s cold start"),
    ("the same idle time with a fast cold start stays unloaded", BURSTY, 20.0, 1, Verdict.UNLOAD, "not due"),
    ("close to the next burst nothing more is unloaded or started", BURSTY, 30.0, 1, Verdict.HOLD, "too soon"),
    ("a short pause is not worth unloading", ([1.0] * 9 + [8.0]) * 5, 2.5, 1, Verdict.HOLD, "too soon to unload"),
    ("past every idle time seen the fixed window holds", BURSTY, 47.0, 1, Verdict.HOLD, "longer than all"),
    ("... and then unloads", BURSTY, 61.0, 1, Verdict.UNLOAD, "keep-alive 60s"),
    ("steady traffic is not unloaded at its first pause", [1.0] * 30, 5.0, 1, Verdict.HOLD, "within keep-alive"),
    ("regular short gaps keep the instance", [3.0] * 10, 2.5, 1, Verdict.WARM, "due in"),
    ("one-second gaps are learned", [1.0] * 10, 0.5, 1, Verdict.HOLD, "inside a burst"),
])
def test_decide(label: str, gaps: list[float], idle: float, cold: float, verdict: Verdict, reason: str) -> None:
    decision = decide(history(gaps), idle, fixed_keep_alive_s=60.0, cold_start_s=cold, params=P)
    assert decision.verdict == verdict, (label, decision)
    assert reason in decision.reason, (label, decision)


def test_memory_weighs_against_a_cold_start() -> None:
    """20 requests a second and a 1 s cold start: 20 requests would wait, with a risk of 1 in 7
    after five pauses alike. Unloading 2 GB until the pre-warm (33 s) saves 66 GB x s, less than
    those requests are worth (50 GB x s each); 80 GB saves more."""
    state = history(BURSTY, requests=20)
    small = decide(state, 5.0, fixed_keep_alive_s=60.0, cold_start_s=1, params=P, memory_gb=2)
    large = decide(state, 5.0, fixed_keep_alive_s=60.0, cold_start_s=1, params=P, memory_gb=80)
    assert small.verdict == Verdict.HOLD and "delaying 20 requests" in small.reason and "14%" in small.reason
    assert large.verdict == Verdict.UNLOAD


@pytest.mark.parametrize(("label", "requests", "memory_gb", "idle", "verdict", "reason"), [
    ("a busy function's small instance is held past its keep-alive", 20, 2, 61, Verdict.HOLD, "even odds"),
    ("... for one keep-alive more, then unloaded", 20, 2, 120, Verdict.UNLOAD, "keep-alive 60s"),
    ("a large instance is not worth the requests", 20, 80, 61, Verdict.UNLOAD, "keep-alive 60s"),
    ("one request a second is not worth 4 GB held a minute", 1, 4, 61, Verdict.UNLOAD, "keep-alive 60s"),
    ("free memory changes nothing", 20, 0, 61, Verdict.UNLOAD, "keep-alive 60s"),
    ("within the keep-alive nothing changes", 20, 80, 59, Verdict.HOLD, "within keep-alive"),
])
def test_without_a_prediction_the_keep_alive_is_weighed_once_more(label: str, requests: int, memory_gb: float,
                                                                   idle: float, verdict: Verdict, reason: str) -> None:
    """Too few idle times to predict from: 20 requests a second and a 5 s cold start put 100
    requests at even odds of waiting (worth 2,500 GB x s); 2 GB held 60 s more is 120 GB x s,
    80 GB is 4,800."""
    state = history([10, 10], requests=requests)
    decision = decide(state, idle, fixed_keep_alive_s=60.0, cold_start_s=5, params=P, memory_gb=memory_gb)
    assert (decision.verdict, decision.mode) == (verdict, "fixed"), (label, decision)
    assert reason in decision.reason, (label, decision)


def test_a_light_function_with_a_fast_cold_start_is_unloaded() -> None:
    state = history(BURSTY, requests=1)     # one request would wait for a 1 s cold start
    assert decide(state, 5.0, fixed_keep_alive_s=60.0, cold_start_s=1, params=P, memory_gb=2).verdict == \
        Verdict.UNLOAD


def test_more_pauses_alike_lower_the_risk() -> None:
    few, many = history(([1.0] * 19 + [40.0]) * 5, 20), history(([1.0] * 19 + [40.0]) * 40, 20)
    assert decide(few, 5.0, fixed_keep_alive_s=60.0, cold_start_s=1, params=P, memory_gb=4).verdict == Verdict.HOLD
    assert decide(many, 5.0, fixed_keep_alive_s=60.0, cold_start_s=1, params=P, memory_gb=4).verdict == \
        Verdict.UNLOAD


def test_too_few_longer_idle_times_fall_back_to_the_fixed_window() -> None:
    params = KeepAliveParams(min_samples=5, min_later=3)
    state = history([1.0] * 20 + [90.0, 90.0])   # only two idle times longer than 30 s
    decision = decide(state, 30.0, fixed_keep_alive_s=60.0, cold_start_s=1, params=params)
    assert decision.verdict == Verdict.HOLD and decision.mode == "fixed"


def test_the_busy_rate_is_a_moving_average_of_busy_seconds() -> None:
    state = observe(observe(KeepAliveState(), 1.0, P, requests=10), 2.0, P, requests=20)
    assert state.busy_rate == 10 * 0.8 + 20 * 0.2


def test_every_gap_of_a_second_or_more_enters_the_histogram() -> None:
    state = history([0.2, 1.0, 1.0, 3.0, 0.5, 40.0])
    assert state.idle_times == (1.0, 1.0, 3.0, 40.0)


def test_a_burst_replayed_sees_at_most_one_unload_per_pause() -> None:
    """Replays the bursty pattern second by second: the instance stays through each burst, is
    unloaded once per pause, and is warm again before the next burst starts."""
    state = history(BURSTY)
    warm, unloads, cold_hits, last_request = True, 0, 0, 0.0
    for second in range(0, 300):
        in_burst = second % 59 < 20
        if in_burst:
            cold_hits += 0 if warm else 1
            warm, last_request = True, float(second)
            continue
        verdict = decide(state, second - last_request, fixed_keep_alive_s=60.0, cold_start_s=2.0, params=P).verdict
        if verdict == Verdict.UNLOAD and warm:
            unloads += 1
            warm = False
        elif verdict == Verdict.WARM:
            warm = True
    assert cold_hits == 0, "every burst found an instance pre-warmed"
    assert unloads == 5, "one unload per pause"


def test_an_unload_from_the_histogram_says_when_its_pre_warm_is_due() -> None:
    unload = decide(history(BURSTY), 2.5, fixed_keep_alive_s=60.0, cold_start_s=1, params=P)
    assert unload.verdict == Verdict.UNLOAD and unload.prewarm_at_idle_s is not None
    assert f"pre-warm at {unload.prewarm_at_idle_s:.1f}s idle" in unload.reason
    warm = decide(history(BURSTY), unload.prewarm_at_idle_s + 0.01, fixed_keep_alive_s=60.0, cold_start_s=1,
                  params=P)
    assert warm.verdict == Verdict.WARM                       # due then, as it said
    fixed = decide(history([10, 10]), 60, fixed_keep_alive_s=60.0, cold_start_s=1, params=P)
    assert fixed.verdict == Verdict.UNLOAD and fixed.prewarm_at_idle_s is None   # the fixed window pre-warms nothing
