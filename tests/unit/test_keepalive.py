"""Keep-alive windows from the idle-time histogram, with a fake clock."""

from __future__ import annotations

import pytest

from dilu.policy.keepalive import KeepAliveParams, KeepAliveState, observe, windows

P = KeepAliveParams(min_samples=5)


def history(gaps: list[float]) -> KeepAliveState:
    state, now = KeepAliveState(), 1000.0
    state = observe(state, now, P)
    for gap in gaps:
        now += gap
        state = observe(state, now, P)
    return state


@pytest.mark.parametrize(("label", "gaps", "mode", "prewarm", "keep"), [
    ("new function uses the fixed window", [10, 10], "fixed", None, 60.0),
    ("regular gaps pre-warm before the next request", [10] * 10, "histogram", 8.5, 11.5),
    ("short gaps keep the instance loaded", [1.0] * 10, "histogram", None, 1.15),
    ("irregular gaps fall back to fixed", [10, 20] + [50000] * 8, "fixed", None, 60.0),
    ("bursts within a second are not idle times", [0.1] * 20 + [10] * 3, "fixed", None, 60.0),
])
def test_windows(label: str, gaps: list[float], mode: str, prewarm: float | None, keep: float) -> None:
    result = windows(history(gaps), 60.0, P)
    assert result.mode == mode, (label, result)
    assert (result.prewarm_after_s is None) == (prewarm is None)
    if prewarm is not None:
        assert result.prewarm_after_s == pytest.approx(prewarm)
    assert result.keep_until_s == pytest.approx(keep)


def test_percentiles_follow_the_spread() -> None:
    result = windows(history([5, 6, 7, 8, 9, 10, 11, 12, 13, 14]), 60.0, P)
    assert 4.0 < result.prewarm_after_s < 5.0 and 15.5 < result.keep_until_s < 16.5
