"""The worker's HTTP API, used when the controller and gateway run in other processes."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from dilu.fencing import TERM_HEADER, TermWatermark
from dilu.messages import StartInstance
from dilu.peers import PeerUids
from dilu.slices import ComputeSlice, SliceError
from worker.agent import WorkerAgent


def create_worker_api(agent: WorkerAgent, cluster_key: str | None = None,
                      instance_uids: tuple[int, int] | None = None) -> FastAPI:
    """The API; with ``cluster_key`` every call must carry it (``Authorization: Bearer``): a
    start order runs code, so only the controller and gateways may give one. Without one (a
    worker on loopback) it answers this machine's users, but not callers whose socket belongs to
    ``instance_uids``: a function must not start, stop or resize instances."""
    app = FastAPI(title="Dilu worker", version="0.1.0")

    if not cluster_key and instance_uids is not None:
        peers, (first, last) = PeerUids(), instance_uids

        @app.middleware("http")
        async def not_its_instances(request: Request,
                                    call_next: Callable[[Request], Awaitable[Response]]) -> Response:
            client, server = request.scope.get("client"), request.scope.get("server")
            uid = peers.of(tuple(client), tuple(server)) if client and server else None
            if uid is not None and first <= uid <= last:
                return JSONResponse({"error": f"this worker has no cluster key, so it takes orders only from this "
                                              f"machine's users, and this call comes from a function's instance "
                                              f"(uid {uid}); set DILU_CLUSTER_KEY on every role"}, status_code=403)
            return await call_next(request)

    if cluster_key:
        expected = f"Bearer {cluster_key}".encode()

        @app.middleware("http")
        async def only_the_cluster(request: Request,
                                   call_next: Callable[[Request], Awaitable[Response]]) -> Response:
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                return JSONResponse({"error": "this worker takes orders only from its cluster "
                                              "(DILU_CLUSTER_KEY)"}, status_code=401)
            return await call_next(request)

    newest = TermWatermark()

    @app.middleware("http")
    async def only_the_leading_controller(request: Request,
                                          call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        """A controller sends its lease's term on every call (``dilu.fencing``); a reading call
        teaches the worker the newest term, and an order from an older one is refused."""
        given = request.headers.get(TERM_HEADER)
        if given is not None:
            if not given.isdigit() or len(given) > 18:
                return JSONResponse({"error": f"{TERM_HEADER} must be a whole number"}, status_code=400)
            if not newest.admit(int(given)) and request.method not in ("GET", "HEAD"):
                return JSONResponse({"error": f"refused: this order comes from controller term {given}, and "
                                              f"term {newest.newest} leads now"}, status_code=409)
        return await call_next(request)

    @app.get("/v1/info")
    async def info() -> dict[str, Any]:
        return agent.describe()

    @app.post("/v1/instances")
    async def start(body: dict[str, Any]) -> dict[str, Any]:
        status = await agent.start_instance(StartInstance.from_dict(body))
        return status.to_dict()

    @app.get("/v1/instances")
    async def instances() -> list[dict[str, Any]]:
        return [status.to_dict() for status in await agent.list_instances()]

    @app.delete("/v1/instances/{instance_id}")
    async def stop(instance_id: str) -> dict[str, str]:
        await agent.stop_instance(instance_id)
        return {"stopped": instance_id}

    @app.get("/v1/instances/{instance_id}/logs", response_class=PlainTextResponse)
    async def logs(instance_id: str, tail: int = Query(200, ge=0, le=100_000)) -> str:
        return await agent.read_logs(instance_id, tail)

    @app.put("/v1/instances/{instance_id}/slice")
    async def set_slice(instance_id: str, body: dict[str, Any]) -> JSONResponse:
        try:
            compute = ComputeSlice.from_wire(body)
        except SliceError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        return JSONResponse({"applied": await agent.set_slice(instance_id, compute)})

    @app.get("/v1/telemetry")
    async def telemetry() -> dict[str, Any]:
        return agent.telemetry()

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "worker": agent.info.id}

    return app
