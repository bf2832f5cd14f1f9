"""The runtime pool's size follows recent demand within its bounds (pure)."""

from __future__ import annotations

import pytest

from worker.pool import PoolSizer

pytestmark = pytest.mark.unit


def test_the_pool_grows_with_takes_and_shrinks_after_the_window() -> None:
    pool = PoolSizer(minimum=1, maximum=3, window_s=60)
    assert pool.target(0) == 1
    pool.took(10)
    pool.took(11)
    assert pool.target(12) == 3
    pool.took(12)
    pool.took(13)
    assert pool.target(14) == 3            # never past the maximum
    assert pool.target(71.5) == 3          # the takes at 12 and 13 still count
    assert pool.target(73.5) == 1          # all older than the window: back to the minimum


def test_bounds_are_checked() -> None:
    assert PoolSizer(minimum=0, maximum=0).target(5) == 0
    with pytest.raises(ValueError, match="minimum <= maximum"):
        PoolSizer(minimum=3, maximum=2)
