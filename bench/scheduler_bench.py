"""Scheduler decision time at 40, 400 and 4,000 GPUs (4 GPUs of 40 GB per node).

Replays the cluster workload from data/workloads (starts and deletes, one start per
second) through Dilu's scheduling policy until the cluster holds its steady-state load, then
times each placement decision of the following requests. Prints the median and p99 decision
time, decisions per second, and the ratio to the 1 ms target at 4,000 GPUs; the baselines
(exclusive, static-limits, request-only) run beside it for comparison.

    python bench/scheduler_bench.py [--decisions 500]
"""

from __future__ import annotations

import argparse
import ast
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dilu.policy.scheduler import ClusterSnapshot, Device, PlacementRequest, create_scheduler

WORKLOADS = ROOT / "data" / "workloads"
GiB = 2**30


def events(gpus: int) -> list[tuple[str, PlacementRequest]]:
    """The workload file sized for this cluster (instances-N with N about the GPU count)."""
    sizes = sorted(int(p.stem.split("-")[1]) for p in WORKLOADS.glob("instances-*.txt"))
    size = min(sizes, key=lambda n: abs(n - gpus))
    result = []
    for line in (WORKLOADS / f"instances-{size}.txt").read_text().splitlines():
        item = ast.literal_eval(line)
        spec = item["Instance"]
        cls = "batch" if spec["type"] == "training" else "latency"
        result.append((item["Action"], PlacementRequest(
            spec["service_name"], int(spec["memory"][0] * GiB), float(spec["sm_requests"]),
            float(spec["sm_limits"]), cls, gpu=True, gpus=int(spec["gpu_num"]))))
    return result


def run(policy: str, gpus: int, decisions: int) -> tuple[list[float], int]:
    scheduler = create_scheduler(policy)
    snapshot = ClusterSnapshot.of([Device(f"gpu{i}", f"node{i // 4}", memory_bytes=40 * GiB) for i in range(gpus)])
    placed: dict[str, tuple[PlacementRequest, tuple[int, ...]]] = {}
    timings: list[float] = []
    failed = 0
    stream = events(gpus)
    warmup = max(len(stream) // 2, 1)
    for step, (action, request) in enumerate(stream * 3):
        if action == "delete":
            known = placed.pop(request.function, None)
            if known is not None:
                for index in known[1]:
                    snapshot = snapshot.without(index, known[0])
            continue
        if request.function in placed:
            continue
        started = time.perf_counter()
        decision = scheduler.place(request, snapshot)
        elapsed = time.perf_counter() - started
        if step >= warmup:
            timings.append(elapsed)
        if decision.ok:
            indices = tuple(int(d[3:]) for d in decision.devices)  # devices are named gpu<index>
            placed[request.function] = (request, indices)
            snapshot = snapshot.with_placement(indices, request)
        elif step >= warmup:
            failed += 1
        if len(timings) >= decisions:
            break
    return timings, failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--decisions", type=int, default=500)
    args = parser.parse_args()
    print(f"scheduler decisions (median / p99 per decision, decisions per second), {args.decisions} timed each")
    print(f"{'GPUs':>6} {'policy':<14} {'median ms':>10} {'p99 ms':>8} {'decisions/s':>12} {'unplaced':>9}")
    results = {}
    for gpus in (40, 400, 4000):
        for policy in ("dilu", "exclusive", "static-limits", "request-only"):
            timings, failed = run(policy, gpus, args.decisions)
            median = statistics.median(timings) * 1000
            p99 = sorted(timings)[int(0.99 * (len(timings) - 1))] * 1000
            results[(gpus, policy)] = median
            print(f"{gpus:>6} {policy:<14} {median:>10.3f} {p99:>8.3f} {1000 / median:>12,.0f} {failed:>9}")
    at_scale = results[(4000, "dilu")]
    print(f"target: median decision within 1 ms at 4,000 GPUs: {'met' if at_scale <= 1 else 'NOT met'} "
          f"({at_scale:.3f} ms, {at_scale:.2f}x the target); 4,000 vs 40 GPUs: {at_scale / results[(40, 'dilu')]:.1f}x")


if __name__ == "__main__":
    main()
