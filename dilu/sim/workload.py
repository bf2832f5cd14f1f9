"""Cluster workloads: instance starts and deletes over time (``data/workloads/instances-*.txt``).

Each line is a Python literal: ``{'Time': 'YYYY-MM-DD HH:MM:SS', 'Action': 'start'|'delete',
'Instance': {'service_name', 'type': 'training'|'inference'|'llm-inference', 'gpu_num',
'sm_requests', 'sm_limits', 'memory': [GB per GPU]}}``; it is read with ``ast.literal_eval``,
never executed.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
DATA = ROOT / "data"


@dataclass(frozen=True)
class InstanceEvent:
    t: float                  # seconds from the workload's first event
    action: str               # start | delete
    name: str
    kind: str                 # training | inference | llm-inference
    gpus: int
    sm_request: float
    sm_limit: float
    memory_gb: float          # per GPU

    @property
    def cls(self) -> str:
        return "batch" if self.kind == "training" else "latency"


class WorkloadError(ValueError):
    """A workload file that cannot be read; the message names the line."""


def workload_path(name: str) -> Path:
    """``instances-3200`` (or ``instances-3200.txt``, or a path) to the file."""
    path = Path(name)
    if path.is_file():
        return path
    candidate = DATA / "workloads" / (name if name.endswith(".txt") else f"{name}.txt")
    if candidate.is_file():
        return candidate
    known = ", ".join(sorted(p.stem for p in (DATA / "workloads").glob("*.txt")))
    raise WorkloadError(f"no workload {name!r}: give a file, or one of {known}")


def load_workload(name: str) -> list[InstanceEvent]:
    events, start = [], None
    for number, line in enumerate(workload_path(name).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = ast.literal_eval(line)
            spec = item["Instance"]
            at = datetime.strptime(item["Time"], "%Y-%m-%d %H:%M:%S").timestamp()
            start = at if start is None else start
            events.append(InstanceEvent(
                t=at - start, action=str(item["Action"]), name=str(spec["service_name"]), kind=str(spec["type"]),
                gpus=int(spec["gpu_num"]), sm_request=float(spec["sm_requests"]),
                sm_limit=min(1.0, float(spec["sm_limits"])), memory_gb=float(spec["memory"][0])))
        except (ValueError, SyntaxError, KeyError, TypeError, IndexError) as exc:
            raise WorkloadError(f"{name}, line {number}: not a workload event ({type(exc).__name__}: {exc})") from None
        if events[-1].action not in ("start", "delete"):
            raise WorkloadError(f"{name}, line {number}: action {events[-1].action!r} is neither start nor delete")
    if not events:
        raise WorkloadError(f"{name}: no events")
    return sorted(events, key=lambda e: e.t)


def replicate(events: list[InstanceEvent], copies: int) -> list[InstanceEvent]:
    """The workload ``copies`` times over, at the same times (a fleet ``copies`` times larger runs
    it); each copy's instances are named apart."""
    if copies == 1:
        return events
    return sorted((replace(e, name=f"{e.name}~{k}") for e in events for k in range(copies)), key=lambda e: e.t)
