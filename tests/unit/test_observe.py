"""Folding worker reports into instance rows."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from dilu.controller.observe import UNKNOWN_GRACE_S, RowView, fold
from dilu.messages import InstanceStatus

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


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
])
def test_fold(label: str, row: RowView, report: InstanceStatus | None, expected: dict | None) -> None:
    assert fold(row, report, NOW) == expected, label


def test_rows_older_than_the_controller_get_no_grace() -> None:
    assert fold(RowView("i", "ready", NOW), None, NOW, grace_s=0.0)["state"] == "failed"
