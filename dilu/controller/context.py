"""What the controller's parts share: database access off the event loop, events, background calls."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from dilu.db import repo
from dilu.fencing import Deposed
from dilu.messages import Endpoint, FunctionStatus
from dilu.state.base import Channel, StateStore
from dilu.worker_client import WorkerDirectory

log = logging.getLogger(__name__)


class ControllerContext:
    def __init__(self, *, sessions: sessionmaker[Session], store: StateStore, directory: WorkerDirectory,
                 term: int | None = None) -> None:
        self.sessions = sessions
        self.term = term   # the lease's, carried by every decision (dilu.fencing); None: unfenced (tests)
        self.store = store
        self.directory = directory
        self.wake = asyncio.Event()
        # Held while instance rows are folded from reports and while the published routes are
        # computed and written: a read of the rows and the write of the routes from it must not
        # interleave with another (a route published from rows read before a stop would bring
        # a stopping instance back).
        self.routes_lock = asyncio.Lock()
        self.worker_urls: dict[str, str | None] = {}   # the live workers' addresses, as the last pass read them
        self.background: set[asyncio.Task] = set()
        self.changed: set[str] = set()   # functions whose status this controller changed since its last read
        self.actions = 0   # events recorded and statuses set: a pass that adds none acted on nothing

    async def route(self, function: str, instance_id: str, endpoint: Endpoint | None) -> None:
        """Adds one instance's endpoint to its function's published routes (``endpoint``), or
        removes it (None), leaving the others as they are. The caller holds ``routes_lock``."""
        published = (await self.store.get_routes()).get(function, [])
        routes = [e for e in published if e.instance_id != instance_id] + ([endpoint] if endpoint else [])
        if sorted(routes, key=lambda e: e.instance_id) != sorted(published, key=lambda e: e.instance_id):
            await self.store.set_routes(function, routes, term=self.term)
            await self.store.publish(Channel.ROUTES, {"function": function})

    def _db(self, fn: Callable[..., Any], /, **kwargs: Any) -> Any:
        with self.sessions() as session:
            return fn(session=session, **kwargs)

    async def db(self, fn: Callable[..., Any], /, **kwargs: Any) -> Any:
        """Runs a repository function in a thread with its own session."""
        return await asyncio.to_thread(self._db, fn, **kwargs)

    async def set_status(self, name: str, version: int, status: FunctionStatus, error: str | None = None) -> None:
        """The one place a function's status changes: written, noted for this controller's next
        read of the function (``changed``: not left to its own event's delivery), then published
        to the gateways."""
        await self.db(repo.set_function_status, name=name, version=version, status=status.value, error=error)
        self.changed.add(name)
        self.actions += 1
        await self.store.publish(Channel.FUNCTIONS, {"function": name})

    async def event(self, function: str, action: str, reason: str, instance_id: str | None = None) -> None:
        log.info("%s %s: %s", function, action, reason)
        self.actions += 1
        await self.db(repo.record_event, function=function, action=action, reason=reason, instance_id=instance_id,
                      term=self.term)

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Runs a worker call in the background; the loop wakes when it ends."""
        async def guarded() -> None:
            try:
                await coroutine
            except asyncio.CancelledError:
                pass
            except Deposed as exc:
                log.info("a late decision was refused: %s", exc)
            except IntegrityError:
                # Its function was deleted under it (foreign keys): nothing left to do.
                log.info("a background task's function was deleted meanwhile")
            except Exception:
                log.exception("background controller task failed")
            self.wake.set()

        task = asyncio.create_task(guarded())
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        return task
