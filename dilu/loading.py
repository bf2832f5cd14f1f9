"""Loading stages of an instance's cold start, and their running estimates per function version (pure).

From the worker's start call to ready: ``fetch`` (the worker copies the function's weights
artifact from the store into its host's cache, once per host), ``spawn`` (the process or
container comes up), ``runtime`` (interpreter and the instance server's imports, or taking over a
pre-started process), ``imports`` (the handler's module, with its libraries: torch and the like),
``device`` (on a GPU, creating the CUDA context), ``map`` (mapping the weights file), ``copy``
(the weights from the mapped pages to the GPU), ``load`` (the handler's ``load()``), ``warmup``
(the spec's warm-up requests: the first calls' allocations and lazy initialisation, and on the
CPU the first touch of mapped weights), ``ready`` (the server's last steps). Stages an instance
did not go through (no GPU, no weights, no warm-up) are left out. Each estimate is an
exponentially weighted mean of the starts seen.
"""

from __future__ import annotations

from typing import Any

STAGES = ("fetch", "spawn", "runtime", "imports", "device", "map", "copy", "load", "warmup", "ready")
# stage -> (mark it starts at, mark it ends at); "requested" is the worker's start call.
_BOUNDS = {"fetch": ("requested", "fetched"), "spawn": ("fetched", "process_start"),
           "runtime": ("process_start", "serving"), "imports": ("serving", "handler_imported"),
           "device": ("handler_imported", "device_ready"), "map": ("device_ready", "mapped"),
           "copy": ("mapped", "copied"), "load": ("copied", "loaded"), "warmup": ("loaded", "warmed"),
           "ready": ("warmed", "ready")}
# Marks of optional stages: when absent, the stage was skipped and its end is its start (in
# this order, as one stands in for the next).
_OPTIONAL = {"fetched": "requested", "device_ready": "handler_imported", "mapped": "device_ready",
             "copied": "mapped", "warmed": "loaded"}
WEIGHT = 0.3   # of the newest start in the running mean


def stages_from_marks(requested_at: float, marks: dict[str, float]) -> dict[str, float]:
    """Seconds per stage from the instance's start-up marks (wall-clock times); stages whose
    marks are missing (skipped, or not reported) are left out, negative spans (clock steps) count
    as 0."""
    times = {"requested": requested_at, **{k: float(v) for k, v in marks.items() if isinstance(v, (int, float))}}
    skipped = set()
    for mark, instead in _OPTIONAL.items():
        if mark not in times and instead in times:
            times[mark] = times[instead]
            skipped.add(mark)
    return {stage: round(max(0.0, times[end] - times[start]), 4)
            for stage, (start, end) in _BOUNDS.items() if start in times and end in times and end not in skipped}


def update_estimates(current: dict[str, Any] | None, sample: dict[str, float]) -> dict[str, Any]:
    """``{stage: {"mean_s", "samples"}}`` after one more start."""
    result = {k: dict(v) for k, v in (current or {}).items()}
    for stage, seconds in sample.items():
        entry = result.get(stage)
        if entry is None:
            result[stage] = {"mean_s": seconds, "samples": 1}
        else:
            entry["mean_s"] = round(entry["mean_s"] + WEIGHT * (seconds - entry["mean_s"]), 4)
            entry["samples"] += 1
    return result


def total_s(estimates: dict[str, Any] | None) -> float | None:
    """The estimated cold start (sum of the stages' means), None before any start was seen."""
    if not estimates:
        return None
    return round(sum(entry["mean_s"] for entry in estimates.values()), 4)
