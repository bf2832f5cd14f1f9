"""The reconcile loop: liveness of workers, what instances really do, and the routing table.

One controller acts at a time: the one holding the lease (``dilu.controller.leadership``), whose
term every write, order and route carries (``dilu.fencing``). Each pass is idempotent: it reads
the database, the workers' reports and the gateways' activity, folds observations into instance
rows, lets the function manager decide and act per function, then publishes the routes. A stop
is sent as soon as it is decided, once the routes without that instance are out, so the gateway
drains it first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from dilu.config import ControllerSettings
from dilu.controller import evidence
from dilu.controller.actuators import Actuator
from dilu.controller.context import ControllerContext
from dilu.controller.functions import FunctionManager
from dilu.controller.observe import UNKNOWN_GRACE_S, RowView, fold
from dilu.db import repo
from dilu.db.models import FunctionRow, InstanceRow, ProfileRow, WorkerRow, utcnow
from dilu.failures import FailureLog
from dilu.fencing import Deposed
from dilu.messages import (
    ACTIVE_STATES,
    FAILED,
    READY,
    STARTING,
    STOPPED,
    STOPPING,
    Endpoint,
    FunctionActivity,
    FunctionStatus,
    InstanceRole,
    InstanceStatus,
    WorkerInfo,
)
from dilu.policy.scheduler import Scheduler
from dilu.policy.visits import SETTLED_STATUSES, FunctionFacts, needs_visit, pass_interval_s, quiet
from dilu.policy.worker_loss import lost_workers
from dilu.state.base import Channel, StateStore, follow
from dilu.worker_client import QUICK_CALL_S, WorkerDirectory, WorkerUnavailable

log = logging.getLogger(__name__)
MAX_START_FAILURES = 3
KEEP_ENDED_INSTANCES = 20
SHUTDOWN_GRACE_S = 5.0
WORKERS_WRITE_EVERY_S = 1.0
PRUNE_EVERY_S = 5.0


@dataclass
class _Snapshot:
    functions: list[FunctionRow]
    instances: list[InstanceRow]
    profiles: dict[tuple[str, int], ProfileRow]
    by_name: dict[str, FunctionRow] = field(default_factory=dict)


def _patched(session: Session, catalogue: tuple[dict[str, FunctionRow], dict[tuple[str, int], ProfileRow]],
             names: set[str]) -> tuple[dict[str, FunctionRow], dict[tuple[str, int], ProfileRow]]:
    """The catalogue with the rows and profiles of ``names`` read again (gone ones dropped)."""
    functions, profiles = dict(catalogue[0]), dict(catalogue[1])
    for name in names:
        row = repo.get_function(session=session, name=name)
        if row is None:
            functions.pop(name, None)
        else:
            functions[name] = row
        for key in [key for key in profiles if key[0] == name]:
            del profiles[key]
        profiles.update({(p.function, p.version): p for p in repo.profiles_of(session=session, function=name)})
    return functions, profiles


def _earlier_term(row_term: int | None, term: int | None) -> bool:
    return term is not None and (row_term is None or row_term < term)


def wake_in_s(activity: dict[str, FunctionActivity], now: float, interval_s: float) -> float:
    """How long the loop may sleep: the interval, or less when a workflow's expectation of a
    function ends sooner (a node loaded for a request may be released the moment it does, and
    every fraction of a second it stays is memory held for nothing)."""
    ends = [a.workflow.expected_until for a in activity.values() if a.workflow.expected(now)]
    return min([interval_s, *(end - now + 0.01 for end in ends)])


class Reconciler:
    def __init__(self, *, sessions: sessionmaker[Session], store: StateStore, directory: WorkerDirectory,
                 scheduler: Scheduler, settings: ControllerSettings | None = None, term: int | None = None) -> None:
        self.settings = settings or ControllerSettings()
        self.ctx = ControllerContext(sessions=sessions, store=store, directory=directory, term=term)
        self.actuator = Actuator(self.ctx, scheduler)
        self.functions = FunctionManager(self.ctx, self.actuator, self.settings)
        self._store = store
        self._directory = directory
        self._start_failures: dict[tuple[str, int], int] = {}
        self._owners: dict[str, str] = {}  # instance id -> worker id, as last observed
        self._kept: set[str] = set()       # silent workers kept for their answers (logged once)
        self._started_at = utcnow()
        self._heartbeats_since: float | None = time.monotonic()   # None while the state store is out
        self._activity: dict[str, FunctionActivity] = {}           # the gateways' activity, as last read
        self._workers_written: tuple | None = None                  # the live workers as last written, and when
        self._workers_written_at = 0.0
        self._pruned_at = 0.0
        self._pass_failures = FailureLog(log, "the reconcile pass")
        self._silent: dict[str, FailureLog] = {}                   # per worker: its unanswered instance lists
        self._last_seen: dict[str, tuple[int, str]] = {}           # function -> (version, status) at its last visit
        self._resynced_at = -float("inf")
        # The catalogue (function rows and profiles), re-read when a deploy, delete, status or
        # slice change is announced, when demand names a function it lacks, and at each resync,
        # not on every pass: an idle catalogue of thousands costs nothing to keep.
        self._catalogue: tuple[dict[str, FunctionRow], dict[tuple[str, int], ProfileRow]] | None = None
        self._catalogue_changes = 0   # counts full invalidations, so a read that raced one is not kept
        self._stale: set[str] = set()   # functions announced changed since the catalogue was read
        self._attention: set[str] = set()   # functions read again (or never visited) since their last visit
        self._forgotten_for: dict[str, FunctionRow] | None = None   # the catalogue forget_except last saw
        self.visits: dict[str, int] = {}                           # reconciles per function (observability, tests)
        self.quiet = False   # the last pass saw nothing happen: the next may wait the quiet interval

    # ---- the loop ----
    async def run(self) -> None:
        """Reconciles every interval, and at once when a worker, gateway or deploy signals."""
        listeners = [asyncio.create_task(self._listen(channel))
                     for channel in (Channel.INSTANCES, Channel.DEMAND, Channel.FUNCTIONS)]
        try:
            await self._retry_failed()
            while True:
                self.ctx.wake.clear()
                started = time.perf_counter()
                try:
                    await self.reconcile_once()
                    self._pass_failures.succeeded()
                except Deposed as exc:
                    log.warning("stopping: %s", exc)    # another controller leads
                    return
                except Exception as exc:  # noqa: BLE001 - the next pass tries again
                    self._pass_failures.failed(exc)
                log.debug("reconcile pass took %.1f ms", (time.perf_counter() - started) * 1000)
                now = time.time()
                sleep = pass_interval_s(quiet_now=self.quiet, interval_s=self.settings.reconcile_interval_s,
                                        quiet_interval_s=self.settings.quiet_interval_s,
                                        next_timer_in_s=min((at - now for at in self.functions.recheck_at.values()
                                                             if at > now), default=None))
                try:
                    async with asyncio.timeout(wake_in_s(self._activity, now, sleep)):
                        await self.ctx.wake.wait()
                except TimeoutError:
                    pass
        finally:
            for task in listeners:
                task.cancel()

    async def _retry_failed(self) -> None:
        """A controller that starts deploys each failed function's version once more: what failed
        it (no worker that could hold it, a device it could not load on, an unreachable store) may
        have changed since, as when ``dilu up`` starts again without a simulated GPU. One that
        fails again stays failed, with its reason, until it is deployed anew."""
        try:
            functions = await self.ctx.db(repo.list_functions)
        except Exception as exc:  # noqa: BLE001 - without the database there is nothing to retry now
            log.warning("could not read the functions to retry the failed ones: %s", exc)
            return
        for function in functions:
            if function.status != FunctionStatus.FAILED:
                continue
            await self.ctx.db(repo.forget_failed_profile, function=function.name, version=function.version)
            await self.ctx.event(function.name, "retry", f"version {function.version} failed before this controller "
                                 f"started ({function.error or 'no reason kept'}); deploying it again")
            await self.ctx.set_status(function.name, function.version, FunctionStatus.DEPLOYING)

    async def _listen(self, channel: Channel) -> None:
        async for message in follow(self._store, channel):
            named = message.get("function")
            if channel == Channel.FUNCTIONS and not isinstance(named, str):
                self._forget_catalogue()
            elif isinstance(named, str) and (channel == Channel.FUNCTIONS or (
                    channel == Channel.DEMAND and self._catalogue is not None and named not in self._catalogue[0])):
                self._stale.add(named)   # re-read alone at the next pass
            if channel == Channel.INSTANCES and message.get("state") == READY:
                self.ctx.spawn(self._route_ready(str(message.get("worker")), str(message.get("instance"))))
            self.ctx.wake.set()

    async def _route_ready(self, worker_id: str, instance_id: str) -> None:
        """Folds one instance its worker reports ready and adds it to its function's routes at
        once: left to the next pass (after the one in progress), a loaded instance stayed
        unroutable, its memory held and its requests waiting, for a tenth of a second on a busy
        host. The row and the route are written first; its event and loading sample after. The
        pass still folds everything else; what this one folded it finds done."""
        client = self._directory.client_for(worker_id, self.ctx.worker_urls.get(worker_id))
        if client is None:
            return
        try:
            status = next((s for s in await client.list_instances() if s.instance_id == instance_id), None)
        except WorkerUnavailable:
            return     # the pass catches up
        if status is None or status.state != READY or not status.endpoint:
            return
        async with self.ctx.routes_lock:
            row = await self.ctx.db(repo.get_instance, instance_id=instance_id)
            if row is None or row.state != STARTING or row.worker_id != worker_id or row.role != InstanceRole.SERVE:
                return
            updates = fold(RowView(row.id, row.state, row.created_at), status, utcnow())
            if not updates or updates["state"] != READY:
                return
            await self.ctx.db(repo.update_instance, instance_id=row.id, **updates)
            await self.ctx.route(row.function, row.id, Endpoint(row.id, status.endpoint, row.worker_id))
        await self._ready(row, status)

    async def reconcile_once(self) -> None:
        now = utcnow()
        self.quiet, acted_before = False, self.ctx.actions
        resync = time.monotonic() - self._resynced_at >= self.settings.resync_interval_s
        if resync:
            self._resynced_at = time.monotonic()
            self._forget_catalogue()
        try:
            live = await self._store.live_workers()
        except Exception:
            self._heartbeats_since = None
            raise
        if self._heartbeats_since is None:
            self._heartbeats_since = time.monotonic()
        # Written when they change, and otherwise once a second (their last-seen time): not on
        # every pass, which runs several times a second while instances start and stop.
        written = tuple(sorted(((info.id, info.host, info.url, info.device) for info in live), key=lambda w: w[0]))
        if written != self._workers_written or time.monotonic() - self._workers_written_at >= WORKERS_WRITE_EVERY_S:
            await self.ctx.db(repo.upsert_workers, workers=live, now=now)
            self._workers_written, self._workers_written_at = written, time.monotonic()
        known = await self.ctx.db(repo.list_workers)
        # A worker is lost when it has been silent for its TTL; heartbeats are only as old as this
        # controller's view of the state store (a restarted controller or Redis holds none yet).
        may_judge = time.monotonic() - self._heartbeats_since >= self.settings.worker_ttl_s
        lost = await self._lost(known, {i.id for i in live}, now) if may_judge else []
        if lost:
            log.warning("workers lost: %s", ", ".join(lost))
            await self.ctx.db(repo.mark_workers_lost, worker_ids=lost, now=now)
        self.ctx.worker_urls = {info.id: info.url for info in live}
        observed, reachable = await self._observe(live)
        async with self.ctx.routes_lock:
            snapshot = await self._snapshot()
            await self._fold_observations(snapshot, observed, reachable, now)
            await self._stop_orphans(snapshot, observed, live)
            snapshot = await self._snapshot()
            # Instances that became ready take traffic now, not once this pass has decided for
            # every function and made the worker calls that asks for (on a busy host, a tenth of
            # a second in which a loaded instance holds its memory and its requests wait).
            await self._publish_routes(snapshot)
        activity = self._activity = await self._store.function_activity()
        telemetry = await self._store.telemetry()
        if snapshot.by_name is not self._forgotten_for:   # the catalogue changed: drop what left it
            self.functions.forget_except({(f.name, f.version) for f in snapshot.functions})
            self._forgotten_for = snapshot.by_name
        due = self._due(snapshot, activity, resync)
        # A deployment in progress (profiling, starting) is read afresh each pass, as it moves.
        self._stale.update(f.name for f in due if f.status not in SETTLED_STATUSES)
        history = await self.ctx.db(repo.instances_of, functions=[f.name for f in due]) if due else {}
        for function in due:
            rows = history.get(function.name, [])
            self.visits[function.name] = self.visits.get(function.name, 0) + 1
            self._last_seen[function.name] = (function.version, function.status)
            try:
                await self.functions.reconcile(function, rows, snapshot.profiles.get((function.name, function.version)),
                                               activity.get(function.name, FunctionActivity()), live, telemetry)
            except Deposed:
                raise
            except Exception:
                log.exception("reconciling %s failed", function.name)
        async with self.ctx.routes_lock:
            snapshot = await self._snapshot()
            await self._publish_routes(snapshot)
        settling = bool(self.ctx.background) or any(row.state != READY for row in snapshot.instances) or any(
            f.status not in SETTLED_STATUSES for f in due)
        self.quiet = quiet(activity, time.time(), acted=self.ctx.actions != acted_before or lost != [],
                            settling=settling)
        if time.monotonic() - self._pruned_at >= PRUNE_EVERY_S:    # it reads every ended row
            await self.ctx.db(repo.prune_instances, keep_ended=KEEP_ENDED_INSTANCES)
            self._pruned_at = time.monotonic()

    def _due(self, snapshot: _Snapshot, activity: dict[str, FunctionActivity], resync: bool) -> list[FunctionRow]:
        """The functions this pass reconciles: all of them at a resync, else those where
        something may be decided (``dilu.policy.visits``)."""
        if resync:
            self._last_seen = {}
            return list(snapshot.functions)
        counts: dict[str, int] = {}
        for row in snapshot.instances:
            counts[row.function] = counts.get(row.function, 0) + 1
        now = time.time()
        # Only candidates are weighed (sized by the work, not the catalogue): functions read
        # again or never visited, those with instances or activity, and those whose timer is due.
        recheck_at = self.functions.recheck_at
        candidates = self._attention | set(counts) | set(activity) | {n for n, at in recheck_at.items() if at <= now}
        due = []
        for name in sorted(candidates):
            f = snapshot.by_name.get(name)
            if f is None:
                self._attention.discard(name)
                continue
            minimum = int((f.spec.get("scaling") or {}).get("min_instances", 0))
            if needs_visit(FunctionFacts(f.name, f.version, f.status, minimum, counts.get(name, 0)),
                           activity.get(name), self._last_seen.get(name), now, recheck_at.get(name)):
                due.append(f)
            if f.status in SETTLED_STATUSES and minimum == 0:
                self._attention.discard(name)   # visited now if it needed it; its next change re-adds it
        return due

    async def _snapshot(self) -> _Snapshot:
        # The functions to read again are taken here, on the loop, where they are added.
        stale = self._stale | self.ctx.changed
        self._stale, self.ctx.changed = set(), set()
        return await asyncio.to_thread(self._read_snapshot, stale)

    def _read_snapshot(self, stale: set[str]) -> _Snapshot:
        """Every function and profile (the cached catalogue), and the instances that are active
        or stopping (the ones a pass folds, routes and counts); ended instances are read only
        for the functions a pass reconciles."""
        changes, catalogue = self._catalogue_changes, self._catalogue
        with self.ctx.sessions() as session:
            if catalogue is None:
                catalogue = ({row.name: row for row in repo.list_functions(session=session)},
                             {(p.function, p.version): p for p in repo.list_profiles(session=session)})
                self._attention = set(catalogue[0])
            elif stale:
                catalogue = _patched(session, catalogue, stale)
                self._attention |= stale
            snapshot = _Snapshot(list(catalogue[0].values()), repo.list_instances(session=session, active_only=True),
                                 catalogue[1], catalogue[0])
        if changes == self._catalogue_changes:
            self._catalogue = catalogue
        return snapshot

    def _forget_catalogue(self) -> None:
        self._catalogue = None
        self._catalogue_changes += 1

    async def _lost(self, known: Sequence[WorkerRow], live: set[str], now: datetime) -> list[str]:
        """The silent workers to mark lost (``dilu.policy.worker_loss``): asked, with their
        instances, only once they are past their TTL."""
        silent = {w.id: (now - w.last_seen).total_seconds() for w in known if w.state == "alive" and w.id not in live}
        due = [w for w in known if silent.get(w.id, 0.0) >= self.settings.worker_ttl_s and w.id not in
               self._directory.local]
        answering: set[str] = set()
        if due:
            rows = await self.ctx.db(repo.list_instances, active_only=True)
            probes = {w.id: ([w.url.rstrip("/") + "/healthz"] if w.url else []) +
                      [r.endpoint + "/health" for r in rows if r.worker_id == w.id and r.endpoint] for w in due}
            answering = await evidence.answering(self._directory.http, probes, QUICK_CALL_S)
            for worker in sorted(answering - self._kept):
                log.warning("worker %s is silent for %.0f s but it or its instances answer: kept (lost after "
                            "%g s of silence)", worker, silent[worker], self.settings.worker_lost_after_s)
        self._kept = {worker for worker in self._kept | answering if worker in silent}    # said once per silence
        return lost_workers(silent, self.settings.worker_ttl_s, self.settings.worker_lost_after_s, answering,
                            self._directory.local)

    async def _observe(self, live: Sequence[WorkerInfo]) -> tuple[dict[str, InstanceStatus], set[str]]:
        """Every live worker's instances, asked in parallel, each within ``QUICK_CALL_S``: a
        worker that does not answer (hung, overloaded) holds up neither the pass nor the others;
        its instances keep their states until it answers or its heartbeat expires."""
        async def one(info: WorkerInfo) -> tuple[str, list[InstanceStatus] | None]:
            client = self._directory.client_for(info.id, info.url)
            if client is None:
                return info.id, None
            failures = self._silent.setdefault(info.id, FailureLog(log, f"listing the instances of {info.id}"))
            try:
                async with asyncio.timeout(QUICK_CALL_S):
                    statuses = await client.list_instances()   # in-process ones too
            except (WorkerUnavailable, TimeoutError) as exc:
                failures.failed(exc)
                return info.id, None
            failures.succeeded()
            return info.id, statuses

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
                                 reachable: set[str], now: datetime) -> None:
        for row in snapshot.instances:
            if row.state not in ACTIVE_STATES | {STOPPING} or row.worker_id not in reachable:
                continue
            status = observed.get(row.id)
            if status is None and row.state == STARTING and _earlier_term(row.term, self.ctx.term):
                await self._abandoned(row, now)
                continue
            grace = UNKNOWN_GRACE_S if row.created_at >= self._started_at else 0.0
            updates = fold(RowView(row.id, row.state, row.created_at), status, now, grace)
            if updates:
                await self._apply(row, status, updates)

    async def _abandoned(self, row: InstanceRow, now: datetime) -> None:
        """A start an earlier leader placed that its worker never received (the leader stopped
        between the two): ended without counting as the function's failure, so the function
        manager places it again."""
        await self.ctx.db(repo.update_instance, instance_id=row.id, state=STOPPED, ended_at=now,
                          error=f"never started: the controller of term {row.term} placed it and stopped "
                                "before its worker confirmed the start")
        await self.ctx.event(row.function, "start-abandoned", f"instance {row.id} was placed by the controller "
                             f"of term {row.term}, which stopped before its worker started it", row.id)

    async def _apply(self, row: InstanceRow, status: InstanceStatus | None, updates: dict) -> None:
        """Writes a row's folded updates and what follows from them (events, loading samples)."""
        await self.ctx.db(repo.update_instance, instance_id=row.id, **updates)
        if row.role != InstanceRole.SERVE:
            return  # the profiling job watches its own instance
        if updates["state"] == FAILED:
            was_ready = bool(status and status.was_ready) or row.state == READY
            await self._instance_failed(row, updates.get("error") or "failed", was_ready)
        elif updates["state"] == READY:
            await self._ready(row, status)

    async def _ready(self, row: InstanceRow, status: InstanceStatus | None) -> None:
        self._start_failures.pop((row.function, row.function_version), None)
        await self.ctx.event(row.function, "ready", f"instance {row.id} is ready", row.id)
        if status is not None and status.startup:
            await self.ctx.db(repo.record_loading, function=row.function, version=row.function_version,
                              sample=status.startup)

    async def _instance_failed(self, row: InstanceRow, error: str, was_ready: bool) -> None:
        if was_ready:
            await self.ctx.event(row.function, "crashed", f"instance {row.id} ended: {error}", row.id)
            return
        key = (row.function, row.function_version)
        self._start_failures[key] = self._start_failures.get(key, 0) + 1
        function = await self.ctx.db(repo.get_function, name=row.function)
        if function is None or function.version != row.function_version:
            return
        # A deployment that cannot load fails at once; a running function that can no longer
        # start instances fails after a few tries instead of restarting forever.
        if function.status == FunctionStatus.DEPLOYING or self._start_failures[key] >= MAX_START_FAILURES:
            await self.ctx.event(row.function, "failed", error, row.id)
            await self.ctx.set_status(row.function, row.function_version, FunctionStatus.FAILED, error)
        else:
            await self.ctx.event(row.function, "start-failed", error, row.id)

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
                    self.ctx.spawn(client.stop_instance(instance_id))

    async def _publish_routes(self, snapshot: _Snapshot) -> None:
        """Writes the routes that differ from what the state store holds (compared with the store
        itself, not a memory of what was written: a restarted Redis gets the whole table back)."""
        routes: dict[str, list[Endpoint]] = {}
        for row in snapshot.instances:
            if row.state == READY and row.endpoint and row.role == InstanceRole.SERVE:
                routes.setdefault(row.function, []).append(Endpoint(row.id, row.endpoint, row.worker_id))
        stored = {name: sorted(eps, key=lambda e: e.instance_id) for name,
                  eps in (await self._store.get_routes()).items()}
        for name in set(routes) | set(stored):
            endpoints = sorted(routes.get(name, []), key=lambda e: e.instance_id)
            if endpoints != stored.get(name):
                await self._store.set_routes(name, endpoints, term=self.ctx.term)
                await self._store.publish(Channel.ROUTES, {"function": name})

    async def shutdown(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Lets the worker calls in flight finish for up to ``grace_s``, then cancels the rest: a
        controller asked to stop must not wait on a slow worker (its stops are idempotent and the
        next controller folds what the workers report)."""
        self.functions.profiling.cancel_all()
        pending = set(self.ctx.background)
        if pending:
            _, late = await asyncio.wait(pending, timeout=grace_s)
            for task in late:
                task.cancel()
            if late:
                await asyncio.gather(*late, return_exceptions=True)
