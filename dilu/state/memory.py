"""In-process state store and event bus for the embedded default (`dilu up`).

`dilu up` runs the gateway on one thread and the controller and workers on another, each with its
own event loop: every read and write holds one lock, and a message reaches each subscriber on
the loop that subscribed.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from dilu.fencing import Deposed, TermWatermark
from dilu.messages import Endpoint, FunctionActivity, WorkerInfo
from dilu.state.base import REQUEST_HISTORY_S, Channel, merge_activity


class MemoryStore:
    """Implements StateStore with dicts; TTLs follow the monotonic clock."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()   # held for dict work only, never across an await
        self._workers: dict[str, tuple[WorkerInfo, float]] = {}
        self._snapshots: dict[str, tuple[dict[str, dict[str, Any]], float]] = {}
        self._counts: dict[str, dict[int, int]] = {}
        self._routes: dict[str, list[Endpoint]] = {}
        self._routes_term = TermWatermark()
        self._telemetry: dict[str, tuple[dict[str, dict[str, Any]], float]] = {}
        self._subscribers: dict[str, dict[asyncio.Queue, asyncio.AbstractEventLoop]] = {}
        self._histories: dict[str, tuple[deque[dict[str, Any]], float]] = {}

    async def heartbeat(self, info: WorkerInfo, ttl_s: float) -> None:
        with self._lock:
            self._workers[info.id] = (info, self._clock() + ttl_s)

    async def live_workers(self) -> list[WorkerInfo]:
        now = self._clock()
        with self._lock:
            return [info for info, expires in self._workers.values() if expires > now]

    async def report_activity(self, gateway_id: str, snapshot: dict[str, dict[str, Any]],
                              counts: dict[str, dict[int, int]], ttl_s: float) -> None:
        horizon = int(time.time()) - REQUEST_HISTORY_S
        with self._lock:
            self._snapshots[gateway_id] = (dict(snapshot), self._clock() + ttl_s)
            for name, per_second in counts.items():
                into = self._counts.setdefault(name, {})
                for second, count in per_second.items():
                    into[second] = into.get(second, 0) + count
                for second in [s for s in into if s < horizon]:
                    del into[second]

    async def function_activity(self) -> dict[str, FunctionActivity]:
        now = self._clock()
        with self._lock:
            live = [snapshot for snapshot, expires in self._snapshots.values() if expires > now]
            return merge_activity(live, self._counts)

    async def report_telemetry(self, worker_id: str, instances: dict[str, dict[str, Any]], ttl_s: float) -> None:
        with self._lock:
            self._telemetry[worker_id] = (dict(instances), self._clock() + ttl_s)

    async def telemetry(self) -> dict[str, dict[str, Any]]:
        now = self._clock()
        merged: dict[str, dict[str, Any]] = {}
        with self._lock:
            for instances, expires in self._telemetry.values():
                if expires > now:
                    merged.update(instances)
        return merged

    async def set_routes(self, function: str, endpoints: list[Endpoint], term: int | None = None) -> None:
        with self._lock:
            if term is not None and not self._routes_term.admit(term):
                raise Deposed(term, self._routes_term.newest)
            if endpoints:
                self._routes[function] = list(endpoints)
            else:
                self._routes.pop(function, None)

    async def get_routes(self) -> dict[str, list[Endpoint]]:
        with self._lock:
            return {name: list(endpoints) for name, endpoints in self._routes.items()}

    async def append_history(self, key: str, item: dict[str, Any], keep: int, ttl_s: float) -> None:
        with self._lock:
            items = self._live_history(key)
            if items is None or items.maxlen != keep:
                items = deque(items or (), maxlen=keep)
            items.append(dict(item))
            self._histories[key] = (items, self._clock() + ttl_s)

    async def histories(self, keys: list[str]) -> dict[str, list[dict[str, Any]]]:
        with self._lock:
            return {key: [dict(item) for item in self._live_history(key) or ()] for key in keys}

    def _live_history(self, key: str) -> deque[dict[str, Any]] | None:
        found = self._histories.get(key)
        if found is None or found[1] <= self._clock():
            self._histories.pop(key, None)
            return None
        return found[0]

    async def publish(self, channel: Channel, message: dict[str, Any]) -> None:
        with self._lock:
            subscribers = list(self._subscribers.get(channel.value, {}).items())
        here = asyncio.get_running_loop()
        for queue, loop in subscribers:
            if loop is here:
                queue.put_nowait(dict(message))
                continue
            try:   # an asyncio.Queue is its loop's alone: the put runs there
                loop.call_soon_threadsafe(queue.put_nowait, dict(message))
            except RuntimeError:   # that loop has closed: its subscriber is gone
                with self._lock:
                    self._subscribers.get(channel.value, {}).pop(queue, None)

    async def subscribe(self, channel: Channel) -> _MemorySubscription:
        queue: asyncio.Queue = asyncio.Queue()
        with self._lock:
            self._subscribers.setdefault(channel.value, {})[queue] = asyncio.get_running_loop()
        return _MemorySubscription(queue, lambda: self._unsubscribe(channel, queue))

    def _unsubscribe(self, channel: Channel, queue: asyncio.Queue) -> None:
        with self._lock:
            self._subscribers.get(channel.value, {}).pop(queue, None)

    async def close(self) -> None:
        with self._lock:
            self._subscribers.clear()


class _MemorySubscription:
    def __init__(self, queue: asyncio.Queue, unsubscribe: Callable[[], None]) -> None:
        self._queue, self._unsubscribe = queue, unsubscribe

    async def get(self, timeout: float) -> dict[str, Any] | None:
        try:
            async with asyncio.timeout(timeout):
                return await self._queue.get()
        except TimeoutError:
            return None

    async def aclose(self) -> None:
        self._unsubscribe()
