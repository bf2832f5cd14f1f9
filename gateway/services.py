"""What the gateway keeps between requests: function cache, routing table, activity counters.

Built once in the app's lifespan (never at import time) and reached through ``gateway.deps``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

import httpx
from sqlalchemy.orm import Session, sessionmaker

from dilu.config import GatewaySettings
from dilu.db import repo
from dilu.default_impl import create_scheduler
from dilu.messages import FunctionStatus
from dilu.state.base import Channel, StateStore
from gateway.forward import Forwarder
from gateway.routing import RoutingTable
from dilu.worker_client import WorkerDirectory

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FunctionEntry:
    name: str
    version: int
    status: str
    error: str | None
    spec: dict[str, Any]


class FunctionCache:
    """Specs and statuses of deployed functions, refreshed on events and periodically."""

    def __init__(self, sessions: sessionmaker[Session], routing: RoutingTable) -> None:
        self._sessions = sessions
        self._routing = routing
        self._entries: dict[str, FunctionEntry] = {}

    def get(self, name: str) -> FunctionEntry | None:
        return self._entries.get(name)

    def names(self) -> list[str]:
        return list(self._entries)

    def _load(self, name: str | None) -> list[FunctionEntry]:
        with self._sessions() as session:
            rows = ([repo.get_function(session=session, name=name)] if name
                    else repo.list_functions(session=session))
            return [FunctionEntry(r.name, r.version, r.status, r.error, r.spec) for r in rows if r is not None]

    async def refresh(self, name: str | None = None) -> None:
        """Reloads one function (or all) from the database."""
        entries = await asyncio.to_thread(self._load, name)
        found = {entry.name: entry for entry in entries}
        gone = ([name] if name and name not in found else
                [] if name else [n for n in self._entries if n not in found])
        for missing in gone:
            self._entries.pop(missing, None)
            self._routing.forget(missing)
        for entry in entries:
            self._entries[entry.name] = entry
            self._routing.set_failure(entry.name, entry.error if entry.status == FunctionStatus.FAILED else None)


class ActivityRecorder:
    """Counts requests locally and flushes them to the state store, so the hot path does no I/O."""

    def __init__(self, routing: RoutingTable) -> None:
        self._routing = routing
        self._counts: dict[str, dict[int, int]] = {}
        self._last_request: dict[str, float] = {}

    def started(self, function: str) -> None:
        now = time.time()
        per_second = self._counts.setdefault(function, {})
        second = int(now)
        per_second[second] = per_second.get(second, 0) + 1
        self._last_request[function] = now

    def take(self, functions: list[str]) -> tuple[dict[str, dict[str, Any]], dict[str, dict[int, int]]]:
        """The snapshot to publish and the counts gathered since the last call."""
        counts, self._counts = self._counts, {}
        snapshot = {
            name: {"in_flight": self._routing.in_flight(name), "queued": self._routing.queued(name),
                   "last_request_at": self._last_request.get(name)}
            for name in set(functions) | set(self._last_request)
        }
        return snapshot, counts


class GatewayServices:
    def __init__(self, *, settings: GatewaySettings, sessions: sessionmaker[Session], store: StateStore,
                 directory: WorkerDirectory, http: httpx.AsyncClient) -> None:
        self.settings = settings
        self.sessions = sessions
        self.store = store
        self.directory = directory
        self.http = http
        self.gateway_id = f"gw-{uuid.uuid4().hex[:8]}"
        self.routing = RoutingTable(settings.queue_size)
        self.functions = FunctionCache(sessions, self.routing)
        self.activity = ActivityRecorder(self.routing)
        self.forwarder = Forwarder()
        self.scheduler = create_scheduler(settings.scheduler)  # admits resizes as placements are admitted
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        await self.forwarder.start()
        await self.functions.refresh()
        self.routing.replace_all(await self.store.get_routes())
        self._tasks = [
            asyncio.create_task(self._follow(Channel.ROUTES, self._on_routes)),
            asyncio.create_task(self._follow(Channel.FUNCTIONS, self._on_function)),
            asyncio.create_task(self._every(self.settings.routes_refresh_s, self._refresh_all)),
            asyncio.create_task(self._every(self.settings.stats_flush_s, self.flush_activity)),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            await self.flush_activity()
        except Exception:
            log.exception("final activity flush failed")
        await self.forwarder.close()

    async def _follow(self, channel: Channel, handle) -> None:  # noqa: ANN001
        subscription = await self.store.subscribe(channel)
        try:
            while True:
                message = await subscription.get(timeout=5.0)
                if message is not None:
                    try:
                        await handle(message)
                    except Exception:
                        log.exception("handling %s event failed", channel.value)
        finally:
            await subscription.aclose()

    async def _every(self, period_s: float, action) -> None:  # noqa: ANN001
        while True:
            await asyncio.sleep(period_s)
            try:
                await action()
            except Exception:
                log.exception("periodic gateway task failed")

    async def _on_routes(self, message: dict[str, Any]) -> None:
        table = await self.store.get_routes()
        name = message.get("function")
        if name:
            self.routing.set_endpoints(name, table.get(name, []))
        else:
            self.routing.replace_all(table)

    async def _on_function(self, message: dict[str, Any]) -> None:
        await self.functions.refresh(message.get("function"))

    async def _refresh_all(self) -> None:
        await self.functions.refresh()
        self.routing.replace_all(await self.store.get_routes())

    async def flush_activity(self) -> None:
        snapshot, counts = self.activity.take(self.functions.names())
        ttl = max(5.0, self.settings.stats_flush_s * 4)
        await self.store.report_activity(self.gateway_id, snapshot, counts, ttl)
        totals = {name: sum(per_second.values()) for name, per_second in counts.items()}
        if totals:
            await asyncio.to_thread(self._add_counts, totals)

    def _add_counts(self, totals: dict[str, int]) -> None:
        with self.sessions() as session:
            repo.add_request_counts(session=session, counts=totals)

    async def demand(self, function: str) -> None:
        """A request is queued: tell the controller now rather than at the next flush."""
        await self.flush_activity()
        await self.store.publish(Channel.DEMAND, {"function": function})
