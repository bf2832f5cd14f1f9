"""Liveness, platform status and Prometheus metrics."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from dilu.db import lease, repo
from dilu.db.models import FunctionRow, InstanceRow, LeaseRow, WorkerRow
from dilu.messages import ACTIVE_STATES
from gateway.deps import ServicesDep
from gateway.docs import AUTH_ERRORS, SECURED
from gateway.needs import Control

router = APIRouter(tags=["system"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


async def _pools(services: Control, workers: list[WorkerRow]) -> dict:
    """Each live worker's runtime pool and token manager timing, asked of the worker itself (best
    effort, bounded)."""
    async def one(worker: WorkerRow) -> tuple[str, dict]:
        client = services.directory.client_for(worker.id, worker.url)
        if client is None or worker.state != "alive":
            return worker.id, {}
        try:
            async with asyncio.timeout(2.0):
                return worker.id, await client.info()
        except Exception:  # noqa: BLE001 - a slow or lost worker shows no pool
            return worker.id, {}

    return dict(await asyncio.gather(*(one(w) for w in workers)))


def _leader(held: LeaseRow | None, now: float) -> dict:
    """Who leads the controllers: the lease's holder while it is unexpired (None: no controller
    leads now, and nothing is placed, scaled or recovered until one does)."""
    leading = held is not None and held.holder and held.expires_at > now
    return {"leader": held.holder if leading else None, "term": held.term if held else None,
            "leading_for_s": round(now - held.acquired_at, 1) if leading else None,
            "lease_left_s": round(held.expires_at - now, 2) if leading else None}


@router.get("/v1/status", dependencies=SECURED, responses=AUTH_ERRORS)
async def status(services: ServicesDep) -> dict:
    def read() -> tuple[list[WorkerRow], list[FunctionRow], list[InstanceRow], tuple[LeaseRow | None, float]]:
        with services.sessions() as session:
            return (repo.list_workers(session=session), repo.list_functions(session=session),
                    repo.list_instances(session=session, active_only=True), lease.read(session=session))

    workers, functions, active, (held, now) = await asyncio.to_thread(read)
    pools = await _pools(services, workers)
    return {
        "gateway": services.gateway_id,
        "database": services.settings.effective_database_url.split("://", 1)[0],
        "state_store": "redis" if services.settings.redis_url else "in-process",
        "controller": _leader(held, now),
        "workers": [
            {"id": w.id, "state": w.state, "device": w.device_kind, "device_name": w.device_name,
             "memory_bytes": w.memory_bytes, "url": w.url,
             "instances": sum(1 for i in active if i.worker_id == w.id and i.state in ACTIVE_STATES),
             "runtime_pool": pools.get(w.id, {}).get("runtime_pool"),
             "token_manager": pools.get(w.id, {}).get("token_manager")}
            for w in workers
        ],
        "functions": {"total": len(functions),
                      "by_status": {s: sum(1 for f in functions if f.status == s)
                                    for s in sorted({f.status for f in functions})}},
        "instances": len([i for i in active if i.state in ACTIVE_STATES]),
    }


@router.get("/metrics", response_class=Response, responses={
    200: {"description": "Prometheus text exposition",
          "content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}},
    **AUTH_ERRORS})
def metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
