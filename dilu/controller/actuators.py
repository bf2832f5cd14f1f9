"""Carrying decisions out: start (placed by the scheduler), stop and resize instances."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence

from sqlalchemy.orm import Session

from dilu.controller.context import ControllerContext
from dilu.db import repo
from dilu.db.models import FunctionRow, InstanceRow, utcnow
from dilu.messages import FAILED, STARTING, STOPPING, FunctionStatus, InstanceRole, StartInstance, WorkerInfo
from dilu.policy.scheduler import PlacementRequest, Scheduler
from dilu.slices import ComputeSlice, Slice
from dilu.snapshot import build_snapshot, check_resize
from dilu.worker_client import WorkerClient, WorkerUnavailable

log = logging.getLogger(__name__)


class Actuator:
    def __init__(self, ctx: ControllerContext, scheduler: Scheduler) -> None:
        self.ctx = ctx
        self.scheduler = scheduler
        self._last_unschedulable: dict[str, str] = {}
        self._last_refused: dict[str, str] = {}

    async def start(self, function: FunctionRow, chosen: Slice, live: Sequence[WorkerInfo], reason: str, *,
                    role: InstanceRole = InstanceRole.SERVE,
                    wait_ms: float | None = None,
                    in_background: bool = False) -> InstanceRow | None:
        """Places and starts one instance; None (with an event) when nothing fits or the worker fails.
        ``in_background``: the row is placed now, the worker's start order goes out in a task (a
        worker that fails it fails the row there), so a pass that starts several instances does
        not wait on each worker call in turn before it publishes routes and acts on the rest."""
        typed = function.typed_spec
        request = PlacementRequest(function.name, typed.resources.memory, chosen.compute.request, chosen.compute.limit,
                                   typed.function_class, typed.resources.gpu)
        rows, functions = await self.ctx.db(_rows_and_functions)
        decision = self.scheduler.place(request, build_snapshot(live, rows, functions))
        if not decision.ok:
            message = f"cannot place an instance: {decision.reason}"
            if self._last_unschedulable.get(function.name) != message:
                self._last_unschedulable[function.name] = message
                await self.ctx.event(function.name, "unschedulable", message)
            await self._fail_if_never_placeable(function, request, live, functions)
            return None
        self._last_unschedulable.pop(function.name, None)
        info = next(w for w in live if w.id == decision.devices[0])
        client = self.ctx.directory.client_for(info.id, info.url)
        # The spec's bound caps every batch; the chosen (profiled) batch is what a batch waits for.
        batching = {"max_batch_size": typed.batching.max_batch_size, "preferred_batch_size": chosen.batch,
                    "max_wait_ms": typed.batching.max_wait_ms if wait_ms is None else wait_ms}
        spec = {**function.spec, "batching": batching}  # the wire form of the spec, as this instance runs it
        instance_id = f"{function.name}-{uuid.uuid4().hex[:10]}"
        row = InstanceRow(id=instance_id, function=function.name, function_version=function.version,
                          worker_id=info.id, state=STARTING, memory_bytes=request.memory_bytes,
                          sm_request=chosen.compute.request, sm_limit=chosen.compute.limit, created_at=utcnow(),
                          role=role, term=self.ctx.term)
        await self.ctx.db(repo.create_instance, row=row)
        action = "scale-up" if role == InstanceRole.SERVE else "profile"
        await self.ctx.event(function.name, action, f"{reason}; {decision.reason} on {info.id}", instance_id)
        order = StartInstance(instance_id=instance_id, function=function.name, version=function.version,
                              spec=spec, source_dir=function.source_dir, memory_bytes=request.memory_bytes,
                              compute=chosen.compute, bundle=function.bundle)
        if in_background:
            self.ctx.spawn(self._order_start(client, order, row))
            return row
        return await self._order_start(client, order, row)

    async def _order_start(self, client: WorkerClient, order: StartInstance, row: InstanceRow) -> InstanceRow | None:
        try:
            status = await client.start_instance(order)
        except WorkerUnavailable as exc:
            await self.ctx.db(repo.update_instance, instance_id=row.id, state=FAILED, error=str(exc),
                              ended_at=utcnow())
            return None
        if status.endpoint:
            await self.ctx.db(repo.update_instance, instance_id=row.id, endpoint=status.endpoint)
            row.endpoint = status.endpoint
        return row

    async def _fail_if_never_placeable(self, function: FunctionRow, request: PlacementRequest,
                                       live: Sequence[WorkerInfo], functions: Sequence[FunctionRow]) -> None:
        """A new version that would not fit even on empty workers (too much memory, a GPU where
        there is none) fails at once with the reason, instead of waiting for ever; its invokes
        are then answered 503 straight away. Without any live worker it waits for one."""
        if not live or function.status != FunctionStatus.DEPLOYING:
            return
        alone = self.scheduler.place(request, build_snapshot(live, [], functions))
        if alone.ok:
            return
        reason = f"no worker can ever hold an instance: {alone.reason}"
        await self.ctx.event(function.name, "failed", reason)
        await self.ctx.set_status(function.name, function.version, FunctionStatus.FAILED, reason)

    async def stop(self, row: InstanceRow, reason: str) -> None:
        """Marks the instance stopping, takes it out of the published routes (so the gateway
        stops sending it requests first), then tells its worker at once: not at the end of the
        pass, for every fraction of a second until then the instance holds its memory idle."""
        await self.ctx.db(repo.update_instance, instance_id=row.id, state=STOPPING)
        if row.role == InstanceRole.SERVE:
            async with self.ctx.routes_lock:     # marked stopping first: no later publication puts it back
                await self.ctx.route(row.function, row.id, None)
        client = self.ctx.directory.client_for(row.worker_id, self.ctx.worker_urls.get(row.worker_id))
        if client is not None:
            self.ctx.spawn(client.stop_instance(row.id))
        if row.role == InstanceRole.SERVE:
            await self.ctx.event(row.function, "scale-down", f"{reason}; stopping {row.id}", row.id)

    async def resize(self, function: FunctionRow, rows: list[InstanceRow], chosen: Slice,
                     live: Sequence[WorkerInfo]) -> None:
        """Pushes a changed slice to running instances in place (vertical scaling, no restart), if
        it passes the same admission as a placement; a refusal is an event, once per slice."""
        changing = [r for r in rows if ComputeSlice(r.sm_request or 0.0, r.sm_limit or 0.0) != chosen.compute]
        if not changing:
            return
        instances, functions = await self.ctx.db(_rows_and_functions)
        verdict = check_resize(self.scheduler, live, instances, functions, function, chosen.compute)
        if not verdict.ok:
            message = (f"resize to request {chosen.compute.request:g}, limit {chosen.compute.limit:g} refused: "
                       f"{verdict.reason}")
            if self._last_refused.get(function.name) != message:
                self._last_refused[function.name] = message
                await self.ctx.event(function.name, "resize-refused", message)
            return
        self._last_refused.pop(function.name, None)
        urls = {info.id: info.url for info in live}
        for row in rows:
            if ComputeSlice(row.sm_request or 0.0, row.sm_limit or 0.0) == chosen.compute or row.worker_id not in urls:
                continue
            client = self.ctx.directory.client_for(row.worker_id, urls[row.worker_id])
            try:
                applied = client is not None and await client.set_slice(row.id, chosen.compute)
            except WorkerUnavailable as exc:
                log.warning("resizing %s failed: %s", row.id, exc)
                continue
            if applied:
                await self.ctx.db(repo.update_instance, instance_id=row.id, sm_request=chosen.compute.request,
                                  sm_limit=chosen.compute.limit)
                await self.ctx.event(function.name, "resize", f"{row.id} slice -> request "
                                     f"{chosen.compute.request:g}, limit {chosen.compute.limit:g}", row.id)


def _rows_and_functions(*, session: Session) -> tuple[list[InstanceRow], list[FunctionRow]]:
    """The active instances and the functions they belong to (placement needs their classes;
    an idle catalogue is not read)."""
    rows = repo.list_instances(session=session, active_only=True)
    return rows, repo.functions_named(session=session, names={row.function for row in rows})
