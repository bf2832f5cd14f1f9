"""The dashboard: a static page (open: it holds no data) and the one document it polls
(``GET /v1/dashboard``, the ``read`` scope), assembled by ``gateway.dashboard.view``."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import Response

from dilu.db import repo
from dilu.db.models import FunctionRow, InstanceRow, ProfileRow, ScalingEventRow, WorkerRow
from dilu.spec import NAME_FRAGMENT_PATTERN
from gateway.dashboard.view import build, is_live, shown_functions
from gateway.deps import ServicesDep
from gateway.docs import AUTH_ERRORS, SECURED, errors
from gateway.paging import MAX_PAGE

STATIC = Path(__file__).resolve().parent.parent / "dashboard" / "static"
ASSETS = {"dashboard.js": "text/javascript; charset=utf-8", "dashboard.css": "text/css; charset=utf-8"}
# The page loads nothing but its own script and style, and may not be framed: whatever text the
# data holds (logs, errors) can never run as script there.
PAGE_HEADERS = {"content-security-policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
                "x-frame-options": "DENY", "x-content-type-options": "nosniff", "cache-control": "no-cache"}

DEFAULT_SHOWN = 100   # functions the page lists unless it asks for more

router = APIRouter(tags=["dashboard"])


@router.get("/dashboard", response_class=Response, responses={
    200: {"description": "The dashboard page (it asks for an API key when the platform needs one)",
          "content": {"text/html": {"schema": {"type": "string"}}}}})
def page() -> Response:
    return Response((STATIC / "index.html").read_bytes(), media_type="text/html; charset=utf-8",
                    headers=PAGE_HEADERS)


@router.get("/dashboard/{asset}", response_class=Response, responses={
    200: {"description": "The page's script or style sheet",
          "content": {"text/javascript": {"schema": {"type": "string"}}, "text/css": {"schema": {"type": "string"}}}},
    **errors(404)})
def asset(asset: str) -> Response:
    media_type = ASSETS.get(asset)
    if media_type is None:
        raise HTTPException(404, f"no dashboard file {asset!r}")
    return Response((STATIC / asset).read_bytes(), media_type=media_type, headers=PAGE_HEADERS)


@router.get("/v1/dashboard", dependencies=SECURED, responses={
    200: {"description": "Functions (status, instances, request rate, p99, profile; at most ``limit``: those with "
                         "instances or requests first, then those not ready, then the rest by name, of "
                         "``functions_total``), devices (instances, memory slices, granted and used compute "
                         "shares now and over time) and recent scaling decisions",
          "content": {"application/json": {"schema": {"type": "object"}}}},
    **AUTH_ERRORS, **errors(422)})
async def dashboard(services: ServicesDep,
                    limit: int = Query(DEFAULT_SHOWN, ge=1, le=MAX_PAGE, description="Functions listed at most"),
                    match: str = Query("", max_length=63, pattern=NAME_FRAGMENT_PATTERN,
                                       description="Only functions whose name holds this")) -> dict[str, Any]:
    try:   # counters and telemetry are best effort: the rest comes from the database
        activity = await services.store.function_activity()
        telemetry = await services.store.telemetry()
    except Exception:  # noqa: BLE001 - the store is down: the page shows the database alone
        activity, telemetry = {}, {}
    now = time.time()

    def read() -> tuple[list[WorkerRow], list[FunctionRow], int, list[InstanceRow], dict[str, ProfileRow | None],
                        list[ScalingEventRow]]:
        # Sized by what is shown, not by the catalogue: the busy functions, the first unsettled
        # ones and the first by name, each read with a limit.
        with services.sessions() as session:
            instances = repo.list_instances(session=session, active_only=True)
            live = {i.function for i in instances} | {name for name, seen in activity.items() if is_live(seen, now)}
            candidates = {row.name: row for row in [
                *repo.functions_named(session=session, names={n for n in live if match in n}),
                *repo.unsettled_functions(session=session, limit=limit, containing=match),
                *repo.functions_page(session=session, after=None, limit=limit, containing=match)]}
            functions = shown_functions(list(candidates.values()), live, limit)
            current = repo.details_of(session=session, functions=functions).profiles   # one query, not one each
            profiles = {f.name: current.get((f.name, f.version)) for f in functions}
            return (repo.list_workers(session=session), functions,
                    repo.count_functions(session=session, containing=match), instances, profiles,
                    repo.list_events(session=session, limit=30))

    workers, functions, total, instances, profiles, events = await asyncio.to_thread(read)
    return build(now=now, gateway=services.gateway_id, workers=workers, functions=functions,
                 instances=instances, profiles=profiles, events=events, activity=activity, telemetry=telemetry,
                 latency=services.invoker.latency, history=services.shares, streams=services.stream_times.summary,
                 functions_total=total)
