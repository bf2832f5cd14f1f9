"""Who expects a function: each workflow request and pre-warm owns its expectation, and a node
that is done lets its function go while other owners still hold theirs."""

from __future__ import annotations

import time

import pytest

from gateway.routing import RoutingTable
from gateway.services import ActivityRecorder

pytestmark = pytest.mark.unit


def _expected_until(activity: ActivityRecorder, function: str) -> float | None:
    snapshot, _ = activity.take([function])
    return snapshot[function]["expected_until"]


def test_the_latest_owner_counts_and_a_fulfilled_one_no_longer_does() -> None:
    activity, now = ActivityRecorder(RoutingTable(queue_size=10)), time.time()
    first, second = object(), object()
    activity.expect("f", now + 30, first)
    activity.expect("f", now + 10, second)
    assert _expected_until(activity, "f") == now + 30
    activity.fulfilled("f", first)              # its node is done: only the second request holds it
    assert _expected_until(activity, "f") == now + 10
    activity.fulfilled("f", second)
    activity.fulfilled("f", second)             # twice, or for an owner never seen: nothing happens
    activity.fulfilled("g", first)
    assert _expected_until(activity, "f") is None


def test_past_expectations_drop_out_and_release_hints_are_visible() -> None:
    activity, now = ActivityRecorder(RoutingTable(queue_size=10)), time.time()
    activity.expect("f", now - 1, "old")
    activity.expect("f", now + 5, "new")
    assert _expected_until(activity, "f") == now + 5
    assert not activity.releasable_now("f")
    activity.release_when_idle("f", now + 5)
    assert activity.releasable_now("f")


def test_a_request_takes_over_a_prewarm_only_where_there_is_one() -> None:
    activity, now = ActivityRecorder(RoutingTable(queue_size=10)), time.time()
    request = object()
    activity.expect("f", now + 30, "pre-warm")
    assert activity.take_over("f", "pre-warm", request, now + 2)
    assert _expected_until(activity, "f") == now + 2          # the request's, not the window's
    assert not activity.take_over("g", "pre-warm", request, now + 2)
    assert _expected_until(activity, "g") is None
    activity.fulfilled("f", request)
    assert _expected_until(activity, "f") is None
