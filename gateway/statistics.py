"""What this gateway has answered, per function and version: counts and durations in the shape
of Triton's model statistics (``/v2/models/{name}/stats`` and gRPC ``ModelStatistics`` render
them), kept by the invoker.

The stages as the gateway sees them: ``queue``, the wait for a ready instance (a cold start);
``compute_input``, reading and checking the request; ``compute_infer``, the instance's round
trip (its own queue and batch included); ``compute_output``, the rest until the answer is handed
back. A request counts once in ``inference_count`` and ``execution_count`` (the gateway does not
see which requests an instance ran as one batch; ``batch_stats`` groups requests by the batch
size their instance reported). Per gateway, since the last start.
"""

from __future__ import annotations

from dataclasses import dataclass, field

VERSIONS_KEPT = 4     # per function: the latest versions' statistics (redeploys add versions)


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int) -> None:
        self.count += 1
        self.ns += max(ns, 0)

    def to_wire(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class Stages:
    """One request's times in ns (None: the request did not reach that stage)."""

    total: int
    input: int
    queue: int | None = None
    infer: int | None = None
    output: int | None = None
    batch_size: int | None = None


@dataclass
class ModelStats:
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    batches: dict[int, tuple[Duration, Duration, Duration]] = field(default_factory=dict)
    last_inference_ms: int = 0

    def to_wire(self, name: str, version: str) -> dict:
        """Triton's JSON of one model's statistics."""
        stages = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")
        inference = {stage: getattr(self, stage).to_wire() for stage in stages}
        inference |= {"cache_hit": Duration().to_wire(), "cache_miss": Duration().to_wire()}
        return {"name": name, "version": version, "last_inference": self.last_inference_ms,
                "inference_count": self.success.count, "execution_count": self.success.count,
                "inference_stats": inference,
                "batch_stats": [{"batch_size": size, "compute_input": first.to_wire(),
                                 "compute_infer": infer.to_wire(), "compute_output": output.to_wire()}
                                for size, (first, infer, output) in sorted(self.batches.items())],
                "memory_usage": []}


class InvocationStats:
    """Per (function, version); the caller passes the clock's reading (``now_ms``)."""

    def __init__(self) -> None:
        self._models: dict[str, dict[int, ModelStats]] = {}

    def record(self, function: str, version: int, ok: bool, stages: Stages, now_ms: int) -> None:
        versions = self._models.setdefault(function, {})
        stats = versions.get(version)
        if stats is None:
            stats = versions[version] = ModelStats()
            for old in sorted(versions)[:-VERSIONS_KEPT]:
                del versions[old]
        if not ok:
            stats.fail.add(stages.total)
            return
        stats.success.add(stages.total)
        stats.last_inference_ms = now_ms
        stats.compute_input.add(stages.input)
        if stages.queue is not None:
            stats.queue.add(stages.queue)
        if stages.infer is not None:
            stats.compute_infer.add(stages.infer)
        if stages.output is not None:
            stats.compute_output.add(stages.output)
        if stages.batch_size is not None and stages.infer is not None and 0 < stages.batch_size <= 1 << 16:
            batch = stats.batches.setdefault(stages.batch_size, (Duration(), Duration(), Duration()))
            batch[0].add(stages.input)
            batch[1].add(stages.infer)
            batch[2].add(stages.output or 0)

    def of(self, function: str) -> dict[int, ModelStats]:
        """The kept versions' statistics of ``function`` (empty when it answered nothing here)."""
        return dict(self._models.get(function, {}))

    def forget(self, function: str) -> None:
        self._models.pop(function, None)
