"""The gateway as ``dilu.workflows.loading.Platform``: what running workflows needs of it."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from dilu.workflows.loading import Invoked
from gateway.invocation import Invocation
from gateway.needs import WorkflowHost


class GatewayPlatform:
    def __init__(self, services: WorkflowHost) -> None:
        self._services = services
        self.hints = services.activity.hints
        self.memory_price = services.settings.workflow_memory_price

    def cold_start_s(self, function: str) -> float | None:
        entry = self._services.functions.get(function)
        return entry.cold_start_s if entry is not None else None

    def memory_bytes(self, function: str) -> int:
        entry = self._services.functions.get(function)
        return int((entry.spec.get("resources") or {}).get("memory") or 0) if entry else 0

    def warm(self, function: str) -> bool:
        return bool(self._services.routing.endpoints(function))

    def service_time_s(self, function: str, now: float) -> float | None:
        return self._services.invoker.service_time.median_s(function, now)

    async def invoke(self, function: str, body: bytes) -> Invoked:
        # A node's input is its parent's output: bounded by what the parent could send back.
        limit = max(self._services.settings.max_request_bytes, len(body))
        outcome = await self._services.invoker.invoke(Invocation.of_body(function, body, max_bytes=limit,
                                                                           from_workflow=True))
        return Invoked(outcome.status, outcome.body, outcome.queued_s)

    async def until_routable(self, function: str, timeout_s: float) -> bool:
        return await self._services.routing.until_routable(function, timeout_s)

    def demand(self, function: str) -> None:
        self._services.spawn(self._services.demand(function))

    def flush_hints(self) -> None:
        self._services.spawn(self._services.flush_activity())

    def wake_controller(self) -> None:
        self._services.spawn(self._services.wake_controller())

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        self._services.spawn(coroutine)
