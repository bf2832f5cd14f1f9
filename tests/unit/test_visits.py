"""Which functions a reconcile pass visits: those where something may be decided."""

from __future__ import annotations

import pytest

from dilu.messages import FunctionActivity
from dilu.policy.visits import FunctionFacts, needs_visit

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
