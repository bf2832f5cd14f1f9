"""Scheduler framework: requests, the cluster snapshot, plugin contracts and the pipeline.

Plugins see the whole snapshot at once (numpy arrays, one entry per device), so one decision on
4,000 GPUs is a handful of vectorised passes rather than 4,000 x plugins Python calls. Each plugin
also has a scalar helper (``fits``/``score``) for one device, which the tests hold the vectorised
form to.
- ``Filter.filter(request, snapshot) -> bool array``: which devices may take the request.
- ``Score.score(request, snapshot) -> float array in 0..100``: higher is better.
The pipeline keeps devices every filter passes and ranks them by the score plugins in priority
order (lexicographically: a later plugin only breaks ties of the earlier ones).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Literal, Protocol

import numpy as np

GpuWish = bool | Literal["auto"]


@dataclass(frozen=True)
class PlacementRequest:
    function: str
    memory_bytes: int
    sm_request: float = 0.0
    sm_limit: float = 0.0
    cls: str = "latency"          # latency | batch
    gpu: GpuWish = "auto"
    gpus: int = 1                 # a multi-GPU training job is placed as a gang on one node


@dataclass(frozen=True)
class Device:
    """One schedulable device (a GPU, or a CPU worker) and what is placed on it."""

    id: str
    node: str
    kind: str = "gpu"             # gpu | cpu
    simulated: bool = False       # a GPU of the fake driver: runs only what asks for a GPU outright
    memory_bytes: int = 40 * 2**30
    memory_used: int = 0
    sm_requested: float = 0.0
    sm_limited: float = 0.0
    sm_requested_batch: float = 0.0   # of the above, what batch-class instances hold
    sm_limited_batch: float = 0.0
    functions: frozenset[str] = frozenset()
    latency_functions: frozenset[str] = frozenset()
    batch_functions: frozenset[str] = frozenset()


class Code(Enum):
    SUCCESS = "success"
    UNSCHEDULABLE = "unschedulable"


@dataclass(frozen=True)
class Placement:
    code: Code
    devices: tuple[str, ...] = ()
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.code is Code.SUCCESS


def gib(count: float) -> str:
    """Bytes as GiB, or MiB below one GiB, for messages (pure)."""
    return f"{count / 2**30:.1f} GiB" if count >= 2**30 else f"{count / 2**20:.0f} MiB"


_COLUMNS = ("memory_used", "sm_requested", "sm_limited", "sm_requested_batch", "sm_limited_batch",
            "has_latency", "has_batch")   # the per-device arrays a placement or removal changes


@dataclass(frozen=True)
class ClusterSnapshot:
    """Immutable view of every device, with column arrays for the plugins."""

    devices: tuple[Device, ...]
    is_gpu: np.ndarray = field(repr=False, default=None)
    is_simulated: np.ndarray = field(repr=False, default=None)
    memory_total: np.ndarray = field(repr=False, default=None)
    memory_used: np.ndarray = field(repr=False, default=None)
    sm_requested: np.ndarray = field(repr=False, default=None)
    sm_limited: np.ndarray = field(repr=False, default=None)
    sm_requested_batch: np.ndarray = field(repr=False, default=None)
    sm_limited_batch: np.ndarray = field(repr=False, default=None)
    has_latency: np.ndarray = field(repr=False, default=None)
    has_batch: np.ndarray = field(repr=False, default=None)
    nodes: np.ndarray = field(repr=False, default=None)
    devices_of: dict[str, frozenset[int]] = field(repr=False, default=None)

    @classmethod
    def of(cls, devices: Sequence[Device]) -> ClusterSnapshot:
        devices = tuple(devices)
        node_ids: dict[str, int] = {}
        devices_of: dict[str, set[int]] = {}
        for index, device in enumerate(devices):
            for name in device.functions:
                devices_of.setdefault(name, set()).add(index)
        return cls(
            devices=devices,
            is_gpu=np.array([d.kind == "gpu" for d in devices], dtype=bool),
            is_simulated=np.array([d.simulated for d in devices], dtype=bool),
            memory_total=np.array([d.memory_bytes for d in devices], dtype=np.float64),
            memory_used=np.array([d.memory_used for d in devices], dtype=np.float64),
            sm_requested=np.array([d.sm_requested for d in devices], dtype=np.float64),
            sm_limited=np.array([d.sm_limited for d in devices], dtype=np.float64),
            sm_requested_batch=np.array([d.sm_requested_batch for d in devices], dtype=np.float64),
            sm_limited_batch=np.array([d.sm_limited_batch for d in devices], dtype=np.float64),
            has_latency=np.array([bool(d.latency_functions) for d in devices], dtype=bool),
            has_batch=np.array([bool(d.batch_functions) for d in devices], dtype=bool),
            nodes=np.array([node_ids.setdefault(d.node, len(node_ids)) for d in devices], dtype=np.int64),
            devices_of={name: frozenset(indices) for name, indices in devices_of.items()},
        )

    def __len__(self) -> int:
        return len(self.devices)

    def index(self, device_id: str) -> int:
        return next(i for i, d in enumerate(self.devices) if d.id == device_id)

    def with_placement(self, indices: Sequence[int], request: PlacementRequest) -> ClusterSnapshot:
        """The snapshot after ``request`` lands on ``indices`` (for the next decision in a cycle).
        Only the touched entries change; the arrays are copied, never shared."""
        devices = list(self.devices)
        arrays = {name: getattr(self, name).copy() for name in _COLUMNS}
        devices_of = dict(self.devices_of)
        batch_share = 0.0 if request.cls == "latency" else 1.0
        for i in indices:
            d = devices[i]
            latency = d.latency_functions | ({request.function} if request.cls == "latency" else frozenset())
            batch = d.batch_functions | ({request.function} if request.cls != "latency" else frozenset())
            devices[i] = replace(d, memory_used=d.memory_used + request.memory_bytes,
                                 sm_requested=d.sm_requested + request.sm_request,
                                 sm_limited=d.sm_limited + request.sm_limit,
                                 sm_requested_batch=d.sm_requested_batch + batch_share * request.sm_request,
                                 sm_limited_batch=d.sm_limited_batch + batch_share * request.sm_limit,
                                 functions=d.functions | {request.function},
                                 latency_functions=frozenset(latency), batch_functions=frozenset(batch))
            arrays["memory_used"][i] += request.memory_bytes
            arrays["sm_requested"][i] += request.sm_request
            arrays["sm_limited"][i] += request.sm_limit
            arrays["sm_requested_batch"][i] += batch_share * request.sm_request
            arrays["sm_limited_batch"][i] += batch_share * request.sm_limit
            arrays["has_latency"][i] = bool(latency)
            arrays["has_batch"][i] = bool(batch)
        devices_of[request.function] = devices_of.get(request.function, frozenset()) | frozenset(indices)
        return replace(self, devices=tuple(devices), devices_of=devices_of, **arrays)

    def with_single_device(self, device_index: int) -> ClusterSnapshot:
        """A snapshot of one device (filters then answer for it alone)."""
        return ClusterSnapshot.of([self.devices[device_index]])

    def without(self, device_index: int, request: PlacementRequest) -> ClusterSnapshot:
        """The snapshot after ``request``'s instance on ``device_index`` is gone."""
        d = self.devices[device_index]
        devices = list(self.devices)
        latency = d.latency_functions - {request.function}
        batch = d.batch_functions - {request.function}
        batch_share = 0.0 if request.cls == "latency" else 1.0
        devices[device_index] = replace(
            d, memory_used=max(0, d.memory_used - request.memory_bytes),
            sm_requested=max(0.0, d.sm_requested - request.sm_request),
            sm_limited=max(0.0, d.sm_limited - request.sm_limit),
            sm_requested_batch=max(0.0, d.sm_requested_batch - batch_share * request.sm_request),
            sm_limited_batch=max(0.0, d.sm_limited_batch - batch_share * request.sm_limit),
            functions=d.functions - {request.function}, latency_functions=latency, batch_functions=batch)
        arrays = {name: getattr(self, name).copy() for name in _COLUMNS}
        for name in ("memory_used", "sm_requested", "sm_limited", "sm_requested_batch", "sm_limited_batch"):
            arrays[name][device_index] = getattr(devices[device_index], name)
        arrays["has_latency"][device_index] = bool(latency)
        arrays["has_batch"][device_index] = bool(batch)
        devices_of = dict(self.devices_of)
        devices_of[request.function] = devices_of.get(request.function, frozenset()) - {device_index}
        return replace(self, devices=tuple(devices), devices_of=devices_of, **arrays)


class Filter(Protocol):
    name: str

    def filter(self, request: PlacementRequest, snapshot: ClusterSnapshot) -> np.ndarray:
        """A bool array: True where the device may take the request. Pure."""


class Score(Protocol):
    name: str

    def score(self, request: PlacementRequest, snapshot: ClusterSnapshot) -> np.ndarray:
        """A float array in 0..100, higher is better. Pure."""


class Scheduler:
    """Runs filters, then ranks survivors by the score plugins in priority order."""

    def __init__(self, name: str, filters: Sequence[Filter], scores: Sequence[Score]) -> None:
        self.name = name
        self.filters = list(filters)
        self.scores = list(scores)

    def feasible(self, request: PlacementRequest, snapshot: ClusterSnapshot) -> tuple[np.ndarray, str]:
        mask = np.ones(len(snapshot), dtype=bool)
        rejected = []
        for plugin in self.filters:
            passed = plugin.filter(request, snapshot)
            dropped = int(np.count_nonzero(mask & ~passed))
            if dropped:
                rejected.append(f"{plugin.name} rejected {dropped}")
            mask &= passed
        return mask, ", ".join(rejected)

    def rank(self, request: PlacementRequest, snapshot: ClusterSnapshot) -> np.ndarray:
        """One combined key per device: earlier score plugins dominate later ones."""
        key = np.zeros(len(snapshot), dtype=np.float64)
        for plugin in self.scores:
            key = key * 101.0 + np.clip(np.rint(plugin.score(request, snapshot)), 0, 100)
        return key

    def explain(self, request: PlacementRequest, snapshot: ClusterSnapshot) -> str:
        """Why no device takes ``request``, in plain words with the amounts: for each filter that
        turned devices away, what was asked and the most any of them offered."""
        mask = np.ones(len(snapshot), dtype=bool)
        words = []
        for plugin in self.filters:
            passed = plugin.filter(request, snapshot)
            turned_away = mask & ~passed
            if turned_away.any() and hasattr(plugin, "explain"):
                words.append(plugin.explain(request, snapshot, turned_away))
            mask &= passed
        return "; ".join(words)

    def place(self, request: PlacementRequest, snapshot: ClusterSnapshot) -> Placement:
        if len(snapshot) == 0:
            return Placement(Code.UNSCHEDULABLE, reason="no devices")
        mask, why = self.feasible(request, snapshot)
        count = request.gpus
        if np.count_nonzero(mask) < count:
            plain = self.explain(request, snapshot)
            counted = f"{np.count_nonzero(mask)}/{len(snapshot)} devices fit: {why or 'none'}"
            return Placement(Code.UNSCHEDULABLE, reason=f"{plain} ({counted})" if plain else counted)
        key = np.where(mask, self.rank(request, snapshot), -1.0)
        if count == 1:
            best = int(np.argmax(key))
            return Placement(Code.SUCCESS, (snapshot.devices[best].id,), f"{self.name}: best of "
                             f"{np.count_nonzero(mask)} feasible")
        return self._gang(request, snapshot, mask, key)

    def _gang(self, request: PlacementRequest, snapshot: ClusterSnapshot, mask: np.ndarray,
              key: np.ndarray) -> Placement:
        """All of a multi-GPU job's devices on one node: the node whose best ``gpus`` rank highest."""
        count = request.gpus
        candidates = np.flatnonzero(mask)
        order = np.lexsort((-key[candidates], snapshot.nodes[candidates]))  # by node, best first
        candidates = candidates[order]
        _, starts, counts = np.unique(snapshot.nodes[candidates], return_index=True, return_counts=True)
        starts = starts[counts >= count]
        if len(starts) == 0:
            return Placement(Code.UNSCHEDULABLE, reason=f"no node has {count} devices that fit")
        picks = candidates[starts[:, None] + np.arange(count)[None, :]]
        totals = (key[picks] * (101.0 ** -np.arange(count))[None, :]).sum(axis=1)
        best = picks[int(np.argmax(totals))]
        return Placement(Code.SUCCESS, tuple(snapshot.devices[i].id for i in sorted(best)),
                         f"{self.name}: gang of {count} on one node")
