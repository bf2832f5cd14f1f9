"""The gateway role: HTTP (and gRPC) in front of the functions."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable

from sqlalchemy.orm import Session, sessionmaker

from cli.roles.serving import KEEP_ALIVE_S, Beside, OnReady, StartupError, http_server, listen, serve
from dilu.addresses import is_loopback
from dilu.config import GatewaySettings
from dilu.db.engine import make_engine, make_session_factory
from dilu.default_impl import create_http_client, create_store
from dilu.worker_client import WorkerDirectory
from gateway.app import create_asgi
from gateway.services import GatewayServices

log = logging.getLogger(__name__)
STOP_MARGIN_S = 2.0    # after the stop drain, for the answers that end it to go out


def check_exposure(settings: GatewaySettings, sessions: sessionmaker[Session]) -> None:
    """A gateway on which no key was ever made is open: allowed on a loopback address (said in
    the log), refused on any other (anyone who reaches it could run code on the workers). A
    platform whose keys were all revoked stays closed (``dilu keys reopen`` opens it)."""
    from dilu.db import repo

    with sessions() as session:
        keys = bool(settings.admin_key) or repo.key_ever_made(session=session)
    if keys:
        return
    if not is_loopback(settings.host):
        raise StartupError(f"the gateway would listen on {settings.host}, reachable from other machines, and "
                           "no API key exists: set DILU_ADMIN_KEY (24+ characters), or create a key with "
                           "`dilu keys create NAME --scope admin` against a gateway on 127.0.0.1 first")
    log.warning("no API keys: the gateway is open to anyone who can reach %s (loopback only); "
                "`dilu keys create admin --scope admin` turns authentication on", settings.host)


def grpc_beside(settings: GatewaySettings, services_of: Callable[[], GatewayServices]) -> Beside | None:
    """The inference protocol over gRPC beside the HTTP server (none with DILU_GRPC_PORT=-1)."""
    if settings.grpc_port < 0:
        return None

    async def start() -> tuple[Callable[[], Awaitable[None]], str]:
        from gateway.v2.grpc_service import start_grpc

        try:
            server, port = await start_grpc(settings.host, settings.grpc_port, services_of,
                                            settings.max_request_bytes)
        except OSError as exc:
            raise StartupError(f"{exc}; set DILU_GRPC_PORT to a free port, 0 for any, or -1 for no gRPC") from None

        async def stop() -> None:
            await server.stop(grace=settings.stop_drain_s)   # calls in flight finish within the drain

        return stop, f"{settings.host}:{port}"

    return start


async def serve_gateway(settings: GatewaySettings, sock: socket.socket, on_ready: OnReady | None,
                        build: Callable[[], Awaitable[GatewayServices]], background: list[asyncio.Task]) -> None:
    """Serves the gateway app on ``sock`` (with gRPC beside it) until it is told to stop."""
    app = create_asgi(build)
    # No proxy-header rewriting: the gateway reads no client address, and it costs every request.
    # The server's own bound comes after the drain's: by then the app has answered everything.
    server = http_server(app, timeout_graceful_shutdown=settings.stop_drain_s + STOP_MARGIN_S,
                         timeout_keep_alive=KEEP_ALIVE_S, proxy_headers=False)
    server.on_stop.append(lambda: app.begin_stop(settings.stop_drain_s))
    await serve(server, sock, settings.host, on_ready, background, grpc_beside(settings, app.services_of))


async def run_gateway(settings: GatewaySettings, on_ready: OnReady | None = None) -> None:
    sock = listen(settings.host, settings.port)
    engine = make_engine(settings.effective_database_url)
    sessions = make_session_factory(engine)
    try:
        await asyncio.to_thread(check_exposure, settings, sessions)
    except StartupError:
        engine.dispose()
        raise
    store = create_store(settings)
    http = create_http_client()

    async def build() -> GatewayServices:
        return GatewayServices(settings=settings, sessions=sessions, store=store,
                               directory=WorkerDirectory(http, settings.cluster_key), http=http)

    try:
        await serve_gateway(settings, sock, on_ready, build, [])
    finally:
        await http.aclose()
        await store.close()
        engine.dispose()
