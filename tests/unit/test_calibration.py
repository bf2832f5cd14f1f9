"""Per-instance token cost from measured device time (pure)."""

from __future__ import annotations

import pytest

from dilu.policy.calibration import TokenCost, observe, token_rate

pytestmark = pytest.mark.unit

DEFAULT = 1000.0    # ns per token: a device of 1e6 tokens per second


def test_heavy_kernels_get_fewer_tokens_for_the_same_share() -> None:
    # 40 % of a 0.2 s interval for 20 000 tokens: 4000 ns each.
    cost = observe(None, device_share=0.4, interval_s=0.2, tokens=20_000, default_ns_per_token=DEFAULT)
    assert cost.ns_per_token == pytest.approx(4000.0) and cost.samples == 1
    assert token_rate(0.3, cost, DEFAULT) == pytest.approx(75_000)      # 0.3 s of device per second
    assert token_rate(0.3, None, DEFAULT) == pytest.approx(300_000)     # uncalibrated: the default


def test_estimates_are_smoothed_and_bounded() -> None:
    cost = observe(TokenCost(4000.0, 3), device_share=0.5, interval_s=0.2, tokens=50_000, default_ns_per_token=DEFAULT)
    assert cost.ns_per_token == pytest.approx(3000.0) and cost.samples == 4     # halfway to 2000
    wild = observe(None, device_share=1.0, interval_s=1.0, tokens=1, default_ns_per_token=DEFAULT)
    assert wild.ns_per_token == DEFAULT * 100


@pytest.mark.parametrize(("share", "tokens"), [(0.0, 1000), (0.01, 1000), (0.5, 0)])
def test_intervals_without_enough_use_teach_nothing(share: float, tokens: int) -> None:
    before = TokenCost(2500.0, 2)
    assert observe(before, device_share=share, interval_s=0.2, tokens=tokens, default_ns_per_token=DEFAULT) == before
    assert observe(None, device_share=share, interval_s=0.2, tokens=tokens,
                   default_ns_per_token=DEFAULT) == TokenCost(DEFAULT, 0)
