"""A ``dilu.workflows.loading.Platform`` with no gateway behind it: functions become routable
when a test says so, and invocations answer at once."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from dilu.workflows.hints import WorkflowHints
from dilu.workflows.loading import Invoked


class FakePlatform:
    def __init__(self, cold_s: dict[str, float] | None = None, memory: dict[str, int] | None = None) -> None:
        self.hints = WorkflowHints()
        self.memory_price = 0.01
        self._cold = cold_s or {}
        self._memory = memory or {}
        self._routable: dict[str, asyncio.Event] = {}
        self._tasks: set[asyncio.Task] = set()
        self.demanded: list[str] = []

    def cold_start_s(self, function: str) -> float | None:
        return self._cold.get(function)

    def memory_bytes(self, function: str) -> int:
        return self._memory.get(function, 0)

    def warm(self, function: str) -> bool:
        return self._event(function).is_set()

    def service_time_s(self, function: str, now: float) -> float | None:
        return None

    async def invoke(self, function: str, body: bytes) -> Invoked:
        return Invoked(200, body, 0.0)

    async def until_routable(self, function: str, timeout_s: float) -> bool:
        await self._event(function).wait()
        return True

    async def become_routable(self, function: str) -> None:
        """Makes ``function`` routable and waits for what was waiting on it."""
        self._event(function).set()
        await asyncio.gather(*self._tasks)

    def demand(self, function: str) -> None:
        self.demanded.append(function)

    def flush_hints(self) -> None:
        pass

    def wake_controller(self) -> None:
        pass

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)

    def _event(self, function: str) -> asyncio.Event:
        return self._routable.setdefault(function, asyncio.Event())
