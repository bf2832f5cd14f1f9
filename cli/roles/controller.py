"""The controller role: placement, scaling, profiling and the instances' lifecycle."""

from __future__ import annotations

import asyncio
import contextlib

from cli.roles.serving import CLOSE_TIMEOUT_S, STOP_WITHIN_S, exit_within
from dilu.config import ControllerSettings
from dilu.controller.reconciler import Reconciler
from dilu.db.engine import make_engine, make_session_factory
from dilu.default_impl import create_http_client, create_scheduler, create_store
from dilu.worker_client import WorkerDirectory


async def run_controller(settings: ControllerSettings) -> None:
    engine = make_engine(settings.effective_database_url)
    store = create_store(settings)
    http = create_http_client()
    reconciler = Reconciler(sessions=make_session_factory(engine), store=store,
                            directory=WorkerDirectory(http, settings.cluster_key),
                            scheduler=create_scheduler(settings.scheduler), settings=settings)
    try:
        await reconciler.run()
    finally:
        exit_within(STOP_WITHIN_S)
        await reconciler.shutdown()
        # Bounded: a connection left half-open by a state store outage must not keep a stopping
        # controller alive.
        for closing in (http.aclose(), store.close()):
            with contextlib.suppress(Exception, asyncio.TimeoutError):
                await asyncio.wait_for(closing, CLOSE_TIMEOUT_S)
        engine.dispose()
