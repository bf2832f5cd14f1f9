"""`dilu up`: gateway, controller and one worker per device in this process."""

from __future__ import annotations

import asyncio

from cli.roles.gateway import check_exposure, serve_gateway
from cli.roles.serving import OnReady, listen
from cli.roles.worker import make_agents
from dilu.config import AllInOneSettings
from dilu.controller.reconciler import Reconciler
from dilu.db.engine import make_engine, make_session_factory, migrate
from dilu.default_impl import create_http_client, create_scheduler, create_store
from dilu.worker_client import InProcessWorkerClient, WorkerDirectory
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
    directory = WorkerDirectory(http, settings.cluster_key)
    agents = make_agents(settings, store, sessions)
    await asyncio.gather(*(agent.adopt() for agent in agents))
    for agent in agents:
        directory.register_local(agent.info.id, InProcessWorkerClient(agent))
    reconciler = Reconciler(sessions=sessions, store=store, directory=directory,
                            scheduler=create_scheduler(settings.scheduler), settings=settings)

    async def build() -> GatewayServices:
        return GatewayServices(settings=settings, sessions=sessions, store=store, directory=directory, http=http)

    background = [asyncio.create_task(agent.run()) for agent in agents]
    background.append(asyncio.create_task(reconciler.run()))
    try:
        await serve_gateway(settings, sock, on_ready, build, background)
    finally:
        await reconciler.shutdown()
        await asyncio.gather(*(agent.shutdown() for agent in agents), return_exceptions=True)
        await http.aclose()
        await store.close()
        engine.dispose()
