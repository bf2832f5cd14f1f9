"""Level one: placement over time. An instance workload's starts and deletes replayed through a
live scheduler on N nodes x G GPUs; what it shows is how many GPUs each policy keeps busy and how
much of them goes unused.

A start that fits nowhere waits (first come, first served) until a delete frees room; a delete
of a waiting instance drops it. Fragmentation, on the GPUs in use: compute, the share no
instance has asked for (1 - requests, at least 0); memory, the memory no instance holds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from dilu.policy.scheduler import ClusterSnapshot, Device, PlacementRequest, Scheduler
from dilu.sim.workload import InstanceEvent

GiB = 2**30


@dataclass
class PlacementResult:
    times: list[float] = field(default_factory=list)          # seconds, one sample per event time
    active_gpus: list[int] = field(default_factory=list)
    compute_fragmentation: list[float] = field(default_factory=list)
    memory_fragmentation: list[float] = field(default_factory=list)
    placed: int = 0
    waited: int = 0           # starts that had to wait for room
    never_placed: int = 0     # deleted (or left at the end) before they ever fitted
    wait_s: list[float] = field(default_factory=list)

    @property
    def peak_gpus(self) -> int:
        return max(self.active_gpus, default=0)

    @property
    def gpu_hours(self) -> float:
        """The area under active GPUs over time (a step function), in GPU-hours."""
        if len(self.times) < 2:
            return 0.0
        steps = np.diff(np.asarray(self.times))
        return float(np.dot(steps, np.asarray(self.active_gpus[:-1], dtype=float)) / 3600.0)

    def mean(self, series: list[float]) -> float:
        """Time-weighted mean of a series over the run."""
        if len(self.times) < 2:
            return float(series[0]) if series else 0.0
        steps = np.diff(np.asarray(self.times))
        return float(np.dot(steps, np.asarray(series[:-1], dtype=float)) / max(steps.sum(), 1e-9))


def request_of(event: InstanceEvent) -> PlacementRequest:
    return PlacementRequest(event.name, int(event.memory_gb * GiB), event.sm_request, event.sm_limit, event.cls,
                            gpu=True, gpus=event.gpus)


def empty_cluster(nodes: int, gpus_per_node: int, gpu_memory_gb: float) -> ClusterSnapshot:
    return ClusterSnapshot.of([Device(f"gpu{i}", f"node{i // gpus_per_node}", memory_bytes=int(gpu_memory_gb * GiB))
                               for i in range(nodes * gpus_per_node)])


@dataclass(frozen=True)
class PeakBound:
    """A lower bound on the GPUs any placement needs at the workload's busiest moment."""
    gpus: int
    at_s: float
    over_half_memory: int     # GPU slots holding more than half a GPU's memory: no two share a GPU
    by_memory: int            # all memory held, in whole GPUs
    by_compute: int           # all compute requested, in whole GPUs


def peak_bound(events: list[InstanceEvent], gpu_memory_gb: float) -> PeakBound:
    """The highest, over the workload's times, of three bounds no placement can beat: slots over
    half a GPU's memory each need their own GPU; the memory and the compute requested, summed."""
    live: dict[str, InstanceEvent] = {}
    big = memory = compute = 0.0
    best = PeakBound(0, 0.0, 0, 0, 0)
    for position, event in enumerate(events):
        sign = 1 if event.action == "start" and event.name not in live else \
            -1 if event.action != "start" and event.name in live else 0
        if sign:
            e = event if sign > 0 else live.pop(event.name)
            if sign > 0:
                live[event.name] = event
            big += sign * e.gpus * (e.memory_gb > gpu_memory_gb / 2)
            memory += sign * e.gpus * e.memory_gb
            compute += sign * e.gpus * e.sm_request
        if position + 1 == len(events) or events[position + 1].t != event.t:
            bound = PeakBound(0, event.t, round(big), math.ceil(memory / gpu_memory_gb - 1e-9),
                              math.ceil(compute - 1e-9))
            bound = replace(bound, gpus=max(bound.over_half_memory, bound.by_memory, bound.by_compute))
            if bound.gpus > best.gpus:
                best = bound
    return best


def _sample(snapshot: ClusterSnapshot, result: PlacementResult, at: float) -> None:
    busy = snapshot.memory_used > 0
    count = int(np.count_nonzero(busy))
    result.times.append(at)
    result.active_gpus.append(count)
    if count:
        result.compute_fragmentation.append(float(np.mean(np.clip(1.0 - snapshot.sm_requested[busy], 0.0, 1.0))))
        used = snapshot.memory_used[busy].sum() / snapshot.memory_total[busy].sum()
        result.memory_fragmentation.append(float(1.0 - used))
    else:
        result.compute_fragmentation.append(0.0)
        result.memory_fragmentation.append(0.0)


def simulate_placement(events: list[InstanceEvent], scheduler: Scheduler, *, nodes: int = 1000,
                       gpus_per_node: int = 4, gpu_memory_gb: float = 40.0,
                       progress: Callable[[int], None] | None = None) -> PlacementResult:
    """Replays ``events`` (sorted by time) through ``scheduler``; ``progress(n)`` after each n events."""
    snapshot = empty_cluster(nodes, gpus_per_node, gpu_memory_gb)
    index = {device.id: i for i, device in enumerate(snapshot.devices)}
    placed: dict[str, tuple[PlacementRequest, tuple[int, ...]]] = {}
    waiting: dict[str, tuple[PlacementRequest, float]] = {}   # insertion order = arrival order
    result = PlacementResult()

    def try_place(request: PlacementRequest) -> bool:
        nonlocal snapshot
        decision = scheduler.place(request, snapshot)
        if not decision.ok:
            return False
        where = tuple(index[d] for d in decision.devices)
        snapshot = snapshot.with_placement(where, request)
        placed[request.function] = (request, where)
        result.placed += 1
        return True

    done = 0
    for position, event in enumerate(events):
        if event.action == "start":
            if event.name not in placed and event.name not in waiting and not try_place(request_of(event)):
                waiting[event.name] = (request_of(event), event.t)
                result.waited += 1
        elif event.name in waiting:
            del waiting[event.name]
            result.never_placed += 1
        elif event.name in placed:
            request, where = placed.pop(event.name)
            for device in where:
                snapshot = snapshot.without(device, request)
            for name, (queued, since) in list(waiting.items()):   # room freed: the oldest first
                if try_place(queued):
                    del waiting[name]
                    result.wait_s.append(event.t - since)
        last_at_this_time = position + 1 == len(events) or events[position + 1].t != event.t
        if last_at_this_time:
            _sample(snapshot, result, event.t)
        done += 1
        if progress is not None and done % 500 == 0:
            progress(500)
    if progress is not None:
        progress(done % 500)
    result.never_placed += len(waiting)
    return result
