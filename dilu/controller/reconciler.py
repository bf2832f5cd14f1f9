"""The reconcile loop: desired vs actual instances per function, placement, liveness.

One controller runs at a time. Each pass is idempotent: it reads the database, the workers'
reports and the gateways' activity, asks policy for decisions, and carries them out.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from dilu.controller.observe import UNKNOWN_GRACE_S, RowView, fold
from dilu.db import repo
from dilu.db.models import FunctionRow, InstanceRow, utcnow
from dilu.messages import (ACTIVE_STATES, FAILED, READY, STARTING, STOPPING, Endpoint, FunctionActivity,
                           InstanceStatus, StartInstance, WorkerInfo)
from dilu.policy.placement import PlacementRequest, Scheduler, WorkerView
from dilu.policy.replicas import ReplicaContext, desired_instances
from dilu.state.base import Channel, StateStore
from worker.client import WorkerClient, WorkerDirectory, WorkerUnavailable

log = logging.getLogger(__name__)
MAX_START_FAILURES = 3
KEEP_ENDED_INSTANCES = 20


@dataclass
class _Snapshot:
    functions: list[FunctionRow]
    instances: list[InstanceRow]


class Reconciler:
    def __init__(self, *, sessions: sessionmaker[Session], store: StateStore, directory: WorkerDirectory,
                 scheduler: Scheduler, interval_s: float = 0.5, stop_grace_s: float = 5.0) -> None:
        self._sessions = sessions
        self._store = store
        self._directory = directory
        self._scheduler = scheduler
        self._interval_s = interval_s
        self._routes: dict[str, list[Endpoint]] = {}
        self._start_failures: dict[tuple[str, int], int] = {}
        self._last_reason: dict[str, str] = {}
        self._background: set[asyncio.Task] = set()
        self._pending_stops: list[tuple[WorkerClient, str]] = []
        self._owners: dict[str, str] = {}  # instance id -> worker id, as last observed
        self._wake = asyncio.Event()
        self._started_at = utcnow()

    # ---- database helpers (sync, run in a thread) ----
    def _db(self, fn, /, **kwargs):  # noqa: ANN001, ANN003
        with self._sessions() as session:
            return fn(session=session, **kwargs)

    async def _call_db(self, fn, /, **kwargs):  # noqa: ANN001, ANN003
        return await asyncio.to_thread(self._db, fn, **kwargs)

    async def _event(self, function: str, action: str, reason: str, instance_id: str | None = None) -> None:
        log.info("%s %s: %s", function, action, reason)
        await self._call_db(repo.record_event, function=function, action=action, reason=reason,
                            instance_id=instance_id)

    # ---- the loop ----
    async def run(self) -> None:
        """Reconciles every interval, and at once when a worker, gateway or deploy signals."""
        try:
            self._routes = await self._store.get_routes()
        except Exception:
            log.exception("could not read the routing table; it will be rebuilt")
        listeners = [asyncio.create_task(self._listen(channel))
                     for channel in (Channel.INSTANCES, Channel.DEMAND, Channel.FUNCTIONS)]
        try:
            while True:
                self._wake.clear()
                started = time.perf_counter()
                try:
                    await self.reconcile_once()
                except Exception:
                    log.exception("reconcile pass failed")
                log.debug("reconcile pass took %.1f ms", (time.perf_counter() - started) * 1000)
                try:
                    await asyncio.wait_for(self._wake.wait(), self._interval_s)
                except TimeoutError:
                    pass
        finally:
            for task in listeners:
                task.cancel()

    async def _listen(self, channel: Channel) -> None:
        subscription = await self._store.subscribe(channel)
        try:
            while True:
                if await subscription.get(timeout=5.0) is not None:
                    self._wake.set()
        finally:
            await subscription.aclose()

    async def reconcile_once(self) -> None:
        now = utcnow()
        live = await self._store.live_workers()
        await self._call_db(repo.upsert_workers, workers=live, now=now)
        known = await self._call_db(repo.list_workers)
        lost = [w.id for w in known if w.state == "alive" and w.id not in {i.id for i in live}]
        if lost:
            log.warning("workers lost: %s", ", ".join(lost))
            await self._call_db(repo.mark_workers_lost, worker_ids=lost, now=now)
        observed, reachable = await self._observe(live)
        snapshot = await asyncio.to_thread(self._read_snapshot)
        await self._fold_observations(snapshot, observed, reachable, now)
        await self._stop_orphans(snapshot, observed, live)
        snapshot = await asyncio.to_thread(self._read_snapshot)
        activity = await self._store.function_activity()
        for function in snapshot.functions:
            try:
                await self._reconcile_function(function, snapshot, activity.get(function.name, FunctionActivity()),
                                               live)
            except Exception:
                log.exception("reconciling %s failed", function.name)
        await self._publish_routes(await asyncio.to_thread(self._read_snapshot))
        # Stop only after the routes without these instances are out, so the gateway drains them
        # instead of sending new requests to a server that is shutting down.
        stops, self._pending_stops = self._pending_stops, []
        for client, instance_id in stops:
            self._spawn(client.stop_instance(instance_id))
        await self._call_db(repo.prune_instances, keep_ended=KEEP_ENDED_INSTANCES)

    def _read_snapshot(self) -> _Snapshot:
        with self._sessions() as session:
            return _Snapshot(repo.list_functions(session=session), repo.list_instances(session=session))

    async def _observe(self, live: Sequence[WorkerInfo]) -> tuple[dict[str, InstanceStatus], set[str]]:
        async def one(info: WorkerInfo) -> tuple[str, list[InstanceStatus] | None]:
            client = self._directory.client_for(info.id, info.url)
            if client is None:
                return info.id, None
            try:
                return info.id, await client.list_instances()
            except WorkerUnavailable as exc:
                log.warning("%s", exc)
                return info.id, None

        observed: dict[str, InstanceStatus] = {}
        reachable: set[str] = set()
        self._owners = {}
        for worker_id, statuses in await asyncio.gather(*(one(info) for info in live)):
            if statuses is None:
                continue
            reachable.add(worker_id)
            observed.update({status.instance_id: status for status in statuses})
            self._owners.update({status.instance_id: worker_id for status in statuses})
        return observed, reachable

    async def _fold_observations(self, snapshot: _Snapshot, observed: dict[str, InstanceStatus],
                                 reachable: set[str], now) -> None:  # noqa: ANN001
        for row in snapshot.instances:
            if row.state not in ACTIVE_STATES | {STOPPING} or row.worker_id not in reachable:
                continue
            status = observed.get(row.id)
            grace = UNKNOWN_GRACE_S if row.created_at >= self._started_at else 0.0
            updates = fold(RowView(row.id, row.state, row.created_at), status, now, grace)
            if not updates:
                continue
            await self._call_db(repo.update_instance, instance_id=row.id, **updates)
            if updates["state"] == FAILED:
                was_ready = bool(status and status.was_ready) or row.state == READY
                await self._instance_failed(row, updates.get("error") or "failed", was_ready)
            elif updates["state"] == READY:
                self._start_failures.pop((row.function, row.function_version), None)
                await self._event(row.function, "ready", f"instance {row.id} is ready", row.id)

    async def _instance_failed(self, row: InstanceRow, error: str, was_ready: bool) -> None:
        if was_ready:
            await self._event(row.function, "crashed", f"instance {row.id} ended: {error}", row.id)
            return
        key = (row.function, row.function_version)
        self._start_failures[key] = self._start_failures.get(key, 0) + 1
        function = await self._call_db(repo.get_function, name=row.function)
        if function is None or function.version != row.function_version:
            return
        # A deployment that cannot load fails at once; a running function that can no longer
        # start instances fails after a few tries instead of restarting forever.
        if function.status == "deploying" or self._start_failures[key] >= MAX_START_FAILURES:
            await self._call_db(repo.set_function_status, name=row.function, version=row.function_version,
                                status="failed", error=error)
            await self._event(row.function, "failed", error, row.id)
            await self._store.publish(Channel.FUNCTIONS, {"function": row.function})
        else:
            await self._event(row.function, "start-failed", error, row.id)

    async def _stop_orphans(self, snapshot: _Snapshot, observed: dict[str, InstanceStatus],
                            live: Sequence[WorkerInfo]) -> None:
        """Stops instances a worker runs that the database no longer wants (deleted functions)."""
        wanted = {row.id for row in snapshot.instances if row.state in ACTIVE_STATES}
        stopping = {row.id for row in snapshot.instances if row.state == STOPPING}
        urls = {info.id: info.url for info in live}
        for instance_id, status in observed.items():
            if status.state in (STARTING, READY) and instance_id not in wanted | stopping:
                owner = self._owners[instance_id]
                client = self._directory.client_for(owner, urls.get(owner))
                if client is not None:
                    self._spawn(client.stop_instance(instance_id))

    async def _reconcile_function(self, function: FunctionRow, snapshot: _Snapshot,
                                  activity: FunctionActivity, live: Sequence[WorkerInfo]) -> None:
        mine = [row for row in snapshot.instances if row.function == function.name]
        current = [row for row in mine if row.function_version == function.version and row.state in ACTIVE_STATES]
        old = [row for row in mine if row.function_version != function.version and row.state in ACTIVE_STATES]

        if function.status == "deploying" and any(row.state == READY for row in current):
            await self._call_db(repo.set_function_status, name=function.name, version=function.version,
                                status="ready")
            await self._event(function.name, "deployed", f"version {function.version} is ready")
            await self._store.publish(Channel.FUNCTIONS, {"function": function.name})
            function = await self._call_db(repo.get_function, name=function.name)

        if old and (function.status != "deploying"):
            for row in old:
                await self._stop(row, f"replaced by version {function.version}")

        await self._resize(function, current, live)
        spec = function.spec
        last_request = activity.last_request_at
        became_ready = function.updated_at.timestamp() if function.status == "ready" else None
        last_active = max([t for t in (last_request, became_ready) if t is not None], default=None)
        decision = desired_instances(ReplicaContext(
            now=time.time(), status=function.status,
            min_instances=spec["scaling"]["min_instances"], max_instances=spec["scaling"]["max_instances"],
            keep_alive_s=spec["scaling"]["keep_alive_s"], current=len(current),
            in_flight=activity.in_flight, queued=activity.queued, last_active_at=last_active,
            concurrency_per_instance=2 * spec["batching"]["max_batch_size"]))

        if decision.desired > len(current):
            for _ in range(decision.desired - len(current)):
                if not await self._start(function, live, snapshot, decision.reason):
                    break
        elif decision.desired < len(current):
            # Stop starting instances first, then the newest ready ones.
            victims = sorted(current, key=lambda r: (r.state == READY, r.created_at), reverse=False)
            victims = victims[: len(current) - decision.desired]
            for row in victims:
                await self._stop(row, decision.reason)

    async def _resize(self, function: FunctionRow, current: list[InstanceRow], live: Sequence[WorkerInfo]) -> None:
        """Pushes a changed pinned slice to running instances (vertical scaling, no restart)."""
        resources = function.spec["resources"]
        wanted = (resources.get("sm_request"), resources.get("sm_limit"))
        if wanted[0] is None or wanted[1] is None:
            return
        urls = {info.id: info.url for info in live}
        for row in current:
            if (row.sm_request, row.sm_limit) == wanted or row.worker_id not in urls:
                continue
            client = self._directory.client_for(row.worker_id, urls[row.worker_id])
            try:
                applied = client is not None and await client.set_slice(row.id, wanted[0], wanted[1])
            except WorkerUnavailable as exc:
                log.warning("resizing %s failed: %s", row.id, exc)
                continue
            if applied:
                await self._call_db(repo.update_instance, instance_id=row.id, sm_request=wanted[0],
                                    sm_limit=wanted[1])
                await self._event(function.name, "resize",
                                  f"{row.id} slice -> request {wanted[0]:g}, limit {wanted[1]:g}", row.id)

    async def _start(self, function: FunctionRow, live: Sequence[WorkerInfo], snapshot: _Snapshot,
                     reason: str) -> bool:
        spec = function.spec
        resources = spec["resources"]
        request = PlacementRequest(function=function.name, memory_bytes=resources["memory"], gpu=resources["gpu"],
                                   sm_request=resources.get("sm_request"), sm_limit=resources.get("sm_limit"))
        views = await asyncio.to_thread(self._worker_views, live)
        decision = self._scheduler.place(request, views)
        if decision.worker_id is None:
            message = f"cannot place an instance: {decision.reason}"
            if self._last_reason.get(function.name) != message:
                self._last_reason[function.name] = message
                await self._event(function.name, "unschedulable", message)
            return False
        self._last_reason.pop(function.name, None)
        info = next(w for w in live if w.id == decision.worker_id)
        client = self._directory.client_for(info.id, info.url)
        instance_id = f"{function.name}-{uuid.uuid4().hex[:10]}"
        row = InstanceRow(id=instance_id, function=function.name, function_version=function.version,
                          worker_id=info.id, state=STARTING, memory_bytes=request.memory_bytes,
                          sm_request=request.sm_request, sm_limit=request.sm_limit, created_at=utcnow())
        await self._call_db(repo.create_instance, row=row)
        await self._event(function.name, "scale-up", f"{reason}; {decision.reason}", instance_id)
        order = StartInstance(instance_id=instance_id, function=function.name, version=function.version,
                              spec=spec, source_dir=function.source_dir, memory_bytes=request.memory_bytes,
                              sm_request=request.sm_request, sm_limit=request.sm_limit)
        try:
            status = await client.start_instance(order)
        except WorkerUnavailable as exc:
            await self._call_db(repo.update_instance, instance_id=instance_id, state=FAILED,
                                error=str(exc), ended_at=utcnow())
            return False
        if status.endpoint:
            await self._call_db(repo.update_instance, instance_id=instance_id, endpoint=status.endpoint)
        return True

    def _worker_views(self, live: Sequence[WorkerInfo]) -> list[WorkerView]:
        with self._sessions() as session:
            active = repo.list_instances(session=session, active_only=True)
        views = []
        for info in live:
            on_it = [row for row in active if row.worker_id == info.id]
            views.append(WorkerView(
                id=info.id, device_kind=info.device.kind, memory_bytes=info.device.memory_bytes,
                memory_used=sum(row.memory_bytes for row in on_it),
                sm_requested=sum(row.sm_request or 0.0 for row in on_it),
                sm_limited=sum(row.sm_limit or 0.0 for row in on_it)))
        return views

    async def _stop(self, row: InstanceRow, reason: str) -> None:
        await self._call_db(repo.update_instance, instance_id=row.id, state=STOPPING)
        await self._event(row.function, "scale-down", f"{reason}; stopping {row.id}", row.id)
        with self._sessions() as session:
            worker = next((w for w in repo.list_workers(session=session) if w.id == row.worker_id), None)
        client = self._directory.client_for(row.worker_id, worker.url if worker else None)
        if client is not None:
            self._pending_stops.append((client, row.id))

    def _spawn(self, coroutine) -> None:  # noqa: ANN001
        async def guarded() -> None:
            try:
                await coroutine
            except Exception:
                log.exception("background worker call failed")
            self._wake.set()

        task = asyncio.create_task(guarded())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _publish_routes(self, snapshot: _Snapshot) -> None:
        routes: dict[str, list[Endpoint]] = {}
        for row in snapshot.instances:
            if row.state == READY and row.endpoint:
                routes.setdefault(row.function, []).append(Endpoint(row.id, row.endpoint))
        for name in set(routes) | set(self._routes):
            endpoints = sorted(routes.get(name, []), key=lambda e: e.instance_id)
            if endpoints != self._routes.get(name):
                await self._store.set_routes(name, endpoints)
                await self._store.publish(Channel.ROUTES, {"function": name})
        self._routes = {name: sorted(eps, key=lambda e: e.instance_id) for name, eps in routes.items()}

    async def shutdown(self) -> None:
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
