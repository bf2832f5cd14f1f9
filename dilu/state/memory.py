"""In-process state store and event bus for the embedded default (`dilu up`)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from dilu.messages import Endpoint, FunctionActivity, WorkerInfo
from dilu.state.base import REQUEST_HISTORY_S, Channel, merge_activity


class MemoryStore:
    """Implements StateStore with dicts; TTLs follow the monotonic clock."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._workers: dict[str, tuple[WorkerInfo, float]] = {}
        self._snapshots: dict[str, tuple[dict[str, dict[str, Any]], float]] = {}
        self._counts: dict[str, dict[int, int]] = {}
        self._routes: dict[str, list[Endpoint]] = {}
        self._telemetry: dict[str, tuple[dict[str, dict[str, Any]], float]] = {}
        self._subscribers: dict[str, set[asyncio.Queue]] = {}
        self._histories: dict[str, tuple[deque[dict[str, Any]], float]] = {}

    async def heartbeat(self, info: WorkerInfo, ttl_s: float) -> None:
        self._workers[info.id] = (info, self._clock() + ttl_s)

    async def live_workers(self) -> list[WorkerInfo]:
        now = self._clock()
        return [info for info, expires in self._workers.values() if expires > now]

    async def report_activity(self, gateway_id: str, snapshot: dict[str, dict[str, Any]],
                              counts: dict[str, dict[int, int]], ttl_s: float) -> None:
        self._snapshots[gateway_id] = (snapshot, self._clock() + ttl_s)
        horizon = int(time.time()) - REQUEST_HISTORY_S
        for name, per_second in counts.items():
            into = self._counts.setdefault(name, {})
            for second, count in per_second.items():
                into[second] = into.get(second, 0) + count
            for second in [s for s in into if s < horizon]:
                del into[second]

    async def function_activity(self) -> dict[str, FunctionActivity]:
        now = self._clock()
        live = [snapshot for snapshot, expires in self._snapshots.values() if expires > now]
        return merge_activity(live, self._counts)

    async def report_telemetry(self, worker_id: str, instances: dict[str, dict[str, Any]], ttl_s: float) -> None:
        self._telemetry[worker_id] = (dict(instances), self._clock() + ttl_s)

    async def telemetry(self) -> dict[str, dict[str, Any]]:
        now = self._clock()
        merged: dict[str, dict[str, Any]] = {}
        for instances, expires in self._telemetry.values():
            if expires > now:
                merged.update(instances)
        return merged

    async def set_routes(self, function: str, endpoints: list[Endpoint]) -> None:
        if endpoints:
            self._routes[function] = list(endpoints)
        else:
            self._routes.pop(function, None)

    async def get_routes(self) -> dict[str, list[Endpoint]]:
        return {name: list(endpoints) for name, endpoints in self._routes.items()}

    async def append_history(self, key: str, item: dict[str, Any], keep: int, ttl_s: float) -> None:
        items = self._live_history(key)
        if items is None or items.maxlen != keep:
            items = deque(items or (), maxlen=keep)
        items.append(dict(item))
        self._histories[key] = (items, self._clock() + ttl_s)

    async def histories(self, keys: list[str]) -> dict[str, list[dict[str, Any]]]:
        return {key: [dict(item) for item in self._live_history(key) or ()] for key in keys}

    def _live_history(self, key: str) -> deque[dict[str, Any]] | None:
        found = self._histories.get(key)
        if found is None or found[1] <= self._clock():
            self._histories.pop(key, None)
            return None
        return found[0]

    async def publish(self, channel: Channel, message: dict[str, Any]) -> None:
        for queue in list(self._subscribers.get(channel.value, ())):
            queue.put_nowait(dict(message))

    async def subscribe(self, channel: Channel) -> _MemorySubscription:
        queue: asyncio.Queue = asyncio.Queue()
        subscribers = self._subscribers.setdefault(channel.value, set())
        subscribers.add(queue)
        return _MemorySubscription(queue, subscribers)

    async def close(self) -> None:
        self._subscribers.clear()


class _MemorySubscription:
    def __init__(self, queue: asyncio.Queue, subscribers: set[asyncio.Queue]) -> None:
        self._queue, self._subscribers = queue, subscribers

    async def get(self, timeout: float) -> dict[str, Any] | None:
        try:
            return await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            return None

    async def aclose(self) -> None:
        self._subscribers.discard(self._queue)
