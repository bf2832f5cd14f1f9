"""A failure that repeats is logged once, then as a count, then as its recovery (pure but for
the logger; the clock is passed in).

Loops that retry (heartbeats, the controller's pass, a worker that does not answer) would
otherwise log every attempt: a state store outage made a worker write a traceback about 40
times a second.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeout
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

DATABASE_DOWN = (OperationalError, InterfaceError, PoolTimeout)
STATE_STORE_DOWN = (RedisConnectionError, RedisTimeout)
# Expected while a store or a peer is away, not bugs: logged without a traceback.
OUTAGES = (OSError, TimeoutError, *DATABASE_DOWN, *STATE_STORE_DOWN)


def describe(exc: BaseException) -> str:
    """``Type: message``, or the type alone for exceptions without one (timeouts)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class FailureLog:
    """``failed(exc)`` on each failed attempt, ``succeeded()`` on each good one."""

    def __init__(self, logger: logging.Logger, what: str, every_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log, self._what, self._every_s, self._clock = logger, what, every_s, clock
        self._count = 0
        self._since = 0.0
        self._said_at = 0.0

    def failed(self, exc: BaseException) -> None:
        now = self._clock()
        self._count += 1
        if self._count == 1:
            self._since = self._said_at = now
            # A bug shows its traceback once; an outage (store, network) its reason alone.
            self._log.warning("%s failed: %s", self._what, describe(exc), exc_info=not isinstance(exc, OUTAGES))
        elif now - self._said_at >= self._every_s:
            self._said_at = now
            self._log.warning("%s still failing: %d attempts in %.0f s, the last: %s", self._what, self._count,
                              now - self._since, describe(exc))

    def succeeded(self) -> None:
        if self._count:
            self._log.warning("%s works again after %d failed attempts in %.0f s", self._what, self._count,
                              self._clock() - self._since)
        self._count = 0
