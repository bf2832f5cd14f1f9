"""`dilu up`: the gateway on this thread; the controller and one worker per device on the
control thread (``cli.roles.control_thread``), all in this process."""

from __future__ import annotations

import asyncio

from cli.roles.control_thread import ControlThread
from cli.roles.gateway import check_exposure, serve_gateway
from cli.roles.serving import OnReady, listen
from dilu.config import AllInOneSettings
from dilu.db.engine import make_engine, make_session_factory, migrate
from dilu.default_impl import create_http_client, create_store
from dilu.worker_client import WorkerDirectory
from gateway.services import GatewayServices


async def run_all_in_one(settings: AllInOneSettings, on_ready: OnReady | None = None) -> None:
    sock = listen(settings.host, settings.port)
    settings.home.mkdir(parents=True, exist_ok=True)
    url = settings.effective_database_url
    await asyncio.to_thread(migrate, url)
    engine = make_engine(url)
    sessions = make_session_factory(engine)
    await asyncio.to_thread(check_exposure, settings, sessions)
    store = create_store(settings)
    http = create_http_client()
    directory = WorkerDirectory(http, settings.cluster_key)   # every worker is local: reached on its own loop
    control = ControlThread(settings, sessions, store, directory)
    try:
        await control.start()

        async def build() -> GatewayServices:
            return GatewayServices(settings=settings, sessions=sessions, store=store, directory=directory, http=http)

        await serve_gateway(settings, sock, on_ready, build, [])
    finally:
        await control.stop()
        await http.aclose()
        await store.close()
        engine.dispose()
