"""Liveness, platform status and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from dilu.db import repo
from dilu.messages import ACTIVE_STATES
from gateway.deps import ServicesDep, SessionDep
from gateway.docs import AUTH_ERRORS, SECURED

router = APIRouter(tags=["system"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/v1/status", dependencies=SECURED, responses=AUTH_ERRORS)
def status(session: SessionDep, services: ServicesDep) -> dict:
    workers = repo.list_workers(session=session)
    functions = repo.list_functions(session=session)
    active = repo.list_instances(session=session, active_only=True)
    return {
        "gateway": services.gateway_id,
        "database": services.settings.effective_database_url.split("://", 1)[0],
        "state_store": "redis" if services.settings.redis_url else "in-process",
        "workers": [
            {"id": w.id, "state": w.state, "device": w.device_kind, "device_name": w.device_name,
             "memory_bytes": w.memory_bytes, "url": w.url,
             "instances": sum(1 for i in active if i.worker_id == w.id and i.state in ACTIVE_STATES)}
            for w in workers
        ],
        "functions": {"total": len(functions),
                      "by_status": {s: sum(1 for f in functions if f.status == s)
                                    for s in sorted({f.status for f in functions})}},
        "instances": len([i for i in active if i.state in ACTIVE_STATES]),
    }


@router.get("/metrics", response_class=Response, responses={
    200: {"description": "Prometheus text exposition", "content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}},
    **AUTH_ERRORS})
def metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
