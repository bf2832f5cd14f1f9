"""The ephemeral-state contract shared by the in-process store and the Redis store.

Everything here can be rebuilt: losing it costs a few seconds of stale routing or a missed
wake-up, never data. Durable state lives in the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from enum import StrEnum
from typing import Any, Protocol

from dilu.messages import Endpoint, FunctionActivity, WorkerInfo
from dilu.workflows.hints import WorkflowHint, merge_hints

log = logging.getLogger(__name__)

REQUEST_HISTORY_S = 120


class Channel(StrEnum):
    """Event channels. Messages are small JSON dicts; subscribers must tolerate missing ones."""

    DEMAND = "demand"          # {"function": name}: a request is waiting and nothing serves it;
    #                            {"release": true}: a gateway asked for releases that apply now
    INSTANCES = "instances"    # {"worker": id, "instance": id}: a worker saw an instance change
    ROUTES = "routes"          # {"function": name}: the routing table of a function changed
    FUNCTIONS = "functions"    # {"function": name}: deployed, updated or deleted


class Subscription(Protocol):
    async def get(self, timeout: float) -> dict[str, Any] | None:
        """The next message, or None when ``timeout`` seconds pass without one."""

    async def aclose(self) -> None:
        """Stops receiving; idempotent."""


class StateStore(Protocol):
    async def heartbeat(self, info: WorkerInfo, ttl_s: float) -> None:
        """Announces a live worker; it counts as live until ``ttl_s`` passes without another."""

    async def live_workers(self) -> list[WorkerInfo]:
        """Workers whose heartbeat has not expired."""

    async def report_activity(self, gateway_id: str, snapshot: dict[str, dict[str, Any]],
                              counts: dict[str, dict[int, int]], ttl_s: float) -> None:
        """Stores one gateway's per-function snapshot (in_flight, queued, last_request_at) for
        ``ttl_s`` and adds ``counts`` (function -> unix second -> requests) to the counters."""

    async def function_activity(self) -> dict[str, FunctionActivity]:
        """Per-function activity summed over live gateway snapshots, with recent counters."""

    async def report_telemetry(self, worker_id: str, instances: dict[str, dict[str, Any]], ttl_s: float) -> None:
        """Stores a worker's telemetry (per instance: token-manager view, progress rate) for ``ttl_s``."""

    async def telemetry(self) -> dict[str, dict[str, Any]]:
        """Per-instance telemetry from every live worker."""

    async def set_routes(self, function: str, endpoints: list[Endpoint], term: int | None = None) -> None:
        """Replaces the ready endpoints of ``function`` (an empty list removes it). With ``term``
        (a leading controller's), raises ``dilu.fencing.Deposed`` instead if a newer term has
        written routes: a deposed leader's late table must not replace the new leader's."""

    async def get_routes(self) -> dict[str, list[Endpoint]]:
        """The whole routing table."""

    async def append_history(self, key: str, item: dict[str, Any], keep: int, ttl_s: float) -> None:
        """Appends ``item`` to the list ``key``, keeping its newest ``keep``; the list is gone
        ``ttl_s`` after its last append (what every gateway's requests said, shared)."""

    async def histories(self, keys: list[str]) -> dict[str, list[dict[str, Any]]]:
        """Each list's items, oldest first (empty for a list never appended to)."""

    async def publish(self, channel: Channel, message: dict[str, Any]) -> None:
        """Best-effort broadcast to current subscribers of ``channel``."""

    async def subscribe(self, channel: Channel) -> Subscription:
        """Receives every message published on ``channel`` after this call returns."""

    async def close(self) -> None:
        """Releases connections; idempotent."""


def merge_activity(snapshots: list[dict[str, dict[str, Any]]],
                   counts: dict[str, dict[int, int]]) -> dict[str, FunctionActivity]:
    """Sums gateway snapshots into one FunctionActivity per function."""
    merged: dict[str, dict[str, Any]] = {}
    for snapshot in snapshots:
        for name, item in snapshot.items():
            into = merged.setdefault(name, {"in_flight": 0, "queued": 0, "last_request_at": None})
            into["in_flight"] += int(item.get("in_flight", 0))
            into["queued"] += int(item.get("queued", 0))
            last = item.get("last_request_at")
            if last is not None and (into["last_request_at"] is None or last > into["last_request_at"]):
                into["last_request_at"] = last
            into.setdefault("hints", []).append(WorkflowHint.from_wire(item.get("workflow")))
    names = set(merged) | set(counts)
    return {
        name: FunctionActivity(
            in_flight=merged.get(name, {}).get("in_flight", 0),
            queued=merged.get(name, {}).get("queued", 0),
            last_request_at=merged.get(name, {}).get("last_request_at"),
            requests=dict(counts.get(name, {})),
            workflow=merge_hints(merged.get(name, {}).get("hints", [])),
        )
        for name in names
    }


async def follow(store: StateStore, channel: Channel, retry_s: float = 0.2,
                 max_retry_s: float = 2.0) -> AsyncIterator[dict[str, Any]]:
    """The channel's messages for as long as the caller iterates, across state store outages:
    a lost subscription is made again when the store returns, and then an empty message is
    yielded, meaning "events may have been missed: refresh everything"."""
    delay = retry_s
    lost = False
    while True:
        subscription = None
        try:
            subscription = await store.subscribe(channel)
            if lost:
                log.warning("state store is back: following %s again", channel.value)
                lost, delay = False, retry_s
                yield {}
            while True:
                message = await subscription.get(timeout=5.0)
                _raise_if_cancelled()
                if message is not None:
                    yield message
        except (asyncio.CancelledError, GeneratorExit):
            raise
        except Exception as exc:  # noqa: BLE001 - any store failure: wait and subscribe again
            if not lost:
                log.warning("lost the state store while following %s (%s); retrying", channel.value,
                            type(exc).__name__)
            lost = True
        finally:
            if subscription is not None:
                with contextlib.suppress(Exception, asyncio.TimeoutError):
                    async with asyncio.timeout(1.0):
                        await subscription.aclose()
        _raise_if_cancelled()
        await asyncio.sleep(delay)
        delay = min(max_retry_s, delay * 2)


def _raise_if_cancelled() -> None:
    """Re-raises a cancellation a client library swallowed (redis-py's pub/sub can return from a
    read as if it timed out when the task was cancelled in it): the task was asked to stop."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError()
