"""REGISTRY: plugin name -> factory(args) (each factory validates its arguments)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dilu.policy.scheduler.plugins import (
    active,
    affinity,
    best_fit,
    complementary,
    compute_cap,
    device_kind,
    exclusive,
    limits_apart,
    memory_fit,
    priority_pair,
)

Factory = Callable[[dict[str, Any]], Any]

REGISTRY: dict[str, Factory] = {
    device_kind.NAME: device_kind.factory,
    memory_fit.NAME: memory_fit.factory,
    compute_cap.NAME_REQUESTS: compute_cap.requests_factory,
    compute_cap.NAME_LIMITS: compute_cap.limits_factory,
    exclusive.NAME: exclusive.factory,
    best_fit.NAME: best_fit.factory,
    affinity.NAME: affinity.factory,
    complementary.NAME: complementary.factory,
    active.NAME: active.factory,
    limits_apart.NAME: limits_apart.factory,
    priority_pair.NAME: priority_pair.factory,
}


def build(name: str, args: dict[str, Any] | None = None) -> Any:
    try:
        factory = REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown scheduler plugin {name!r}; known: {', '.join(sorted(REGISTRY))}") from None
    return factory(dict(args or {}))
