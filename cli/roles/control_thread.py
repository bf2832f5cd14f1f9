"""`dilu up`'s controller and workers on a thread of their own, with their own event loop.

The gateway's loop serves requests; the reconcile pass, the catalogue it reads at each resync,
starting and watching instances all run on this one. A request therefore never waits behind a
pass (it did when they shared a loop: a pass over thousands of functions held it for a tenth of a
second). A thread rather than a process: the in-process state store, the SQLite file and the
workers' instances stay shared as they are, with no second store to run; the two loops meet only
in the state store (locked, messages delivered on the subscriber's loop) and in the gateway's
calls to workers (run on this loop). Python code of both still takes turns on the interpreter,
a few milliseconds at a time (bench/many_functions.py measures the warm p99 beside it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import ctypes.util
import logging
import threading
from functools import partial

from sqlalchemy.orm import Session, sessionmaker

from cli.roles.worker import make_agents
from dilu.config import AllInOneSettings
from dilu.controller.leadership import Leadership, controller_identity, fenced_sessions, lead
from dilu.controller.reconciler import SHUTDOWN_GRACE_S, Reconciler
from dilu.default_impl import create_scheduler, store_for_another_loop
from dilu.state.base import StateStore
from dilu.worker_client import InProcessWorkerClient, WorkerDirectory

log = logging.getLogger(__name__)
THREAD_NAME = "dilu-control"   # also the name the OS shows (/proc/<pid>/task/*/comm), so its CPU can be read apart
STOP_WAIT_S = 30.0             # for the controller's and the workers' shutdown
DB_THREADS = 8                 # the control loop's own threads for blocking calls (database, files)


def name_os_thread(name: str) -> None:
    """Gives the calling thread ``name`` (15 bytes at most) as the OS sees it; best effort."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)    # PR_SET_NAME
    except (OSError, AttributeError):
        pass


class ControlThread:
    """Starts the workers (each adopts what it already runs) and the controller on the control
    thread; ``stop`` shuts them down there."""

    def __init__(self, settings: AllInOneSettings, sessions: sessionmaker[Session], store: StateStore,
                 directory: WorkerDirectory) -> None:
        self._settings, self._sessions, self._store, self._directory = settings, sessions, store, directory
        self._thread = threading.Thread(target=self._main, name=THREAD_NAME, daemon=True)
        self._started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None

    async def start(self) -> None:
        """Returns once the workers are registered and the controller runs; raises what stopped
        them from starting."""
        self._thread.start()
        await asyncio.wrap_future(self._started)

    async def stop(self) -> None:
        """Shuts the controller and the workers down and waits (a bounded time) for the thread."""
        if self._loop is not None and self._stop is not None:
            try:
                self._loop.call_soon_threadsafe(self._stop.set)
            except RuntimeError:   # the loop has ended already
                pass
        await asyncio.to_thread(self._thread.join, STOP_WAIT_S)
        if self._thread.is_alive():
            log.warning("the controller and workers did not stop within %.0f s", STOP_WAIT_S)

    def _main(self) -> None:
        name_os_thread(THREAD_NAME)
        try:
            asyncio.run(self._run())
        except Exception as exc:   # handed to start(), or logged once running
            if not self._started.done():
                self._started.set_exception(exc)
            else:
                log.exception("the controller and workers stopped: %s", exc)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(
            DB_THREADS, thread_name_prefix=THREAD_NAME, initializer=name_os_thread, initargs=(THREAD_NAME,)))
        self._loop, self._stop = loop, asyncio.Event()
        store = store_for_another_loop(self._settings, self._store)
        try:
            agents = make_agents(self._settings, store, self._sessions)
            await asyncio.gather(*(agent.adopt() for agent in agents))
            for agent in agents:
                self._directory.register_local(agent.info.id, InProcessWorkerClient(agent, loop))
            # The same lease and fencing as separate controllers: one process here, so it leads at
            # once, or within a lease of an earlier run that was killed.
            leadership = Leadership(self._sessions, controller_identity(self._settings.controller_id),
                                    self._settings.leader_lease_s)

            def reconciler_for(term: int) -> Reconciler:
                return Reconciler(sessions=fenced_sessions(self._sessions, term, partial(leadership.deposed, term)),
                                  store=store, directory=self._directory.with_term(term),
                                  scheduler=create_scheduler(self._settings.scheduler), settings=self._settings,
                                  term=term)

            tasks = [asyncio.create_task(agent.run()) for agent in agents]
            tasks.append(asyncio.create_task(lead(leadership, reconciler_for, SHUTDOWN_GRACE_S)))
            self._started.set_result(None)
            try:
                await self._stop.wait()
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await asyncio.gather(*(agent.shutdown() for agent in agents), return_exceptions=True)
        finally:
            if store is not self._store:
                await store.close()

