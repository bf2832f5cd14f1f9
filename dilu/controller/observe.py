"""Folding what workers report into instance rows (pure bookkeeping, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dilu.messages import FAILED, READY, STARTING, STOPPED, STOPPING, InstanceStatus

# Rows are created before their start call returns; a short grace covers a start still in flight.
UNKNOWN_GRACE_S = 3.0


@dataclass(frozen=True)
class RowView:
    id: str
    state: str
    created_at: datetime


def fold(row: RowView, status: InstanceStatus | None, now: datetime,
         grace_s: float = UNKNOWN_GRACE_S) -> dict[str, Any] | None:
    """Column updates that bring ``row`` in line with the worker's ``status``; None if none.

    A row the worker does not know (after the grace for a start in flight) has failed: the worker
    restarted or dropped it. Rows from before this controller started get no grace.
    """
    if status is None:
        if grace_s <= 0 or (now - row.created_at).total_seconds() > grace_s:
            return {"state": FAILED, "error": "the worker no longer knows this instance", "ended_at": now}
        return None
    if status.state == row.state:
        return None
    updates: dict[str, Any] = {"state": status.state}
    if status.endpoint:
        updates["endpoint"] = status.endpoint
    if status.state == READY:
        updates["ready_at"] = _when(status, row, now)
    if status.state in (FAILED, STOPPED):
        updates["ended_at"] = _when(status, row, now)
        updates["error"] = status.error
    if status.state == STARTING and row.state in (STOPPING, READY):
        # A report read before the instance became ready (and was routed at once) or before a
        # stop was sent: the worker's older view must not undo either.
        return None
    return updates


def _when(status: InstanceStatus, row: RowView, now: datetime) -> datetime:
    """When the state began as the worker saw it (not when this controller noticed: instance
    times count the memory held), kept between the row's creation and now (clocks may differ)."""
    if status.changed_at is None:
        return now
    seen = datetime.fromtimestamp(status.changed_at, tz=UTC)
    if now.tzinfo is None:          # naive UTC, as some databases return it
        seen = seen.replace(tzinfo=None)
    return min(now, max(row.created_at, seen))
