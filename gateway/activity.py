"""What this gateway's functions are doing: requests counted per second and the time of the
last, published by ``gateway.services`` to the state store (the hot path does no I/O)."""

from __future__ import annotations

import time
from typing import Any

from dilu.workflows.hints import WorkflowHints
from gateway.routing import RoutingTable


class ActivityRecorder:
    """Counts requests locally and flushes them to the state store, so the hot path does no I/O;
    beside each function's load it publishes its workflows' hint (``hints``)."""

    def __init__(self, routing: RoutingTable) -> None:
        self._routing = routing
        self._counts: dict[str, dict[int, int]] = {}
        self._last_request: dict[str, float] = {}
        self.hints = WorkflowHints()

    def started(self, function: str, direct: bool = True) -> None:
        now = time.time()
        if direct:
            self.hints.direct(function, now)
        per_second = self._counts.setdefault(function, {})
        second = int(now)
        per_second[second] = per_second.get(second, 0) + 1
        self._last_request[function] = now

    def answered(self, function: str) -> None:
        """An instance of ``function`` answered (or failed) a request: the function is idle from
        now, not from when the request began (``last_request_at``, which its keep-alive counts
        from: a request longer than the keep-alive had its instance stopped as it answered)."""
        self._last_request[function] = time.time()

    def take(self) -> tuple[dict[str, dict[str, Any]], dict[str, dict[int, int]]]:
        """The snapshot to publish and the counts gathered since the last call."""
        counts, self._counts = self._counts, {}
        hints = self.hints.snapshot(time.time())
        # Only functions with something to say: an absent one reads as idle (no requests in
        # flight or queued), so an idle catalogue of thousands costs nothing per flush.
        busy = self._routing.busy()
        snapshot = {
            name: {"in_flight": self._routing.in_flight(name), "queued": self._routing.queued(name),
                   "last_request_at": self._last_request.get(name),
                   "workflow": hints[name].to_wire() if name in hints else None}
            for name in busy | set(self._last_request) | set(hints)
        }
        return snapshot, counts
