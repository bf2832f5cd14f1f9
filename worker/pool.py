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
