"""How many pre-started runtime processes (spares) a worker keeps (pure).

A spare has the interpreter up, the instance server and the common libraries (``torch`` by
default) imported, and waits to be specialised into an instance (its code and weights loaded).
The pool holds at least ``minimum`` spares, and one more for each spare taken in the last
``window_s`` seconds (a burst of cold starts is likely to continue), never more than ``maximum``:
each spare holds the memory of its imports.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

WINDOW_S = 60.0


@dataclass
class PoolSizer:
    minimum: int
    maximum: int
    window_s: float = WINDOW_S
    _taken: deque[float] = field(default_factory=deque)

    def __post_init__(self) -> None:
        if not 0 <= self.minimum <= self.maximum:
            raise ValueError(f"runtime pool bounds must satisfy 0 <= minimum <= maximum, got {self.minimum}, "
                             f"{self.maximum}")

    def took(self, now: float) -> None:
        self._taken.append(now)

    def target(self, now: float) -> int:
        while self._taken and now - self._taken[0] > self.window_s:
            self._taken.popleft()
        return min(self.maximum, self.minimum + len(self._taken))


@dataclass
class PreloadDemand:
    """Whether a preloading pool (torch, say) is still wanted (pure; the clock passed in).

    Such a pool is wanted while an instance that needs its imports runs on the worker, and for
    ``keep_s`` after the last one ended: a function scaled to zero between bursts finds its
    warm spares at its next cold start, and a worker that stopped serving it gives back the
    memory those spares hold."""

    keep_s: float
    _running: dict[tuple, set[str]] = field(default_factory=dict)
    _last_end: dict[tuple, float] = field(default_factory=dict)

    def started(self, key: tuple, instance_id: str) -> None:
        self._running.setdefault(key, set()).add(instance_id)

    def ended(self, instance_id: str, now: float) -> None:
        for key, running in self._running.items():
            if instance_id in running:
                running.discard(instance_id)
                self._last_end[key] = now

    def wanted(self, key: tuple, now: float) -> bool:
        if self._running.get(key):
            return True
        last = self._last_end.get(key)
        return last is not None and now - last < self.keep_s
