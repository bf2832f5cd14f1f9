"""The dashboard: a static page (open: it holds no data) and the one document it polls
(``GET /v1/dashboard``, the ``read`` scope), assembled by ``gateway.dashboard.view``."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException
from fastapi.responses import Response

from dilu.db import repo
from dilu.db.models import FunctionRow, InstanceRow, ProfileRow, ScalingEventRow, WorkerRow
from gateway.dashboard.view import build
from gateway.deps import ServicesDep
from gateway.docs import AUTH_ERRORS, SECURED, errors

STATIC = Path(__file__).resolve().parent.parent / "dashboard" / "static"
ASSETS = {"dashboard.js": "text/javascript; charset=utf-8", "dashboard.css": "text/css; charset=utf-8"}
# The page loads nothing but its own script and style, and may not be framed: whatever text the
# data holds (logs, errors) can never run as script there.
PAGE_HEADERS = {"content-security-policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
                "x-frame-options": "DENY", "x-content-type-options": "nosniff", "cache-control": "no-cache"}

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
    200: {"description": "Functions (status, instances, request rate, p99, profile), devices (instances, "
                         "memory slices, granted and used compute shares now and over time) and recent "
                         "scaling decisions", "content": {"application/json": {"schema": {"type": "object"}}}},
    **AUTH_ERRORS})
async def dashboard(services: ServicesDep) -> dict[str, Any]:
    def read() -> tuple[list[WorkerRow], list[FunctionRow], list[InstanceRow], dict[str, ProfileRow | None],
                        list[ScalingEventRow]]:
        with services.sessions() as session:
            functions = repo.list_functions(session=session)
            current = repo.details_of(session=session, functions=functions).profiles   # one query, not one each
            profiles = {f.name: current.get((f.name, f.version)) for f in functions}
            return (repo.list_workers(session=session), functions,
                    repo.list_instances(session=session, active_only=True), profiles,
                    repo.list_events(session=session, limit=30))

    workers, functions, instances, profiles, events = await asyncio.to_thread(read)
    try:   # counters and telemetry are best effort: the rest comes from the database
        activity = await services.store.function_activity()
        telemetry = await services.store.telemetry()
    except Exception:  # noqa: BLE001 - the store is down: the page shows the database alone
        activity, telemetry = {}, {}
    return build(now=time.time(), gateway=services.gateway_id, workers=workers, functions=functions,
                 instances=instances, profiles=profiles, events=events, activity=activity, telemetry=telemetry,
                 latency=services.latency, history=services.shares, streams=services.stream_times.summary)
