"""Builds the scheduler's immutable ClusterSnapshot from live workers and active instances, and
checks resizes against it (shared by the controller's placements and the gateway's resizes)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from dilu.db.models import FunctionRow, InstanceRow
from dilu.messages import ACTIVE_STATES, InstanceRole, WorkerInfo
from dilu.policy.scheduler import ClusterSnapshot, Device, PlacementRequest, Scheduler
from dilu.policy.scheduler.resize import Resize, ResizeVerdict, admit_resize
from dilu.slices import ComputeSlice


def build_snapshot(workers: Sequence[WorkerInfo], instances: Iterable[InstanceRow],
                   functions: Iterable[FunctionRow]) -> ClusterSnapshot:
    """One device per live worker (a GPU or the CPU), with what its active instances hold."""
    classes = {f.name: f.typed_spec.function_class for f in functions}
    on: dict[str, list[InstanceRow]] = {}
    for row in instances:
        if row.state in ACTIVE_STATES | {"stopping"}:
            on.setdefault(row.worker_id, []).append(row)
    devices = []
    for info in workers:
        rows = on.get(info.id, [])
        latency = frozenset(r.function for r in rows if classes.get(r.function, "latency") == "latency")
        batch = frozenset(r.function for r in rows if classes.get(r.function, "latency") != "latency")
        devices.append(Device(
            id=info.id, node=info.host, kind=info.device.kind, simulated=info.device.fake,
            memory_bytes=info.device.memory_bytes,
            memory_used=sum(r.memory_bytes for r in rows), sm_requested=sum(r.sm_request or 0.0 for r in rows),
            sm_limited=sum(r.sm_limit or 0.0 for r in rows),
            sm_requested_batch=sum(r.sm_request or 0.0 for r in rows if r.function in batch),
            sm_limited_batch=sum(r.sm_limit or 0.0 for r in rows if r.function in batch), functions=latency | batch,
            latency_functions=latency, batch_functions=batch))
    return ClusterSnapshot.of(devices)


def check_resize(scheduler: Scheduler, workers: Sequence[WorkerInfo], instances: Sequence[InstanceRow],
                 functions: Sequence[FunctionRow], function: FunctionRow, compute: ComputeSlice) -> ResizeVerdict:
    """Whether ``function``'s active serving instances may all take the new slice where they are."""
    spec = function.typed_spec
    mine = [r for r in instances
            if r.function == function.name and r.role == InstanceRole.SERVE and r.state in ACTIVE_STATES]
    resizes = [Resize(r.worker_id, PlacementRequest(function.name, r.memory_bytes, r.sm_request or 0.0,
                                                    r.sm_limit or 0.0, spec.function_class,
                                                    spec.resources.gpu), compute.request, compute.limit) for r in mine]
    return admit_resize(scheduler, build_snapshot(workers, instances, functions), resizes)
