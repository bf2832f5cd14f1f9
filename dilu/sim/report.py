"""Running the comparison and writing it down: metrics by policy as JSON and CSV, time series as
CSV, PNG plots, and the table ``dilu simulate`` prints.

``metrics.json`` is one object per policy (keyed by its name), each with these metrics:

| metric | meaning |
|---|---|
| `peak_gpus`, `gpu_hours` | placement: most GPUs in use at once; GPU-hours in use over the workload |
| `compute_fragmentation` | placement: time-weighted mean, on GPUs in use, of the compute share nobody requested (0-1) |
| `memory_fragmentation` | placement: the same, of the memory nobody holds (0-1) |
| `placement_waits`, `never_placed` | placement: starts that waited for room; instances deleted before they fitted |
| `cost` | `gpu_hours` x the price per GPU-hour |
| `slo_violation_rate` | serving: requests over their SLO, dropped after 30 s or never served, per request |
| `inference_throughput` | serving: requests served per second |
| `training_throughput` | serving: training progress per job, 1.0 = a whole GPU alone |
| `cold_starts` | serving: instance starts a request waited for (none of its function's instances was ready) |
| `instance_starts` | serving: every instance start (on demand, scale-out, pre-warm), beside the deploy's own |
| `serving_gpu_hours`, `serving_peak_gpus` | serving: GPUs in use (integrated, and at most) |
| `p50_latency_ms`, `p99_latency_ms` | serving: of the requests served |
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dilu.sim.placement import PlacementResult, simulate_placement
from dilu.sim.policies import build_policies
from dilu.sim.serving import ServingResult, ServingSetup, simulate_serving
from dilu.sim.workload import InstanceEvent

COLUMNS = ("peak_gpus", "gpu_hours", "compute_fragmentation", "memory_fragmentation", "slo_violation_rate",
           "inference_throughput", "training_throughput", "cold_starts", "serving_gpu_hours", "cost")


@dataclass
class PolicyRun:
    placement: PlacementResult
    serving: ServingResult


def metrics(run: PolicyRun, price_per_gpu_hour: float) -> dict[str, float]:
    p, s = run.placement, run.serving
    latencies = np.frombuffer(s.latencies, dtype=np.float64) if len(s.latencies) else np.zeros(1)
    return {
        "peak_gpus": p.peak_gpus, "gpu_hours": round(p.gpu_hours, 3),
        "compute_fragmentation": round(p.mean(p.compute_fragmentation), 4),
        "memory_fragmentation": round(p.mean(p.memory_fragmentation), 4),
        "placement_waits": p.waited, "never_placed": p.never_placed,
        "cost": round(p.gpu_hours * price_per_gpu_hour, 2),
        "slo_violation_rate": round(s.slo_violation_rate, 5),
        "inference_throughput": round(s.served / s.duration_s, 3) if s.duration_s else 0.0,
        "training_throughput": round(s.training_progress / s.duration_s / max(1, s.jobs), 4) if s.duration_s else 0.0,
        "cold_starts": s.cold_starts, "instance_starts": s.starts, "serving_unplaced": s.unplaced,
        "serving_gpu_hours": round(s.gpu_seconds / 3600, 4), "serving_peak_gpus": max(s.active_gpus, default=0),
        "p50_latency_ms": round(float(np.percentile(latencies, 50)) * 1000, 2),
        "p99_latency_ms": round(float(np.percentile(latencies, 99)) * 1000, 2),
    }


def run_all(policies: list[str], events: list[InstanceEvent], serving: ServingSetup, *, nodes: int,
            gpus_per_node: int, gpu_memory_gb: float, advance: Callable[[str, float], None] | None = None
            ) -> dict[str, PolicyRun]:
    """Both levels for each policy. Placement runs once per distinct scheduler (policies that
    differ only in serving share it). ``advance(policy, units)`` reports progress."""
    built = build_policies()
    placements: dict[str, PlacementResult] = {}
    runs = {}
    for name in policies:
        policy = built[name]
        key = policy.scheduler.name + "/" + ",".join(s.name for s in policy.scheduler.scores)
        if key not in placements:
            placements[key] = simulate_placement(
                events, policy.scheduler, nodes=nodes, gpus_per_node=gpus_per_node, gpu_memory_gb=gpu_memory_gb,
                progress=(lambda n, name=name: advance(name, n)) if advance else None)
        elif advance:
            advance(name, len(events))
        result = simulate_serving(policy, serving, progress=(lambda n, name=name: advance(name,
                                                                                          n)) if advance else None)
        runs[name] = PolicyRun(placements[key], result)
    return runs


def write(runs: dict[str, PolicyRun], out: Path, price_per_gpu_hour: float, context: dict[str, Any]) -> dict[str, dict]:
    out.mkdir(parents=True, exist_ok=True)
    table = {name: metrics(run, price_per_gpu_hour) for name, run in runs.items()}
    (out / "metrics.json").write_text(json.dumps({"context": context, "policies": table}, indent=2) + "\n")
    with open(out / "metrics.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        names = list(next(iter(table.values())).keys()) if table else []
        writer.writerow(["policy", *names])
        for name, row in table.items():
            writer.writerow([name, *(row[k] for k in names)])
    with open(out / "placement_timeseries.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["policy", "t_s", "active_gpus", "compute_fragmentation", "memory_fragmentation"])
        for name, run in runs.items():
            p = run.placement
            for row in zip(p.times, p.active_gpus, p.compute_fragmentation, p.memory_fragmentation, strict=True):
                writer.writerow([name, *row])
    _plots(runs, table, out)
    return table


def _plots(runs: dict[str, PolicyRun], table: dict[str, dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(runs)
    figure, axis = plt.subplots(figsize=(9, 4.5))
    for name in names:
        p = runs[name].placement
        axis.step(np.asarray(p.times) / 60, p.active_gpus, where="post", label=name, linewidth=1.2)
    axis.set(xlabel="time (min)", ylabel="GPUs in use", title="Active GPUs over time (placement)")
    axis.legend(fontsize=8, ncol=2)
    figure.tight_layout()
    figure.savefig(out / "active_gpus.png", dpi=110)
    plt.close(figure)

    for metric, title, file in (
            (("compute_fragmentation", "memory_fragmentation"), "Fragmentation on GPUs in use", "fragmentation.png"),
            (("slo_violation_rate",), "SLO violation rate (serving)", "slo_violations.png"),
            (("inference_throughput",), "Inference throughput, requests/s (serving)", "inference_throughput.png"),
            (("training_throughput",), "Training throughput per job, 1 = a whole GPU (serving)",
             "training_throughput.png")):
        figure, axis = plt.subplots(figsize=(9, 4))
        width = 0.8 / len(metric)
        for k, key in enumerate(metric):
            axis.bar(np.arange(len(names)) + k * width, [table[n][key] for n in names], width, label=key)
        axis.set_xticks(np.arange(len(names)) + width * (len(metric) - 1) / 2, names, rotation=25, ha="right",
                        fontsize=8)
        axis.set_title(title)
        if len(metric) > 1:
            axis.legend(fontsize=8)
        figure.tight_layout()
        figure.savefig(out / file, dpi=110)
        plt.close(figure)


def format_table(table: dict[str, dict]) -> list[list[str]]:
    """Rows for the printed comparison: the header, then one per policy, ratios to exclusive."""
    base = table.get("exclusive")
    rows = [["policy", "peak GPUs", "GPU-h", "compute frag", "memory frag", "cost", "SLO viol", "inf req/s",
             "train/job", "cold starts", "starts", "serving GPU-h"]]
    for name, m in table.items():
        ratio = f" ({m['peak_gpus'] / base['peak_gpus']:.2f}x)" if base and base["peak_gpus"] else ""
        rows.append([name, f"{m['peak_gpus']}{ratio}", f"{m['gpu_hours']:.1f}", f"{m['compute_fragmentation']:.3f}",
                     f"{m['memory_fragmentation']:.3f}", f"{m['cost']:.0f}", f"{m['slo_violation_rate']:.2%}",
                     f"{m['inference_throughput']:.1f}", f"{m['training_throughput']:.3f}", str(m["cold_starts"]),
                     str(m["instance_starts"]), f"{m['serving_gpu_hours']:.2f}"])
    return rows
