"""Keep-alive verdicts from the idle-time histogram, with a fake clock."""

from __future__ import annotations

import pytest

from dilu.policy.keepalive import KeepAliveParams, KeepAliveState, Verdict, decide, observe

P = KeepAliveParams(min_samples=5)


def history(gaps: list[float]) -> KeepAliveState:
    state, now = KeepAliveState(), 1000.0
    state = observe(state, now, P)
    for gap in gaps:
        now += gap
        state = observe(state, now, P)
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
    """The same idle moment unloads a large instance and holds a small one: holding 2 GB for the
    35 s expected before the next burst costs less than a cold start is worth; 80 GB does not."""
    small = decide(history(BURSTY), 5.0, fixed_keep_alive_s=60.0, cold_start_s=1, params=P, memory_gb=2)
    large = decide(history(BURSTY), 5.0, fixed_keep_alive_s=60.0, cold_start_s=1, params=P, memory_gb=80)
    assert small.verdict == Verdict.HOLD and "cheaper than a cold start" in small.reason
    assert large.verdict == Verdict.UNLOAD


def test_too_few_longer_idle_times_fall_back_to_the_fixed_window() -> None:
    state = history([1.0] * 20 + [90.0, 90.0])   # only two idle times longer than 30 s
    decision = decide(state, 30.0, fixed_keep_alive_s=60.0, cold_start_s=1, params=P)
    assert decision.verdict == Verdict.HOLD and decision.mode == "fixed"


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
