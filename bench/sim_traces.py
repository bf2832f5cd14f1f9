"""Serving on every named trace under every policy, against the targets, and Dilu's ablations.

    python bench/sim_traces.py [--traces bursty,gamma-1-8] [--jobs 2] [--no-ablations]

For each trace: the serving scenario of `dilu simulate` (four inference functions, four training
jobs, 8 GPUs, the defaults) under each policy, then the target table: Dilu's SLO violations
against the best baseline's + 0.5 points, its cold starts against 0.5x infless's, its training per
job against tgs's. The ablations run Dilu with one rule off at a time (the rule names are the
names of ``dilu.sim.policies.build_ablations``). Markdown out, for docs/evaluation.md.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dilu.sim.placement import PlacementResult
from dilu.sim.policies import POLICY_NAMES, build_ablations, build_policies
from dilu.sim.report import PolicyRun, metrics
from dilu.sim.serving import ServingSetup, simulate_serving
from dilu.sim.traces import NAMED_TRACES, load_trace

BASELINES = ("exclusive", "mps", "infless", "horizontal-only", "tgs")


def _run(job: tuple[str, str]) -> tuple[str, str, dict]:
    trace, name = job
    policies = {**build_policies(), **build_ablations()}
    setup = ServingSetup(arrivals=load_trace(trace, duration_s=900.0 if trace.startswith("gamma") else None))
    result = simulate_serving(policies[name], setup)
    return trace, name, metrics(PolicyRun(PlacementResult(), result), 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default=",".join(NAMED_TRACES))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--no-ablations", action="store_true")
    args = parser.parse_args()
    traces = [t for t in args.traces.split(",") if t]
    names = list(POLICY_NAMES) + ([] if args.no_ablations else list(build_ablations()))
    with multiprocessing.Pool(args.jobs) as pool:
        found = pool.map(_run, [(t, n) for t in traces for n in names])
    table = {(t, n): m for t, n, m in found}

    print("| trace | Dilu SLO viol | best baseline | target (best + 0.5 pt) | Dilu cold starts | infless | "
          "target (0.5x) | Dilu training/job | tgs | target |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for t in traces:
        dilu = table[(t, "dilu")]
        best = min(table[(t, b)]["slo_violation_rate"] for b in BASELINES)
        who = ", ".join(b for b in BASELINES if table[(t, b)]["slo_violation_rate"] == best)
        slo = dilu["slo_violation_rate"]
        slo_ok = "met" if slo <= best + 0.005 else f"**missed** by {(slo - best - 0.005) * 100:.2f} pt"
        cold, infless = dilu["cold_starts"], table[(t, "infless")]["cold_starts"]
        cold_ok = "met" if cold <= 0.5 * infless or cold == 0 else f"**missed**: {cold / infless:.2f}x"
        train, tgs = dilu["training_throughput"], table[(t, "tgs")]["training_throughput"]
        train_ok = "met" if train >= tgs else f"**missed** by {tgs - train:.3f}"
        print(f"| {t} | {slo:.2%} | {best:.2%} ({who}) | {slo_ok} | {cold} | {infless} | {cold_ok} | "
              f"{train:.3f} | {tgs:.3f} | {train_ok} |")
    for t in traces:
        print(f"\n`{t}`\n\n| policy | SLO viol | cold starts | starts | training/job | serving GPU-h | p99 ms |")
        print("|---|---|---|---|---|---|---|")
        for n in names:
            m = table[(t, n)]
            print(f"| {n} | {m['slo_violation_rate']:.2%} | {m['cold_starts']} | {m['instance_starts']} | "
                  f"{m['training_throughput']:.3f} | {m['serving_gpu_hours']:.2f} | {m['p99_latency_ms']:.0f} |")


if __name__ == "__main__":
    main()
