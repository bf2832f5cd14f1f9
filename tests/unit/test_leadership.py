"""The lease's timing: renewals leave room for two to fail, a dead leader is replaced within the
lease and one retry, and a leader that cannot renew stops before a standby may take over."""

from __future__ import annotations

import pytest

from dilu.fencing import Deposed, TermWatermark
from dilu.policy.leadership import LeaseTiming

TIMING = LeaseTiming(ttl_s=3.0)


def test_the_default_lease_replaces_a_dead_leader_within_five_seconds() -> None:
    assert TIMING.renew_every_s == 1.0 and TIMING.retry_every_s == 0.5
    assert TIMING.takeover_within_s == 3.5 < 5.0


@pytest.mark.parametrize(("since_last_renewal_s", "steps_down"), [
    (0.0, False),
    (1.0, False),      # one renewal late
    (2.3, False),      # two late, still inside the lease with the margin
    (2.4, True),       # the margin before the lease ends on the database's clock
    (15.0, True),      # resumed after a long pause
])
def test_a_leader_steps_down_before_its_lease_ends(since_last_renewal_s: float, steps_down: bool) -> None:
    assert TIMING.must_step_down(100.0, 100.0 + since_last_renewal_s) is steps_down


def test_a_watermark_admits_its_term_and_newer_ones_only() -> None:
    newest = TermWatermark()
    assert [newest.admit(term) for term in (3, 3, 5, 4, 5)] == [True, True, True, False, True]
    assert newest.newest == 5


def test_a_refusal_names_both_terms() -> None:
    assert str(Deposed(4, 5)) == "refused: this decision was made in controller term 4, and term 5 leads now"
    assert str(Deposed(4, None)) == "refused: this decision was made in controller term 4, and no lease is held now"
