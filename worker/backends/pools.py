"""A worker's runtime pools: one per kind of instance process and set of preloaded modules.

The plain pool of each kind (CPU instances, instances under the GPU shim) imports the instance
server only and is kept from the worker's start. A pool that also preloads heavy modules
(``DILU_SPARE_PRELOAD``: torch) exists only while it is wanted (``worker.pool.PreloadDemand``):
it starts with the first instance whose code imports them (``worker.backends.imports``), which
itself takes a plain spare and imports them on its own; its spares are forks of its zygote, once
that is done importing; and it ends ``keep_s`` after the last such instance ended. A worker
serving no torch function holds no torch in memory.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from worker.backends.spares import Spare, SpareLaunch, SparePool, exec_time, pool_key
from worker.pool import PoolSizer, PreloadDemand

PoolKey = tuple[tuple[tuple[str, str], ...], tuple[str, ...]]   # (exec-time variables, preloaded modules)


class RuntimePools:
    """The pools, keyed by exec-time variables and preloaded modules."""

    def __init__(self, launch_for: Callable[[dict[str, str], tuple[str, ...]], SpareLaunch],
                 bounds: tuple[int, int], keep_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._launch_for = launch_for
        self.bounds = bounds
        self._pools: dict[PoolKey, SparePool] = {}
        self._demand = PreloadDemand(keep_s)
        self._clock = clock

    @staticmethod
    def key(exec_env: dict[str, str] | None, preload: tuple[str, ...] = ()) -> PoolKey:
        return pool_key(exec_time(exec_env)), tuple(preload)

    def prepare(self, exec_env: dict[str, str] | None, preload: tuple[str, ...] = ()) -> None:
        """Starts the pool for these exec-time variables and preloads; idempotent."""
        key = self.key(exec_env, preload)
        if key in self._pools or self.bounds[1] == 0:
            return
        self._pools[key] = SparePool(self._launch_for(exec_time(exec_env), tuple(preload)), PoolSizer(*self.bounds),
                                     wait_for_zygote=bool(preload))

    def get(self, exec_env: dict[str, str] | None = None, preload: tuple[str, ...] = ()) -> SparePool | None:
        return self._pools.get(self.key(exec_env, preload))

    def take(self, exec_env: dict[str, str] | None, needed: tuple[str, ...], instance_id: str) -> Spare | None:
        """A spare for an instance whose code imports ``needed`` (of the preloadable modules): one
        of their pool (started now if it was not), else a plain one; None when none waits."""
        if needed:
            self._demand.started(self.key(exec_env, needed), instance_id)
            self.prepare(exec_env, needed)
            pool = self.get(exec_env, needed)
            spare = pool.take() if pool is not None else None
            if spare is not None:
                return spare
        pool = self.get(exec_env)
        return pool.take() if pool is not None else None

    def ended(self, instance_id: str) -> None:
        """An instance ended: the pool of its preloads may be let go, in time."""
        self._demand.ended(instance_id, self._clock())

    def maintain(self) -> None:
        """Ends the preloading pools no longer wanted; brings the others to their targets."""
        now = self._clock()
        for key in [key for key in self._pools if key[1] and not self._demand.wanted(key, now)]:
            self._pools.pop(key).close()
        for pool in self._pools.values():
            pool.refill()

    def status(self, exec_env: dict[str, str] | None) -> dict | None:
        """The plain pool's status for these variables, ``preloaded`` naming what the live
        preloading pools beside it import."""
        pool = self.get(exec_env)
        if pool is None:
            return None
        variables = self.key(exec_env)[0]
        preloaded = [module for (env, modules) in self._pools if env == variables for module in modules]
        return pool.status(list(dict.fromkeys(preloaded)))

    def close(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        self.bounds = (0, 0)
        for pool in pools:
            pool.close()
