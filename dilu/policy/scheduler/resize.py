"""Admission of an in-place resize: the same filters as a placement, on the snapshot without the
instances being resized.

A resize of a function's instances is admitted when, with their current slices taken off their
devices, each instance fits again at the new slice (instances on one device are added one after
another). A refusal names the device and the shortfall of each compute cap it breaks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from dilu.policy.scheduler.framework import ClusterSnapshot, PlacementRequest, Scheduler
from dilu.policy.scheduler.plugins.compute_cap import EPSILON, ComputeCap, totals


@dataclass(frozen=True)
class Resize:
    device_id: str
    current: PlacementRequest     # the instance as placed now
    sm_request: float
    sm_limit: float


@dataclass(frozen=True)
class ResizeVerdict:
    ok: bool
    reason: str = ""
    device_id: str | None = None


def admit_resize(scheduler: Scheduler, snapshot: ClusterSnapshot, resizes: Sequence[Resize]) -> ResizeVerdict:
    """Whether every resize fits; pure. Devices missing from the snapshot (a lost worker) are skipped."""
    known = {d.id for d in snapshot.devices}
    resizes = [r for r in resizes if r.device_id in known]
    for resize in resizes:
        snapshot = snapshot.without(snapshot.index(resize.device_id), resize.current)
    for resize in resizes:
        index = snapshot.index(resize.device_id)
        wanted = replace(resize.current, sm_request=resize.sm_request, sm_limit=resize.sm_limit)
        mask, why = scheduler.feasible(wanted, snapshot.with_single_device(index))
        if not mask[0]:
            return ResizeVerdict(False, _shortfall(scheduler, snapshot, index, wanted) or why, resize.device_id)
        snapshot = snapshot.with_placement([index], wanted)
    return ResizeVerdict(True)


def _shortfall(scheduler: Scheduler, snapshot: ClusterSnapshot, index: int, wanted: PlacementRequest) -> str:
    device = snapshot.devices[index]
    broken = []
    for plugin in scheduler.filters:
        if not isinstance(plugin, ComputeCap):
            continue
        total = max(totals(wanted, device, of=plugin.of, batch_yields=plugin.batch_yields))
        if device.kind == "gpu" and total > plugin.cap + EPSILON:
            broken.append(f"compute {plugin.of}s would total {total:.2f} > {plugin.cap:g} "
                          f"(short by {total - plugin.cap:.2f})")
    return f"{device.id}: " + "; ".join(broken) if broken else ""
