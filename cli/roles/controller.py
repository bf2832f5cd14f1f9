"""The controller role: placement, scaling, profiling and the instances' lifecycle.

Any number may run against one database; the one holding the lease acts, the others stand by
(``dilu.controller.leadership``)."""

from __future__ import annotations

import asyncio
import contextlib
from functools import partial

from cli.roles.serving import CLOSE_TIMEOUT_S, STOP_WITHIN_S, exit_within
from dilu.config import ControllerSettings
from dilu.controller.leadership import Leadership, controller_identity, fenced_sessions, lead
from dilu.controller.reconciler import SHUTDOWN_GRACE_S, Reconciler
from dilu.db.engine import make_engine, make_session_factory
from dilu.default_impl import create_http_client, create_scheduler, create_store
from dilu.worker_client import WorkerDirectory


async def run_controller(settings: ControllerSettings) -> None:
    # Within half a lease a paused controller's open transaction is ended, so its locks are gone
    # before a standby can take over and needs the rows.
    engine = make_engine(settings.effective_database_url, idle_in_transaction_s=settings.leader_lease_s / 2)
    store = create_store(settings)
    http = create_http_client()
    directory = WorkerDirectory(http, settings.cluster_key)
    sessions = make_session_factory(engine)
    leadership = Leadership(sessions, controller_identity(settings.controller_id), settings.leader_lease_s)

    def reconciler_for(term: int) -> Reconciler:
        return Reconciler(sessions=fenced_sessions(sessions, term, partial(leadership.deposed, term)), store=store,
                          directory=directory.with_term(term), scheduler=create_scheduler(settings.scheduler),
                          settings=settings, term=term)

    try:
        await lead(leadership, reconciler_for, SHUTDOWN_GRACE_S)
    finally:
        exit_within(STOP_WITHIN_S)
        # Bounded: a connection left half-open by a state store outage must not keep a stopping
        # controller alive.
        for closing in (http.aclose(), store.close()):
            with contextlib.suppress(Exception, asyncio.TimeoutError):
                async with asyncio.timeout(CLOSE_TIMEOUT_S):
                    await closing
        engine.dispose()
