"""Leading the controllers: wait for the lease, keep it, give it up; sessions fenced by the term.

Any number of controllers may run; the one holding the lease (``dilu.db.lease``) reconciles, the
others wait for it. The keeper renews on ``dilu.policy.leadership``'s timing and returns as soon as
the lease is lost (another holder, or no renewal for too long: a partition from the database),
so the caller stops acting. Writes through ``fenced_sessions`` are checked against the term in
their own transaction, which catches the case the keeper cannot: a leader paused past its lease
that resumes in the middle of a pass.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import Protocol

from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from dilu.db import lease
from dilu.fencing import Deposed
from dilu.policy.leadership import LeaseTiming

log = logging.getLogger(__name__)
CALL_TIMEOUT_FACTOR = 0.5   # of ttl_s: a database call that hangs longer counts as failed


def controller_identity(given: str | None = None) -> str:
    """Who a controller is in the lease and in ``dilu status``: the setting, else host, pid and a
    nonce (a restarted process that gets the same pid is still someone else)."""
    return given or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def fenced_sessions(sessions: sessionmaker[Session], term: int,
                    on_deposed: Callable[[], None] = lambda: None) -> sessionmaker[Session]:
    """Sessions like ``sessions`` whose every commit first checks that ``term`` still holds the
    lease; one that does not raises ``Deposed`` and is rolled back (``on_deposed`` is told)."""
    factory: sessionmaker[Session] = sessionmaker(**sessions.kw)

    @event.listens_for(factory, "before_commit")
    def _still_leading(session: Session) -> None:
        try:
            lease.check_term(session, term)
        except Deposed:
            on_deposed()
            raise

    return factory


class Leadership:
    def __init__(self, sessions: sessionmaker[Session], holder: str, ttl_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.sessions, self.holder, self.timing, self._clock = sessions, holder, LeaseTiming(ttl_s), clock
        self.term: int | None = None
        self.lost = asyncio.Event()   # set by a fenced write that was refused, and by the keeper
        self._loop: asyncio.AbstractEventLoop | None = None

    async def _call(self, fn: Callable[..., object], **kwargs: object) -> object:
        def run() -> object:
            with self.sessions() as session:
                return fn(session=session, **kwargs)

        async with asyncio.timeout(self.timing.ttl_s * CALL_TIMEOUT_FACTOR):
            return await asyncio.to_thread(run)

    async def acquire(self) -> int:
        """Waits until this controller holds the lease; its term."""
        waiting_since, said = self._clock(), False
        while True:
            try:
                term = await self._call(lease.try_acquire, holder=self.holder, ttl_s=self.timing.ttl_s)
            except Exception as exc:  # noqa: BLE001 - the database is out: keep asking
                log.warning("could not ask for the controller lease: %s", exc)
                term = None
            if isinstance(term, int):
                self.term, self.lost, self._loop = term, asyncio.Event(), asyncio.get_running_loop()
                log.info("leading the controllers (term %d, as %s)", term, self.holder)
                return term
            if not said and self._clock() - waiting_since >= self.timing.ttl_s:
                log.info("standing by: another controller leads")
                said = True
            await asyncio.sleep(self.timing.retry_every_s)

    async def keep(self) -> None:
        """Renews the lease until it is lost; returns then (the caller stops acting)."""
        assert self.term is not None, "acquire first"
        term, sent_ok = self.term, self._clock()
        while not self.lost.is_set():
            try:
                async with asyncio.timeout(self.timing.renew_every_s):
                    await self.lost.wait()
                break
            except TimeoutError:
                pass
            sent = self._clock()
            try:
                renewed = await self._call(lease.renew, holder=self.holder, term=term, ttl_s=self.timing.ttl_s)
            except Exception as exc:  # noqa: BLE001 - judged by time below
                log.warning("renewing the controller lease (term %d) failed: %s", term, exc)
            else:
                if not renewed:
                    log.warning("the controller lease of term %d was taken over: standing by", term)
                    break
                sent_ok = sent
            if self.timing.must_step_down(sent_ok, self._clock()):
                log.warning("the controller lease of term %d could not be renewed for %.1f s: standing by",
                            term, self._clock() - sent_ok)
                break
        self.lost.set()
        self.term = None

    def deposed(self, term: int) -> None:
        """A fenced write of ``term`` was refused: the lease is someone else's. Called from the
        threads that run database calls."""
        loop, lost = self._loop, self.lost
        if term == self.term and loop is not None:
            loop.call_soon_threadsafe(lost.set)

    async def release(self, term: int) -> None:
        """Gives the lease up (a controller asked to stop), so a standby takes over at once."""
        try:
            await self._call(lease.release, holder=self.holder, term=term)
        except Exception as exc:  # noqa: BLE001 - it expires on its own
            log.warning("could not release the controller lease: %s", exc)


class Leader(Protocol):
    async def run(self) -> None:
        """Acts until cancelled."""

    async def shutdown(self, grace_s: float) -> None:
        """Ends what it started in the background, waiting at most ``grace_s``."""


async def _stopped(*tasks: asyncio.Task) -> None:
    """Cancels ``tasks`` until each has ended: code a task awaits can swallow a cancellation
    (``asyncio.wait_for`` on Python 3.11 did, which the lint now bans), and a loop then runs on."""
    for task in tasks:
        while not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=0.1)


async def lead(leadership: Leadership, make_leader: Callable[[int], Leader], grace_s: float) -> None:
    """Forever: waits for the lease, acts through a fresh ``make_leader(term)`` (a reconciler,
    which rebuilds its view from the database and the state store) while it is held, and stands
    by again when it is lost (its keeper says so, or the leader returns: a write of its was
    refused). Cancelled (the controller stops), it lets the leader finish its calls for up to
    ``grace_s`` and releases the lease so a standby takes over at once."""
    while True:
        term = await leadership.acquire()
        leader = make_leader(term)
        acting = asyncio.create_task(leader.run())
        keeping = asyncio.create_task(leadership.keep())
        try:
            await asyncio.wait({acting, keeping}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            await _stopped(acting, keeping)
            await leader.shutdown(grace_s)
            await leadership.release(term)
            raise
        await _stopped(acting, keeping)
        leadership.term = None
        await leader.shutdown(0.0)    # nothing more of this term may go out
        failure = None if acting.cancelled() else acting.exception()
        if failure is not None:
            await leadership.release(term)
            raise failure
        log.warning("no longer leading (term %d): standing by", term)
