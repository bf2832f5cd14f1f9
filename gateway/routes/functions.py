"""Function CRUD, instances, logs and scaling events."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request, Response
from sqlalchemy.orm import Session

from dilu.artifacts import ArtifactStore
from dilu.bundles import has_module, is_digest, read_code_file
from dilu.config import path_roots
from dilu.db import repo
from dilu.db.models import FunctionRow, InstanceRow, WorkerRow
from dilu.messages import READY, STARTING, InstanceRole
from dilu.snapshot import check_resize
from dilu.source import check_handler_source, streaming_refusal
from dilu.spec import ClusterDefaults, FunctionSpec, SpecError, make_spec, spec_from_dict, spec_to_dict
from dilu.state.base import Channel
from gateway.auth import is_admin
from gateway.deps import ServicesDep, SessionDep
from gateway.docs import AUTH_ERRORS, SECURED, errors
from gateway.needs import Control
from gateway.paging import MAX_PAGE, NEXT_PAGE_DOC, link_next, one_page
from gateway.routing import RoutingTable
from gateway.schemas import DeployRequest, EventPublic, FunctionPublic, InstancePublic, SliceUpdate

router = APIRouter(prefix="/v1/functions", tags=["functions"], dependencies=SECURED, responses=AUTH_ERRORS)


def to_public(row: FunctionRow, session: Session, base_url: str, routing: RoutingTable | None = None,
              streams: dict[str, Any] | None = None, details: repo.FunctionDetails | None = None) -> FunctionPublic:
    """The function as the API shows it; ``details`` read for a whole page at once (else here)."""
    details = details or repo.details_of(session=session, functions=[row])
    instances = [i for i in details.instances.get(row.name, []) if i.role == InstanceRole.SERVE]
    profile = details.profiles.get((row.name, row.version))
    return FunctionPublic(
        profile=None if profile is None else {
            "status": profile.status, "kind": profile.kind, "sm_request": profile.sm_request,
            "sm_limit": profile.sm_limit, "batch": profile.batch, "throughput_per_s": profile.throughput_per_s,
            "latency_ms": None if profile.latency_s is None else round(profile.latency_s * 1000, 3),
            "meets_slo": profile.meets_slo, "trials": profile.trials, "error": profile.error,
            "batch_note": profile.batch_note},
        loading=details.loading.get((row.name, row.version)),
        queued_requests=routing.queued(row.name) if routing else 0,
        in_flight_requests=routing.in_flight(row.name) if routing else 0,
        name=row.name, version=row.version, status=row.status, error=row.error,
        ready_instances=sum(1 for i in instances if i.state == READY),
        starting_instances=sum(1 for i in instances if i.state == STARTING),
        requests_total=row.requests_total, invoke_url=f"{base_url}/v1/functions/{row.name}/invoke", streams=streams,
        spec=row.spec, source_dir=row.source_dir, bundle=row.bundle, created_at=row.created_at,
        updated_at=row.updated_at)


def _base_url(request: Request) -> str:
    return str(request.base_url).rstrip("/")


def _existing(session: Session, name: str) -> FunctionRow:
    row = repo.get_function(session=session, name=name)
    if row is None:
        raise HTTPException(404, f"function {name!r} not found")
    return row


def _without_key(endpoint: str | None) -> str | None:
    """``http://host:port`` of an instance endpoint, without its secret path."""
    if not endpoint:
        return endpoint
    scheme, _, rest = endpoint.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"


def check_code(body: DeployRequest, spec: FunctionSpec, services: Control) -> None:
    """Exactly one place the code comes from, and the handler's module (and any labels file) is in
    it (SpecError if not)."""
    given = [what for what in ("bundle", "source_dir") if getattr(body, what)] + (["image"] if spec.image else [])
    if len(given) != 1:
        raise SpecError([f"code: give exactly one of bundle (dilu deploy uploads one), source_dir or the "
                         f"spec's image; got {', '.join(given) or 'none'}"])
    data: bytes | None = None
    if body.source_dir:
        roots = path_roots(services.settings.local_roots)
        if not roots:
            raise SpecError(["source_dir: deploying by local path is off on this gateway: upload the code as a "
                             "bundle (dilu deploy does)"])
        folder = Path(body.source_dir).resolve()
        if not any(folder == root or folder.is_relative_to(root) for root in roots):
            raise SpecError([f"source_dir: {body.source_dir!r} is outside the folders local deploys may use "
                             f"(DILU_LOCAL_ROOTS: {', '.join(str(r) for r in roots)})"])
        check_handler_source(body.source_dir, spec.handler)
    elif body.bundle:
        with services.sessions() as session:
            data = repo.get_bundle_data(session=session, digest=body.bundle) if is_digest(body.bundle) else None
        if data is None:
            raise SpecError([f"bundle: {body.bundle!r} is not uploaded (POST /v1/bundles first)"])
        if not has_module(data, spec.handler):
            module = spec.handler.split(":", 1)[0]
            raise SpecError([f"handler: module {module!r} not found in the bundle"])
    check_labels(spec, body.source_dir or "", data)
    if spec.generates == "text" and not spec.image:
        check_streams(spec, body.source_dir or "", data)


def check_streams(spec: FunctionSpec, source_dir: str, bundle: bytes | None) -> None:
    """A text generator's handler class can stream (SpecError naming what it lacks if not)."""
    base = spec.handler.split(":", 1)[0].replace(".", "/")
    for name in (f"{base}.py", f"{base}/__init__.py"):
        try:
            source = read_code_file(source_dir, bundle, name).decode("utf-8", "replace")
        except KeyError:
            continue
        why = streaming_refusal(source, spec.handler)
        if why is not None:
            raise SpecError([why])
        return


def check_labels(spec: FunctionSpec, source_dir: str, bundle: bytes | None) -> None:
    """Each output's labels file is in the function's code (SpecError naming it if not)."""
    for output in spec.outputs:
        if output.labels is None:
            continue
        if spec.image:
            raise SpecError([f"outputs: {output.name}: labels: a function run from an image has no folder here "
                             "to read the labels file from"])
        try:
            read_code_file(source_dir, bundle, output.labels)
        except KeyError:
            raise SpecError([f"outputs: {output.name}: labels: no file {output.labels!r} (at most 10 MiB) in the "
                             "function's folder"]) from None


def check_weights(spec: FunctionSpec, services: Control) -> None:
    """The spec's weights artifact is in the store (SpecError naming it if not)."""
    if spec.weights and not ArtifactStore(services.settings.effective_artifact_store).has(spec.weights):
        raise SpecError([f"weights: artifact {spec.weights} is not stored: upload it first with "
                         f"PUT /v1/artifacts/{spec.weights} (dilu deploy does)"])


@router.post("", response_model=FunctionPublic, status_code=201,
             responses={200: {"description": "An existing function was updated", "model": FunctionPublic},
                        **errors(400, 413, 422)})
async def deploy(body: DeployRequest, request: Request, response: Response, services: ServicesDep) -> FunctionPublic:
    """Validates the spec and creates the function, or rolls out a new version of it."""
    defaults = ClusterDefaults()
    try:
        if body.yaml is not None:
            spec = make_spec(body.yaml, defaults)
        elif body.spec is not None:
            spec = spec_from_dict(body.spec, defaults)
        else:
            raise SpecError(["body: give the spec as 'yaml' (text) or 'spec' (object)"])
        await asyncio.to_thread(check_code, body, spec, services)
        await asyncio.to_thread(check_weights, spec, services)
    except SpecError as exc:
        raise HTTPException(422, f"invalid spec: {exc}") from None

    def write() -> tuple[FunctionPublic, bool]:
        with services.sessions() as session:
            row, created = repo.upsert_function(session=session, spec=spec_to_dict(spec),
                                                source_dir=body.source_dir or "", bundle=body.bundle)
            return to_public(row, session, _base_url(request)), created

    public, created = await asyncio.to_thread(write)
    await services.functions.refresh(spec.name)
    await services.notify(Channel.FUNCTIONS, {"function": spec.name})
    if not created:
        response.status_code = 200
    return public


@router.get("", response_model=list[FunctionPublic], responses={
    200: {"description": f"Functions by name. {NEXT_PAGE_DOC}"}, **errors(422)})
def list_functions(request: Request, response: Response, session: SessionDep, services: ServicesDep,
                   limit: int | None = Query(None, ge=1, le=MAX_PAGE, description="Functions per page (all when "
                                                                                  "unset)"),
                   cursor: str | None = Query(None, max_length=128, pattern=r"^[a-z0-9_-]+$",
                                              description="x-next-cursor of the previous page")
                   ) -> list[FunctionPublic]:
    """Every function, or with ``limit`` one page of them: a function that exists from the first
    page to the last is on exactly one page, whatever is deployed or deleted meanwhile."""
    rows = one_page(repo.functions_page(session=session, after=cursor, limit=limit + 1 if limit else None),
                    limit, request, response, lambda row: row.name)
    details = repo.details_of(session=session, functions=rows)
    base = _base_url(request)
    return [to_public(row, session, base, services.routing, details=details) for row in rows]


@router.get("/{name}", response_model=FunctionPublic, responses=errors(404, 422))
def get_function(name: str, request: Request, session: SessionDep, services: ServicesDep) -> FunctionPublic:
    return to_public(_existing(session, name), session, _base_url(request), services.routing,
                     services.stream_times.summary(name, time.time()))


@router.delete("/{name}", status_code=200, responses=errors(404, 422))
async def delete_function(name: str, services: ServicesDep) -> dict[str, str]:
    def remove() -> bool:
        with services.sessions() as session:
            return repo.delete_function(session=session, name=name)

    if not await asyncio.to_thread(remove):
        raise HTTPException(404, f"function {name!r} not found")
    await services.functions.refresh(name)
    await services.notify(Channel.FUNCTIONS, {"function": name})
    return {"deleted": name}


INSTANCE_CURSOR = r"^[0-9]{1,17}\.[A-Za-z0-9._-]{1,64}$"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)


def _instance_cursor(row: InstanceRow) -> str:
    """Where a page of instances ended: its last one's creation (whole microseconds, exact) and id."""
    return f"{(row.created_at - EPOCH) // MICROSECOND}.{row.id}"


def _after_instance(cursor: str | None) -> tuple[datetime, str] | None:
    if cursor is None:
        return None
    micros, _, instance_id = cursor.partition(".")     # 17 digits at most: within the years a datetime holds
    return EPOCH + int(micros) * MICROSECOND, instance_id


@router.get("/{name}/instances", response_model=list[InstancePublic], responses={
    200: {"description": f"Instances, oldest first. {NEXT_PAGE_DOC}"}, **errors(404, 422)})
async def list_instances(name: str, services: ServicesDep, request: Request, response: Response,
                         all: bool = Query(False, description="Include ended instances"),
                         limit: int | None = Query(None, ge=1, le=MAX_PAGE, description="Instances per page (all "
                                                                                        "when unset)"),
                         cursor: str | None = Query(None, max_length=96, pattern=INSTANCE_CURSOR,
                                                    description="x-next-cursor of the previous page")
                         ) -> list[InstancePublic]:
    after = _after_instance(cursor)

    def read() -> list[InstanceRow]:
        with services.sessions() as session:
            _existing(session, name)
            return repo.instances_page(session=session, function=name, active_only=not all, after=after,
                                       limit=limit + 1 if limit else None)

    rows = one_page(await asyncio.to_thread(read), limit, request, response, _instance_cursor)
    admin = is_admin(request.scope)   # an instance's full endpoint is a capability: admins only
    try:
        telemetry = await services.store.telemetry()
    except Exception:  # noqa: BLE001 - telemetry is best effort; the instances are in the database
        telemetry = {}
    return [InstancePublic(id=r.id, worker_id=r.worker_id, version=r.function_version, state=r.state,
                           endpoint=r.endpoint if admin else _without_key(r.endpoint), error=r.error,
                           created_at=r.created_at, ready_at=r.ready_at,
                           ended_at=r.ended_at, sm_request=r.sm_request, sm_limit=r.sm_limit, role=r.role,
                           telemetry=telemetry.get(r.id)) for r in rows]


@router.patch("/{name}/slice", response_model=FunctionPublic, responses=errors(400, 404, 409, 413, 422, 503))
async def set_slice(name: str, body: SliceUpdate, request: Request, services: ServicesDep) -> FunctionPublic:
    """Vertical scaling: pins a new compute slice; running instances are resized in place.

    The resize passes the same admission as a placement: if any running instance would not fit
    on its GPU at the new slice, nothing changes and the answer is 409 naming the GPU and the
    shortfall (instances are not moved; scale the function out or shrink a neighbour instead).
    """
    try:
        live = await services.store.live_workers()
    except Exception:  # noqa: BLE001 - any store failure: 503, the resize waits for it
        raise HTTPException(503, "the state store is unavailable: resizes wait for it (retry shortly)") from None

    def write() -> FunctionPublic:
        with services.sessions() as session:
            function = repo.get_function(session=session, name=name)
            if function is None:
                raise HTTPException(404, f"function {name!r} not found")
            verdict = check_resize(services.scheduler, live, repo.list_instances(session=session, active_only=True),
                                   repo.list_functions(session=session), function, body.compute)
            if not verdict.ok:
                raise HTTPException(409, f"the slice does not fit where {name!r} runs: {verdict.reason}")
            row = repo.set_function_slice(session=session, name=name, sm_request=body.compute.request,
                                          sm_limit=body.compute.limit)
            if row is None:
                raise HTTPException(404, f"function {name!r} not found")
            return to_public(row, session, _base_url(request), services.routing)

    public = await asyncio.to_thread(write)
    await services.notify(Channel.FUNCTIONS, {"function": name})
    return public


@router.get("/{name}/events", response_model=list[EventPublic], responses={
    200: {"description": "The newest ``limit`` events (or with ``cursor``, those before it), oldest first; when "
                         "older ones remain, ``x-next-cursor`` (and a ``Link`` with ``rel=\"next\"``) gives "
                         "the ``cursor`` of the page before"}, **errors(404, 422)})
def list_events(name: str, request: Request, response: Response, session: SessionDep,
                limit: int = Query(100, ge=1, le=10_000),
                cursor: int | None = Query(None, ge=1, le=2**31 - 1, description="x-next-cursor of the later page")
                ) -> list[EventPublic]:
    _existing(session, name)
    rows = repo.list_events(session=session, function=name, limit=limit + 1, before=cursor)
    if len(rows) > limit:    # newest first from the database: the extra one is the oldest
        rows = rows[1:]
        link_next(request, response, str(rows[0].id))
    return [EventPublic(at=e.at, function=e.function, action=e.action, reason=e.reason, instance_id=e.instance_id)
            for e in rows]


@router.get("/{name}/logs", responses=errors(404, 422))
async def get_logs(name: str, services: ServicesDep, tail: int = Query(200, ge=1, le=100_000),
                   instances: int = Query(3, ge=1, le=50)) -> dict:
    """The log tails of the newest instances (ended ones included, so load errors stay visible)."""

    def read_rows() -> tuple[list[InstanceRow], dict[str, WorkerRow]]:
        with services.sessions() as session:
            _existing(session, name)
            rows = repo.list_instances(session=session, function=name)[-instances:]
            workers = {w.id: w for w in repo.list_workers(session=session)}
            return rows, workers

    rows, workers = await asyncio.to_thread(read_rows)
    result = []
    for row in rows:
        worker = workers.get(row.worker_id)
        client = services.directory.client_for(row.worker_id, worker.url if worker else None)
        try:
            text = await client.read_logs(row.id, tail) if client else ""
        except Exception as exc:  # noqa: BLE001 - a lost worker must not hide the other instances' logs
            text = f"(logs unavailable: {exc})"
        result.append({"instance": row.id, "state": row.state, "error": row.error, "log": text})
    return {"function": name, "instances": result}
