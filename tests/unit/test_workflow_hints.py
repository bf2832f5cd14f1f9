"""Who expects a function: each workflow request and pre-warm owns its expectation, and a node
that is done lets its function go while other owners still hold theirs; a gateway publishes
one hint per function, and the controller reads the gateways' hints merged."""

from __future__ import annotations

import pytest

from dilu.state.base import merge_activity
from dilu.workflows.hints import WorkflowHint, WorkflowHints
from gateway.routing import RoutingTable
from gateway.services import ActivityRecorder

pytestmark = pytest.mark.unit
NOW = 1000.0


def _expected_until(hints: WorkflowHints, function: str, now: float = NOW) -> float | None:
    found = hints.snapshot(now).get(function)
    return found.expected_until if found else None


def test_the_latest_owner_counts_and_a_fulfilled_one_no_longer_does() -> None:
    hints = WorkflowHints()
    first, second = object(), object()
    hints.expect("f", NOW + 30, first)
    hints.expect("f", NOW + 10, second)
    assert _expected_until(hints, "f") == NOW + 30
    hints.fulfilled("f", first)              # its node is done: only the second request holds it
    assert _expected_until(hints, "f") == NOW + 10
    hints.fulfilled("f", second)
    hints.fulfilled("f", second)             # twice, or for an owner never seen: nothing happens
    hints.fulfilled("g", first)
    assert _expected_until(hints, "f") is None


def test_past_expectations_drop_out_and_release_hints_are_visible() -> None:
    hints = WorkflowHints()
    hints.expect("f", NOW - 1, "old")
    hints.expect("f", NOW + 5, "new")
    assert _expected_until(hints, "f") == NOW + 5 and hints.expects("f", NOW)
    assert not hints.expects("f", NOW + 6)
    assert not hints.releasable_now("f", NOW)
    hints.release_when_idle("f", NOW + 5)
    assert hints.releasable_now("f", NOW) and not hints.releasable_now("f", NOW + 5)


def test_a_request_takes_over_a_prewarm_only_where_there_is_one() -> None:
    hints = WorkflowHints()
    request = object()
    hints.expect("f", NOW + 30, "pre-warm")
    assert hints.take_over("f", "pre-warm", request, NOW + 2)
    assert _expected_until(hints, "f") == NOW + 2          # the request's, not the window's
    assert not hints.take_over("g", "pre-warm", request, NOW + 2)
    assert _expected_until(hints, "g") is None
    hints.fulfilled("f", request)
    assert _expected_until(hints, "f") is None


def test_the_gateway_publishes_one_hint_per_function_that_the_controller_reads_merged() -> None:
    """What two gateways flush reaches the controller as one hint: the latest of each field, a
    direct request at either one keeping the function from early release."""
    first, second = ActivityRecorder(RoutingTable(queue_size=10)), ActivityRecorder(RoutingTable(queue_size=10))
    first.hints.expect("f", 4e9, "request")
    first.hints.release_when_idle("f", 4e9)
    second.started("f", direct=True)
    snapshots = [first.take()[0], second.take()[0]]
    hint = merge_activity(snapshots, {})["f"].workflow
    assert hint.expected(now=NOW) and hint.release_idle_until == 4e9 and hint.direct_at is not None
    assert not hint.releasable(now=hint.direct_at + 1)          # it serves users directly
    assert hint.releasable(now=hint.direct_at + 61)


def test_a_hint_survives_the_wire() -> None:
    hint = WorkflowHint(12.5, None, 3.0)
    assert WorkflowHint.from_wire(hint.to_wire()) == hint and WorkflowHint.from_wire(None) == WorkflowHint()
