"""Folding worker reports into instance rows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dilu.controller.observe import UNKNOWN_GRACE_S, RowView, fold
from dilu.messages import InstanceStatus

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def status(state: str, **kw: object) -> InstanceStatus:
    return InstanceStatus(instance_id="i", function="f", version=1, state=state, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("label", "row", "report", "expected"), [
    ("same state: nothing", RowView("i", "ready", NOW), status("ready"), None),
    ("became ready", RowView("i", "starting", NOW), status("ready", endpoint="http://x"),
     {"state": "ready", "endpoint": "http://x", "ready_at": NOW}),
    ("crashed", RowView("i", "ready", NOW), status("failed", error="killed"),
     {"state": "failed", "ended_at": NOW, "error": "killed"}),
    ("unknown but young: wait", RowView("i", "starting", NOW), None, None),
    ("unknown and old: failed", RowView("i", "ready", NOW - timedelta(seconds=UNKNOWN_GRACE_S + 1)), None,
     {"state": "failed", "error": "the worker no longer knows this instance", "ended_at": NOW}),
    ("stale starting report does not undo a stop", RowView("i", "stopping", NOW), status("starting"), None),
    ("stale starting report does not undo ready", RowView("i", "ready", NOW), status("starting"), None),
])
def test_fold(label: str, row: RowView, report: InstanceStatus | None, expected: dict | None) -> None:
    assert fold(row, report, NOW) == expected, label


def test_rows_older_than_the_controller_get_no_grace() -> None:
    assert fold(RowView("i", "ready", NOW), None, NOW, grace_s=0.0)["state"] == "failed"


def test_ready_and_ended_times_are_when_the_worker_saw_them_within_the_rows_life() -> None:
    created = NOW - timedelta(seconds=10)
    row = RowView("i", "ready", created)
    stopped = fold(row, status("stopped", changed_at=(NOW - timedelta(seconds=2)).timestamp()), NOW)
    assert stopped["ended_at"] == NOW - timedelta(seconds=2)      # not when this controller noticed
    # A worker's clock ahead of the controller's, or behind the row's creation: kept in between.
    assert fold(row, status("stopped", changed_at=(NOW + timedelta(seconds=5)).timestamp()), NOW)["ended_at"] == NOW
    ready = fold(RowView("i", "starting", created), status("ready",
                                                           changed_at=(created - timedelta(seconds=60)).timestamp()),
                 NOW)
    assert ready["ready_at"] == created
    naive = fold(RowView("i", "ready", created.replace(tzinfo=None)),
                 status("failed", changed_at=(NOW - timedelta(seconds=1)).timestamp()), NOW.replace(tzinfo=None))
    assert naive["ended_at"] == (NOW - timedelta(seconds=1)).replace(tzinfo=None)
