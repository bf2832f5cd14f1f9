"""The gateway's routing table: ready endpoints per function, least-outstanding choice, and the
bounded wait of requests that arrive while nothing is ready (cold start)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from dilu.messages import Endpoint


class QueueFull(Exception):
    """The function's cold-start queue is at its bound."""


class NoInstance(Exception):
    """No instance became ready before the deadline, or the function cannot start."""


class GatewayStopping(NoInstance):
    """The gateway is stopping: a request that would wait for an instance is answered at once
    (503, retry elsewhere) instead of holding the stop up."""


@dataclass
class _FunctionRoutes:
    endpoints: list[Endpoint] = field(default_factory=list)
    outstanding: dict[str, int] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    waiting: int = 0
    failure: str | None = None  # set while the function cannot start; waiters give up at once


SUSPECT_S = 5.0    # a worker whose instance just failed is avoided this long (a lost worker's TTL)


def choose_least_outstanding(endpoints: list[Endpoint], outstanding: dict[str, int],
                             exclude: frozenset[str] = frozenset(),
                             avoid: frozenset[str] = frozenset()) -> Endpoint | None:
    """The endpoint with the fewest requests in flight (first listed wins ties), leaving out the
    instances in ``exclude``; one on a worker in ``avoid`` only when no other is left."""
    best, best_key = None, None
    for endpoint in endpoints:
        if endpoint.instance_id in exclude:
            continue
        key = (endpoint.worker_id in avoid, outstanding.get(endpoint.instance_id, 0))
        if best_key is None or key < best_key:
            best, best_key = endpoint, key
    return best


def suspects_at(suspected: dict[str, float], now: float) -> frozenset[str]:
    """The workers still suspected at ``now`` (each maps to when its suspicion ends)."""
    return frozenset(worker for worker, until in suspected.items() if until > now)


class RoutingTable:
    def __init__(self, queue_size: int, clock: Callable[[], float] | None = None) -> None:
        self._queue_size = queue_size
        self._clock = clock
        self._suspected: dict[str, float] = {}    # worker id -> when its suspicion ends
        self._functions: dict[str, _FunctionRoutes] = {}
        self._touched: set[str] = set()   # functions with a request routed or queued since ``busy()``
        self._busy: set[str] = set()
        self._stopping: str | None = None

    def stop_queueing(self, reason: str) -> None:
        """The gateway is stopping: every request waiting for an instance, and any that would
        wait from now on, raises GatewayStopping with ``reason``."""
        self._stopping = reason
        for entry in self._functions.values():
            self._notify(entry)

    def _entry(self, function: str) -> _FunctionRoutes:
        entry = self._functions.get(function)
        if entry is None:
            entry = self._functions[function] = _FunctionRoutes()
        return entry

    def set_endpoints(self, function: str, endpoints: list[Endpoint]) -> None:
        entry = self._entry(function)
        entry.endpoints = list(endpoints)
        live = {e.instance_id for e in endpoints}
        entry.outstanding = {k: v for k, v in entry.outstanding.items() if k in live or v > 0}
        if endpoints:
            entry.failure = None
        self._notify(entry)

    def replace_all(self, table: dict[str, list[Endpoint]]) -> None:
        for function in set(self._functions) | set(table):
            new = table.get(function, [])
            if new != self._entry(function).endpoints:
                self.set_endpoints(function, new)

    def drop_endpoint(self, function: str, instance_id: str) -> None:
        """Forgets an endpoint that refused a connection (until the next table refresh)."""
        entry = self._entry(function)
        entry.endpoints = [e for e in entry.endpoints if e.instance_id != instance_id]

    def suspect(self, worker_id: str) -> None:
        """An instance on ``worker_id`` just failed: for ``SUSPECT_S`` its other instances are
        chosen only when no instance elsewhere is ready (the worker itself may be gone)."""
        if worker_id:
            now = self._now()
            self._suspected = {w: t for w, t in self._suspected.items() if t > now}
            self._suspected[worker_id] = now + SUSPECT_S

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    def _avoid(self, avoid: frozenset[str]) -> frozenset[str]:
        return avoid | suspects_at(self._suspected, self._now()) if self._suspected else avoid

    def set_failure(self, function: str, failure: str | None) -> None:
        entry = self._entry(function)
        entry.failure = failure
        self._notify(entry)

    def forget(self, function: str) -> None:
        entry = self._functions.pop(function, None)
        if entry is not None:
            entry.failure = "function was deleted"
            self._notify(entry)

    def endpoints(self, function: str) -> list[Endpoint]:
        return list(self._entry(function).endpoints)

    def queued(self, function: str) -> int:
        entry = self._functions.get(function)
        return entry.waiting if entry else 0

    def in_flight(self, function: str) -> int:
        entry = self._functions.get(function)
        return sum(entry.outstanding.values()) if entry else 0

    def pick(self, function: str, exclude: frozenset[str] = frozenset(),
             avoid: frozenset[str] = frozenset()) -> Endpoint | None:
        entry = self._entry(function)
        return choose_least_outstanding(entry.endpoints, entry.outstanding, exclude, self._avoid(avoid))

    async def wait_for_endpoint(self, function: str, timeout_s: float,
                                exclude: frozenset[str] = frozenset(),
                                on_queued: Callable[[], Awaitable[None]] | None = None,
                                avoid: frozenset[str] = frozenset()) -> Endpoint:
        """Returns an endpoint, waiting in the bounded queue if none is ready; not one of the
        instances in ``exclude``, nor one on a worker in ``avoid`` or suspected while another
        is ready.

        Raises QueueFull when the queue is at its bound, NoInstance on the deadline or when the
        function cannot start, GatewayStopping once ``stop_queueing`` is called.
        """
        endpoint = self.pick(function, exclude, avoid)
        if endpoint is not None:
            return endpoint
        entry = self._entry(function)
        if self._stopping is not None:
            raise GatewayStopping(self._stopping)
        if entry.failure:
            raise NoInstance(entry.failure)
        if entry.waiting >= self._queue_size:
            raise QueueFull(f"{entry.waiting} requests already wait for {function!r} to start")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        entry.waiting += 1
        self._touched.add(function)
        try:
            if on_queued is not None:
                await on_queued()
            while True:
                endpoint = choose_least_outstanding(entry.endpoints, entry.outstanding, exclude, self._avoid(avoid))
                if endpoint is not None:
                    return endpoint
                if self._stopping is not None:
                    raise GatewayStopping(self._stopping)
                if entry.failure:
                    raise NoInstance(entry.failure)
                left = deadline - loop.time()
                if left <= 0:
                    raise NoInstance(f"no instance of {function!r} became ready within {timeout_s:g}s; "
                                     f"`dilu events {function}` shows why")
                changed = entry.changed
                try:
                    async with asyncio.timeout(left):
                        await changed.wait()
                except TimeoutError:
                    pass
        finally:
            entry.waiting -= 1

    async def until_routable(self, function: str, timeout_s: float) -> bool:
        """Waits until ``function`` has an endpoint (without queueing a request); False on the
        deadline."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        entry = self._entry(function)
        while not entry.endpoints:
            left = deadline - loop.time()
            if left <= 0:
                return False
            try:
                async with asyncio.timeout(left):
                    await entry.changed.wait()
            except TimeoutError:
                pass
            entry = self._entry(function)
        return True

    def busy(self) -> set[str]:
        """The functions with requests in flight or queued now (found among those touched since
        the last call and those busy then: never a scan of every function)."""
        touched, self._touched = self._touched, set()
        self._busy = {name for name in touched | self._busy if self.in_flight(name) or self.queued(name)}
        return set(self._busy)

    def acquire(self, function: str, instance_id: str) -> None:
        self._touched.add(function)
        entry = self._entry(function)
        entry.outstanding[instance_id] = entry.outstanding.get(instance_id, 0) + 1

    def release(self, function: str, instance_id: str) -> None:
        entry = self._entry(function)
        left = entry.outstanding.get(instance_id, 0) - 1
        if left > 0:
            entry.outstanding[instance_id] = left
        else:
            entry.outstanding.pop(instance_id, None)

    @staticmethod
    def _notify(entry: _FunctionRoutes) -> None:
        # Wake every waiter, then arm a fresh event for the next change.
        entry.changed.set()
        entry.changed = asyncio.Event()
