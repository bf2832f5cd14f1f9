"""What this gateway has answered, per function and version: counts and durations in the shape
of Triton's model statistics (``/v2/models/{name}/stats`` and gRPC ``ModelStatistics`` render
them), kept by the invoker.

The stages as the gateway sees them: ``queue``, the wait for a ready instance (a cold start);
``compute_input``, reading and checking the request; ``compute_infer``, the instance's round
trip (its own queue and batch included); ``compute_output``, the rest until the answer is handed
back. A request counts once in ``inference_count`` and ``execution_count`` (the gateway does not
see which requests an instance ran as one batch; ``batch_stats`` groups requests by the batch
size their instance reported). Per gateway, since the last start.

Recording is on every request's path, so it is plain arithmetic on a list of counters.
"""

from __future__ import annotations

from dataclasses import dataclass, field

VERSIONS_KEPT = 4     # per function: the latest versions' statistics (redeploys add versions)
STAGES = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")
SUCCESS, FAIL, QUEUE, INPUT, INFER, OUTPUT = (2 * i for i in range(len(STAGES)))   # count at i, ns at i + 1
MAX_BATCH = 1 << 16


def _duration(count: int, ns: int) -> dict[str, int]:
    return {"count": count, "ns": ns}


@dataclass
class ModelStats:
    counters: list[int] = field(default_factory=lambda: [0] * (2 * len(STAGES)))
    batches: dict[int, list[int]] = field(default_factory=dict)   # size -> input, infer, output: count, ns
    last_inference_ms: int = 0

    def to_wire(self, name: str, version: str) -> dict:
        """Triton's JSON of one model's statistics."""
        c = self.counters
        inference = {stage: _duration(c[2 * i], c[2 * i + 1]) for i, stage in enumerate(STAGES)}
        inference |= {"cache_hit": _duration(0, 0), "cache_miss": _duration(0, 0)}
        return {"name": name, "version": version, "last_inference": self.last_inference_ms,
                "inference_count": c[SUCCESS], "execution_count": c[SUCCESS], "inference_stats": inference,
                "batch_stats": [{"batch_size": size, "compute_input": _duration(b[0], b[1]),
                                 "compute_infer": _duration(b[2], b[3]), "compute_output": _duration(b[4], b[5])}
                                for size, b in sorted(self.batches.items())],
                "memory_usage": []}


class InvocationStats:
    """Per (function, version); times are ``time.perf_counter`` readings, 0.0 for a stage the
    request did not reach; the caller passes the wall clock (``now_ms``)."""

    def __init__(self) -> None:
        self._models: dict[str, dict[int, ModelStats]] = {}

    def _stats(self, function: str, version: int) -> ModelStats:
        versions = self._models.get(function)
        if versions is None:
            versions = self._models[function] = {}
        stats = versions.get(version)
        if stats is None:
            stats = versions[version] = ModelStats()
            for old in sorted(versions)[:-VERSIONS_KEPT]:
                del versions[old]
        return stats

    def record(self, function: str, version: int, ok: bool, started: float, checked: float, routed: float,
               answered: float, ended: float, batch_size: str | None, now_ms: int) -> None:
        stats = self._stats(function, version)
        c = stats.counters
        if not ok:
            c[FAIL] += 1
            c[FAIL + 1] += int((ended - started) * 1e9)
            return
        checked = checked or ended
        c[SUCCESS] += 1
        c[SUCCESS + 1] += int((ended - started) * 1e9)
        stats.last_inference_ms = now_ms
        input_ns = int((checked - started) * 1e9)
        c[INPUT] += 1
        c[INPUT + 1] += input_ns
        if routed:
            c[QUEUE] += 1
            c[QUEUE + 1] += int((routed - checked) * 1e9)
        if answered:
            infer_ns, output_ns = int((answered - routed) * 1e9), int((ended - answered) * 1e9)
            c[INFER] += 1
            c[INFER + 1] += infer_ns
            c[OUTPUT] += 1
            c[OUTPUT + 1] += output_ns
            size = int(batch_size) if batch_size and batch_size.isdigit() else 0
            if 0 < size <= MAX_BATCH:
                batch = stats.batches.get(size)
                if batch is None:
                    batch = stats.batches[size] = [0] * 6
                batch[0] += 1
                batch[1] += input_ns
                batch[2] += 1
                batch[3] += infer_ns
                batch[4] += 1
                batch[5] += output_ns

    def of(self, function: str) -> dict[int, ModelStats]:
        """The kept versions' statistics of ``function`` (empty when it answered nothing here)."""
        return dict(self._models.get(function, {}))

    def forget(self, function: str) -> None:
        self._models.pop(function, None)
