"""Service time of the simulated inference functions, from the measured GPU profiles.

A model's batch latency and throughput at any compute share interpolate its profile table
(``data/profiles``, through the profiler's own ``TableRunner``); below the table's smallest
share a batch takes proportionally longer. Each model's slice (request, limit) and batch come
from the live profiler's search against that table; its SLO is ``SLO_FACTOR`` times its batch-1
latency on a whole GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from dilu.policy.profiler import Profile, TableRunner, hybrid_growth_search
from dilu.sim.workload import DATA

MODELS = ("bert_base", "roberta_large", "gpt2_large", "resnet152")
SLO_FACTOR = 6.0
MEMORY_GB = {"bert_base": 5, "roberta_large": 6, "gpt2_large": 8, "resnet152": 4, "llama2": 28}


@dataclass(frozen=True)
class ModelProfile:
    name: str
    table: TableRunner
    slo_s: float
    profile: Profile           # what the profiler chose: request, limit, batch, throughput at the request
    memory_gb: float
    bound: int = 32            # the spec's max_batch_size, which the profile's search stayed within
    generates: bool = False    # a text generator: each request streams tokens, one per batch step

    def occupancy_target(self) -> int | None:
        """In flight per instance before another is added, as ``FunctionSpec.occupancy_target``
        without a ``scaling.target_concurrency``: a generator's bound, else None."""
        return self.bound if self.generates else None

    def latency(self, batch: int, share: float) -> float:
        """Seconds for one batch of ``batch`` (a measured batch size) at compute ``share``."""
        percent = min(100.0, max(share * 100.0, 1.0))
        measured = sorted(self.table.points[batch])
        floor = measured[0]
        if percent < floor:   # below the table: the work takes proportionally longer
            return self.table.points[batch][floor].latency_s * floor / percent
        low = max(s for s in measured if s <= percent)
        high = min((s for s in measured if s >= percent), default=low)
        a, b = self.table.points[batch][low], self.table.points[batch][high]
        weight = 0.0 if high == low else (percent - low) / (high - low)
        return a.latency_s + weight * (b.latency_s - a.latency_s)

    def batch_for(self, waiting: int, up_to: int | None = None) -> int:
        """The batch the runtime forms with ``waiting`` requests queued: the largest measured
        batch size not above it, up to ``up_to`` (default: the profiled batch)."""
        cap = self.profile.batch if up_to is None else up_to
        fitting = [b for b in self.table.batches if b <= max(1, min(waiting, cap))]
        return max(fitting) if fitting else self.table.batches[0]

    def capacity(self, share: float) -> float:
        """Requests per second one instance serves at ``share`` with its profiled batch."""
        return self.profile.batch / self.latency(self.profile.batch, share)


@cache
def load_model(name: str) -> ModelProfile:
    if name not in MEMORY_GB:
        raise ValueError(f"no profile for model {name!r}; known: {', '.join(MEMORY_GB)}")
    table = TableRunner.from_csv(DATA / "profiles" / f"{name}.csv")
    slo = SLO_FACTOR * table.trial(1, 100).latency_s
    # The table gives the time of one batch; a request may also wait for the batch in progress,
    # so the search targets half the SLO.
    return ModelProfile(name=name, table=table, slo_s=slo, profile=hybrid_growth_search(table, slo / 2, max_batch=32),
                        memory_gb=MEMORY_GB[name])
