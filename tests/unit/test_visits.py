"""Which functions a reconcile pass visits: those where something may be decided."""

from __future__ import annotations

import pytest

from dilu.messages import FunctionActivity
from dilu.policy.visits import FunctionFacts, needs_visit, pass_interval_s, quiet

pytestmark = pytest.mark.unit
IDLE = FunctionFacts("fn", 2, "ready", 0, 0)


def test_an_idle_settled_function_is_left_alone() -> None:
    assert not needs_visit(IDLE, None, (2, "ready"), now=1000.0)
    old_traffic = FunctionActivity(requests={900: 5}, last_request_at=900.0)
    assert not needs_visit(IDLE, old_traffic, (2, "ready"), now=1000.0)


@pytest.mark.parametrize("facts, activity, seen", [
    (IDLE, None, None),                                                  # never visited
    (IDLE, None, (1, "ready")),                                          # a new version
    (FunctionFacts("fn", 2, "failed", 0, 0), None, (2, "ready")),        # its status changed
    (FunctionFacts("fn", 2, "deploying", 0, 0), None, (2, "deploying")),  # being deployed
    (FunctionFacts("fn", 2, "ready", 0, 1), None, (2, "ready")),          # it has an instance
    (FunctionFacts("fn", 2, "ready", 1, 0), None, (2, "ready")),          # it must have one
    (IDLE, FunctionActivity(queued=1), (2, "ready")),                     # a request waits: scale from zero
    (IDLE, FunctionActivity(in_flight=1), (2, "ready")),
    (IDLE, FunctionActivity(requests={995: 1}), (2, "ready")),            # recent requests
])
def test_a_function_where_something_may_be_decided_is_visited(facts, activity, seen) -> None:
    assert needs_visit(facts, activity, seen, now=1000.0)


def test_a_function_whose_pre_warm_is_due_is_visited_though_nothing_happened() -> None:
    assert needs_visit(IDLE, None, (2, "ready"), now=1000.0, recheck_at=999.5)
    assert not needs_visit(IDLE, None, (2, "ready"), now=1000.0, recheck_at=1000.5)    # not yet


def test_the_pass_is_quiet_only_when_nothing_happens() -> None:
    idle = {"fn": FunctionActivity(requests={900: 5})}                 # long ago
    assert quiet(idle, now=1000.0, acted=False, settling=False)
    assert quiet({}, now=1000.0, acted=False, settling=False)
    assert not quiet(idle, now=1000.0, acted=True, settling=False)      # it started, stopped or resized something
    assert not quiet(idle, now=1000.0, acted=False, settling=True)      # something starts, stops or deploys
    for busy in (FunctionActivity(requests={995: 1}), FunctionActivity(in_flight=1), FunctionActivity(queued=2)):
        assert not quiet({"fn": busy}, now=1000.0, acted=False, settling=False), busy


def test_a_quiet_loop_waits_longer_but_never_past_a_timer() -> None:
    assert pass_interval_s(quiet_now=False, interval_s=0.5, quiet_interval_s=2.0) == 0.5
    assert pass_interval_s(quiet_now=True, interval_s=0.5, quiet_interval_s=2.0) == 2.0
    assert pass_interval_s(quiet_now=True, interval_s=0.5, quiet_interval_s=2.0, next_timer_in_s=0.7) == 0.7
    assert pass_interval_s(quiet_now=False, interval_s=0.5, quiet_interval_s=2.0, next_timer_in_s=-3) == 0.0
    assert pass_interval_s(quiet_now=True, interval_s=1.0, quiet_interval_s=0.2) == 1.0   # never shorter than busy
