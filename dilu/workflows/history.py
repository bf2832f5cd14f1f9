"""What a workflow's recent requests say (pure): folded from one record per finished request.

Every gateway appends its requests' records to the state store, and every keep decision is made
from the records there, so two gateways serving a workflow decide as one would. A record says
when its request arrived, which nodes ran, what the nodes loaded ahead still waited for their
instance, and how long each node's function served it, with the other functions' loads that
overlapped that run. Load times (how long a load asked for took to become routable) are kept
per function, since every workflow that uses a function loads the same thing.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dilu.workflows.interference import interference_s, loading_costs
from dilu.workflows.spec import WorkflowSpec

HISTORY = 50              # recent requests per workflow that branch probabilities and gaps come from
MEAN_WEIGHT = 0.3         # of the newest sample in the running means (waits, service times)
LEADS_KEPT = 5            # the newest loads of a function its lead estimate comes from
REMEASURE_AFTER = 30      # requests after which a slowdown measured beside loads is measured again


@dataclass(frozen=True)
class Served:
    """A node's function served the request for ``seconds`` (its wait for an instance left
    out); ``beside``: other functions' loads that overlapped that run, seconds of overlap each."""

    function: str
    seconds: float
    beside: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RequestRecord:
    """One finished request of a workflow (answered or failed)."""

    arrived_at: float                               # unix time
    ran: dict[str, bool] = field(default_factory=dict)      # node: ran (False: skipped); undecided absent
    waits: dict[str, float] = field(default_factory=dict)   # node loaded ahead and run: its wait, s
    served: tuple[Served, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        return {"arrived_at": self.arrived_at, "ran": self.ran, "waits": self.waits,
                "served": [[s.function, s.seconds, s.beside] for s in self.served]}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> RequestRecord:
        return cls(float(data["arrived_at"]), {str(k): bool(v) for k, v in data.get("ran", {}).items()},
                   {str(k): float(v) for k, v in data.get("waits", {}).items()},
                   tuple(Served(str(f), float(s), {str(k): float(v) for k, v in b.items()})
                         for f, s, b in data.get("served", ())))


@dataclass(frozen=True)
class WorkflowHistory:
    """What the records say, as the keep-alive and the loading plan use it."""

    arrivals: tuple[float, ...] = ()
    ran: dict[str, tuple[bool, ...]] = field(default_factory=dict)     # node: newest last
    waits: dict[str, float] = field(default_factory=dict)              # node: running mean
    alone: dict[str, float] = field(default_factory=dict)              # function: running mean, no load beside
    beside: dict[str, float] = field(default_factory=dict)             # function: ... beside loads (fresh only)
    overlap: dict[str, float] = field(default_factory=dict)            # function: its load beside node runs, s
    served: dict[str, tuple[float, ...]] = field(default_factory=dict)  # function: its runs' seconds

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in itertools.pairwise(self.arrivals)]

    @property
    def last_arrival(self) -> float | None:
        return self.arrivals[-1] if self.arrivals else None

    def probability(self, spec: WorkflowSpec) -> dict[str, float]:
        """How often each node ran in the recent requests that decided it (0 when none did)."""
        return {node.name: sum(seen) / len(seen) if (seen := self.ran.get(node.name)) else 0.0
                for node in spec.nodes}

    def exec_s(self, function: str) -> float | None:
        """The median of what ``function`` took serving the workflow lately (None: never ran)."""
        samples = self.served.get(function)
        return statistics.median(samples) if samples else None

    def loading_cost(self, spec: WorkflowSpec) -> tuple[dict[str, float], frozenset[str]]:
        """What loading each node in the slack was measured to cost a request lately (its wait,
        and its share of the slowdown of the nodes running beside the loads, by how long its load
        overlapped them), and the nodes whose cost is unknown until a request runs with nothing
        loading beside it."""
        blame = {n.name: self.overlap[n.function] for n in spec.nodes if n.function in self.overlap}
        alone = {n.name: self.alone[n.function] for n in spec.nodes if n.function in self.alone}
        beside = {n.name: self.beside[n.function] for n in spec.nodes if n.function in self.beside}
        slowdown = interference_s(spec, alone, beside)
        if slowdown is None:
            return loading_costs(self.waits, 0.0, {}), frozenset(self.waits) | frozenset(blame)
        return loading_costs(self.waits, slowdown, blame), frozenset()


def fold(records: Iterable[RequestRecord]) -> WorkflowHistory:
    """The history of a workflow's records, taken in order of arrival (the newest ``HISTORY``)."""
    ordered = sorted(records, key=lambda r: r.arrived_at)[-HISTORY:]
    ran: dict[str, list[bool]] = {}
    waits: dict[str, float] = {}
    alone: dict[str, float] = {}
    beside: dict[str, tuple[float, int]] = {}     # ... and at which request it was last measured
    overlap: dict[str, float] = {}
    served: dict[str, list[float]] = {}
    for index, record in enumerate(ordered, start=1):
        for node, did in record.ran.items():
            ran.setdefault(node, []).append(did)
        for node, seconds in record.waits.items():
            waits[node] = _running_mean(waits.get(node), seconds)
        for run in record.served:
            served.setdefault(run.function, []).append(run.seconds)
            if not run.beside:
                alone[run.function] = _running_mean(alone.get(run.function), run.seconds)
                continue
            known = beside.get(run.function)
            beside[run.function] = (_running_mean(known[0] if known else None, run.seconds), index)
            for other, seconds in run.beside.items():
                overlap[other] = _running_mean(overlap.get(other), seconds)
        # A slowdown measured long ago is stale: no slowdown counts until it is measured again.
        beside = {f: (mean, at) for f, (mean, at) in beside.items() if index - at <= REMEASURE_AFTER}
    return WorkflowHistory(arrivals=tuple(r.arrived_at for r in ordered),
                           ran={node: tuple(seen) for node, seen in ran.items()}, waits=waits, alone=alone,
                           beside={f: mean for f, (mean, _) in beside.items()}, overlap=overlap,
                           served={f: tuple(s) for f, s in served.items()})


def lead_estimate(samples: Sequence[float]) -> float | None:
    """How long a load takes to become routable, from the newest samples: the second longest
    (the longest with fewer than three). A load that shows up late costs a request the
    difference, one that is early only its memory for that long, so the estimate leans long;
    but not to the very longest, which can be one load that waited on something unrelated (a
    load asked for and then no longer needed, which only became routable at the next one) and
    would otherwise move every later load far ahead of need."""
    ordered = sorted(samples[-LEADS_KEPT:])
    if not ordered:
        return None
    return ordered[-2] if len(ordered) >= 3 else ordered[-1]


def _running_mean(known: float | None, sample: float) -> float:
    return sample if known is None else known + MEAN_WEIGHT * (sample - known)
