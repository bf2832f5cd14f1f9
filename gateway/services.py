"""What the gateway keeps between requests: function cache, routing table, activity counters.

Built once in the app's lifespan (never at import time) and reached through ``gateway.deps``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import httpx
from sqlalchemy.orm import Session, sessionmaker

from dilu.addresses import is_loopback
from dilu.config import GatewaySettings, parse_range
from dilu.db import repo
from dilu.db.models import InstanceRow
from dilu.default_impl import create_scheduler
from dilu.failures import OUTAGES, FailureLog, describe
from dilu.local_sockets import open_folder
from dilu.messages import READY, Endpoint, InstanceRole
from dilu.state.base import Channel, StateStore, follow
from dilu.worker_client import WorkerDirectory
from gateway.activity import ActivityRecorder
from gateway.auth import Authenticator
from gateway.catalogue import FunctionCache
from gateway.dashboard.view import ShareHistory, sample
from gateway.forward import Forwarder
from gateway.invocation import Invoker
from gateway.routing import RoutingTable
from gateway.streams import StreamTimes

log = logging.getLogger(__name__)


FUNCTIONS_RESYNC_S = 120.0


class GatewayServices:
    def __init__(self, *, settings: GatewaySettings, sessions: sessionmaker[Session], store: StateStore,
                 directory: WorkerDirectory, http: httpx.AsyncClient) -> None:
        self.settings = settings
        self.sessions = sessions
        self._resynced_at = time.monotonic()
        self.store = store
        self.directory = directory
        self.http = http
        self.gateway_id = f"gw-{uuid.uuid4().hex[:8]}"
        self.routing = RoutingTable(settings.queue_size)
        self.functions = FunctionCache(sessions, self.routing)
        self.activity = ActivityRecorder(self.routing)
        self.forwarder = Forwarder(sockets=open_folder(settings.instance_sockets_folder))
        self.scheduler = create_scheduler(settings.scheduler)  # admits resizes as placements are admitted
        self.auth = Authenticator(sessions, settings.admin_key, always_closed=not is_loopback(settings.host),
                                  instance_uids=parse_range(settings.instance_uids),
                                  metrics_public=settings.metrics_public)
        self.stream_times = StreamTimes()  # time to first chunk and between chunks, for describe
        self.invoker = Invoker(settings=settings, functions=self.functions, routing=self.routing,
                               forwarder=self.forwarder, activity=self.activity, signal_demand=self.signal_demand,
                               stream_times=self.stream_times)
        self.functions.on_gone.append(self.invoker.stats.forget)     # a deleted function's statistics go too
        self._background: set[asyncio.Task] = set()
        self.shares = ShareHistory()       # the dashboard's granted/used shares over time
        self._tasks: list[asyncio.Task] = []
        self._demanding: dict[str, asyncio.Task] = {}    # per function, its demand signal in flight
        self._pending_counts: dict[str, dict[int, int]] = {}
        self._pending_totals: dict[str, int] = {}

    async def start(self) -> None:
        await self.forwarder.start()
        await self.auth.refresh()
        await self.functions.refresh()
        self.routing.replace_all(await self.current_routes())
        self._tasks = [
            asyncio.create_task(self._follow(Channel.ROUTES, self._on_routes)),
            asyncio.create_task(self._follow(Channel.FUNCTIONS, self._on_function)),
            asyncio.create_task(self._every(self.settings.routes_refresh_s, self._refresh_all)),
            asyncio.create_task(self._every(self.settings.stats_flush_s, self.flush_activity)),
            asyncio.create_task(self._every(self.settings.share_sample_s, self.sample_shares)),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        # Bounded: a stop must never hang on a client library that is slow to give up a read.
        await asyncio.wait(self._tasks, timeout=5.0) if self._tasks else None
        try:
            await self.flush_activity()
        except Exception as exc:  # a store that is down loses the last half-second's counts
            log.warning("final activity flush failed: %s", describe(exc), exc_info=not isinstance(exc, OUTAGES))
        await self.forwarder.close()

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Runs ``coroutine`` in the background, kept referenced until it ends."""
        task = asyncio.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def sample_shares(self) -> None:
        """Adds one sample of every GPU instance's granted and used share to the history."""
        telemetry = await self.store.telemetry()
        if not telemetry:
            return

        def active() -> list[InstanceRow]:
            with self.sessions() as session:
                return repo.list_instances(session=session, active_only=True)

        self.shares.add(time.time(), sample(await asyncio.to_thread(active), telemetry))

    async def _follow(self, channel: Channel, handle: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        """Handles the channel's events for ever: a lost state store is resubscribed to when it
        returns (meanwhile the periodic refresh keeps the gateway's view current)."""
        async for message in follow(self.store, channel):
            try:
                await handle(message)
            except Exception:
                log.exception("handling %s event failed", channel.value)

    async def _every(self, period_s: float, action: Callable[[], Awaitable[None]]) -> None:
        failures = FailureLog(log, f"the gateway's periodic {action.__name__}")
        while True:
            await asyncio.sleep(period_s)
            try:
                await action()
                failures.succeeded()
            except Exception as exc:  # noqa: BLE001 - tried again next period
                failures.failed(exc)

    async def _on_routes(self, message: dict[str, Any]) -> None:
        table = await self.current_routes()
        name = message.get("function")
        if name:
            self.routing.set_endpoints(name, table.get(name, []))
        else:
            self.routing.replace_all(table)

    async def _on_function(self, message: dict[str, Any]) -> None:
        await self.functions.refresh(message.get("function"))

    async def _refresh_all(self) -> None:
        """The periodic safety net beside the events: keys and routes every time; the function
        catalogue (announced on every change) at the longer FUNCTIONS_RESYNC_S."""
        await self.auth.refresh()
        if time.monotonic() - self._resynced_at >= FUNCTIONS_RESYNC_S:
            self._resynced_at = time.monotonic()
            await self.functions.refresh()
        self.routing.replace_all(await self.current_routes())

    async def current_routes(self) -> dict[str, list[Endpoint]]:
        """The routing table from the state store, or rebuilt from the database (the source of
        truth) while the store cannot answer."""
        try:
            return await self.store.get_routes()
        except Exception as exc:  # noqa: BLE001 - any store failure: fall back to the database
            log.warning("state store unavailable (%s): routing from the database", type(exc).__name__)
            return await asyncio.to_thread(self._routes_from_database)

    def _routes_from_database(self) -> dict[str, list[Endpoint]]:
        with self.sessions() as session:
            rows = repo.list_instances(session=session, active_only=True)
        routes: dict[str, list[Endpoint]] = {}
        for row in rows:
            if row.state == READY and row.endpoint and row.role == InstanceRole.SERVE:
                routes.setdefault(row.function, []).append(Endpoint(row.id, row.endpoint, row.worker_id))
        return routes

    async def flush_activity(self) -> None:
        """Sends the counters gathered since the last flush to the state store and the request
        totals to the database, each on its own: what one of them could not take is kept and
        sent with the next flush, so an outage of either loses no count."""
        snapshot, counts = self.activity.take()
        self._pending_counts = _merge_counts(self._pending_counts, counts)
        for name, per_second in counts.items():
            self._pending_totals[name] = self._pending_totals.get(name, 0) + sum(per_second.values())
        sending, self._pending_counts = self._pending_counts, {}
        totals, self._pending_totals = self._pending_totals, {}
        failure: Exception | None = None
        try:
            await self.store.report_activity(self.gateway_id, snapshot, sending,
                                             max(5.0, self.settings.stats_flush_s * 4))
        except Exception as exc:  # noqa: BLE001 - kept and sent with the next flush
            self._pending_counts, failure = _merge_counts(sending, self._pending_counts), exc
        if totals:
            try:
                await asyncio.to_thread(self._add_counts, totals)
            except Exception as exc:  # noqa: BLE001 - kept and sent with the next flush
                for name, count in totals.items():
                    self._pending_totals[name] = self._pending_totals.get(name, 0) + count
                failure = failure or exc
        if failure is not None:
            raise failure

    def _add_counts(self, totals: dict[str, int]) -> None:
        with self.sessions() as session:
            repo.add_request_counts(session=session, counts=totals)

    def signal_demand(self, function: str) -> None:
        """A request is queued: ``demand`` in the background, one signal per function in flight
        (requests queued meanwhile say nothing new), out of reach of the request's own
        cancellation (its caller leaving), which would cut a state-store command half-way."""
        pending = self._demanding.get(function)
        if pending is None or pending.done():
            self._demanding[function] = self.spawn(self.demand(function))

    async def demand(self, function: str) -> None:
        """A request is queued: tell the controller now rather than at the next flush. Never
        fails the request: without a state store the next flush that gets through tells it."""
        try:
            await self.flush_activity()
            await self.store.publish(Channel.DEMAND, {"function": function})
        except Exception as exc:  # noqa: BLE001 - the next flush that gets through tells it
            log.warning("could not signal demand for %s: %s", function, type(exc).__name__)

    async def wake_controller(self) -> None:
        """Flushes the activity and wakes the controller: releases asked for take effect now,
        not at its next pass. Never fails: the next flush and pass catch up."""
        try:
            await self.flush_activity()
            await self.store.publish(Channel.DEMAND, {"release": True})
        except Exception as exc:  # noqa: BLE001 - the next flush and pass catch up
            log.warning("could not wake the controller: %s", type(exc).__name__)

    async def notify(self, channel: Channel, message: dict[str, Any]) -> None:
        """Publishes a change; the database already holds it, so a state store outage only
        delays who hears of it until the periodic refreshes."""
        try:
            await self.store.publish(channel, message)
        except Exception as exc:  # noqa: BLE001 - the database holds it; refreshes catch up
            log.warning("could not publish on %s: %s", channel.value, type(exc).__name__)


def _merge_counts(first: dict[str, dict[int, int]], second: dict[str, dict[int, int]]) -> dict[str, dict[int, int]]:
    merged = {name: dict(per_second) for name, per_second in first.items()}
    for name, per_second in second.items():
        target = merged.setdefault(name, {})
        for moment, count in per_second.items():
            target[moment] = target.get(moment, 0) + count
    return merged
