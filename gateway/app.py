"""The gateway's app factory."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI

from dilu.workflows.loading import WorkflowLoader
from gateway.abandon import LeavesWithCaller
from gateway.auth import AuthGate
from gateway.encoding import ContentEncoding
from gateway.errors import KeepsConnections, errors_in_openapi, install_error_handlers
from gateway.fast_path import FastPaths
from gateway.limits import BodyLimits
from gateway.openai import routes as openai_routes
from gateway.routes import artifacts, bundles, dashboard, functions, invoke, keys, system, workflows
from gateway.services import GatewayServices
from gateway.v2 import rest as v2_rest
from gateway.workflow_platform import GatewayPlatform


def create_app(build_services: Callable[[], Awaitable[GatewayServices]],
               release: Callable[[GatewayServices], Awaitable[None]] | None = None) -> FastAPI:
    """``build_services`` runs in the lifespan, so nothing connects at import time."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        services = await build_services()
        app.state.services = services
        app.state.workflows = WorkflowLoader(GatewayPlatform(services), services.store)
        await services.start()
        try:
            yield
        finally:
            app.state.workflows.close()
            await services.stop()
            if release is not None:
                await release(services)

    app = FastAPI(title="Dilu", version="0.1.0", lifespan=lifespan,
                  description="Serverless deep-learning functions with introspective elasticity.")
    install_error_handlers(app)
    app.include_router(system.router)
    app.include_router(bundles.router)
    app.include_router(artifacts.router)
    app.include_router(functions.router)
    app.include_router(invoke.router)
    app.include_router(keys.router)
    app.include_router(workflows.router)
    app.include_router(v2_rest.router)
    app.include_router(dashboard.router)
    app.include_router(openai_routes.router)
    errors_in_openapi(app, v2_rest.add_schemas, openai_routes.add_schemas)
    return app


STOPPING = "the gateway is stopping: retry (another gateway, or this one once it is back)"
STOPPED = "the gateway stopped before the answer came: retry (another gateway, or this one once it is back)"


class GatewayASGI(KeepsConnections):
    """The app a server serves, with what that server calls when it starts stopping."""

    def __init__(self, app: LeavesWithCaller, services_of: Callable[[], GatewayServices]) -> None:
        super().__init__(AuthGate(ContentEncoding(app), lambda: services_of().auth), services_of)
        self._invocations = app

    def begin_stop(self, drain_s: float) -> None:
        """Requests waiting for an instance are answered 503 at once (they would hold the stop
        up, and another gateway can serve them now); those in flight may finish for ``drain_s``,
        then are answered 503, a stream with its error frame."""
        self.services_of().routing.stop_queueing(STOPPING)
        asyncio.get_running_loop().call_later(drain_s, self._invocations.end_all, STOPPED)


def create_asgi(build_services: Callable[[], Awaitable[GatewayServices]],
                release: Callable[[GatewayServices], Awaitable[None]] | None = None) -> GatewayASGI:
    """The app to serve: the FastAPI app behind the fast path of the hot routes, both behind the
    end of invocations whose caller left, the decoding of compressed bodies, the key check, and
    the last answer to an unexpected error."""
    app = create_app(build_services, release)
    def services() -> GatewayServices:
        return app.state.services

    limited = BodyLimits(app, lambda: services().settings)
    return GatewayASGI(LeavesWithCaller(FastPaths(limited, services)), services)
