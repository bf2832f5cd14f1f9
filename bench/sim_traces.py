"""Serving on every named trace under every policy, against the targets, and Dilu's ablations.

    python bench/sim_traces.py [--traces bursty,gamma-1-8] [--jobs 2] [--no-ablations] [--seeds 0,1,2]

For each trace: the serving scenario of `dilu simulate` (four inference functions, four training
jobs, 8 GPUs, the defaults) under each policy, then the target table: Dilu's SLO violations
against the best baseline's + 0.5 points, its cold starts against 0.5x infless's, its training per
job against tgs's. The ablations run Dilu with one rule off at a time (the rule names are the
names of ``dilu.sim.policies.build_ablations``). With several ``--seeds`` (the arrivals' random draws) the
target table has a row per trace and seed, and the other tables are the first seed's. Markdown
out, for docs/evaluation.md.
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


def _run(job: tuple[str, int, str]) -> tuple[str, int, str, dict]:
    trace, seed, name = job
    policies = {**build_policies(), **build_ablations()}
    setup = ServingSetup(arrivals=load_trace(trace, duration_s=900.0 if trace.startswith("gamma") else None, seed=seed))
    result = simulate_serving(policies[name], setup)
    return trace, seed, name, metrics(PolicyRun(PlacementResult(), result), 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default=",".join(NAMED_TRACES))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--no-ablations", action="store_true")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds of the arrivals' random draws")
    args = parser.parse_args()
    traces = [t for t in args.traces.split(",") if t]
    seeds = [int(x) for x in args.seeds.split(",") if x]
    names = list(POLICY_NAMES) + ([] if args.no_ablations else list(build_ablations()))
    jobs = [(t, seed, n) for t in traces for seed in seeds for n in (names if seed == seeds[0] else POLICY_NAMES)]
    with multiprocessing.Pool(args.jobs) as pool:
        found = pool.map(_run, jobs)
    by_seed = {(t, seed, n): m for t, seed, n, m in found}
    table = {(t, n): m for (t, seed, n), m in by_seed.items() if seed == seeds[0]}

    seeded = len(seeds) > 1
    print(f"| trace |{' seed |' if seeded else ''} Dilu SLO viol | best baseline | target (best + 0.5 pt) | "
          "Dilu cold starts | infless | target (0.5x) | Dilu training/job | tgs | target |")
    print("|---|" + ("---|" if seeded else "") + "---|---|---|---|---|---|---|---|---|")
    for t in traces:
        for seed in seeds:
            row = {n: by_seed[(t, seed, n)] for n in POLICY_NAMES}
            print(_target_row(t, seed if seeded else None, row))
    for t in traces:
        print(f"\n`{t}`\n\n| policy | SLO viol | cold starts | starts | training/job | serving GPU-h | p99 ms |")
        print("|---|---|---|---|---|---|---|")
        for n in names:
            m = table[(t, n)]
            print(f"| {n} | {m['slo_violation_rate']:.2%} | {m['cold_starts']} | {m['instance_starts']} | "
                  f"{m['training_throughput']:.3f} | {m['serving_gpu_hours']:.2f} | {m['p99_latency_ms']:.0f} |")


def _target_row(trace: str, seed: int | None, row: dict[str, dict]) -> str:
    """One line of the target table: Dilu against the best baseline, infless and tgs."""
    dilu = row["dilu"]
    best = min(row[b]["slo_violation_rate"] for b in BASELINES)
    who = ", ".join(b for b in BASELINES if row[b]["slo_violation_rate"] == best)
    slo = dilu["slo_violation_rate"]
    slo_ok = "met" if slo <= best + 0.005 else f"**missed** by {(slo - best - 0.005) * 100:.2f} pt"
    cold, infless = dilu["cold_starts"], row["infless"]["cold_starts"]
    cold_ok = "met" if cold <= 0.5 * infless or cold == 0 else f"**missed**: {cold / infless:.2f}x"
    train, tgs = dilu["training_throughput"], row["tgs"]["training_throughput"]
    train_ok = "met" if train >= tgs else f"**missed** by {tgs - train:.3f}"
    return (f"| {trace} |{f' {seed} |' if seed is not None else ''} {slo:.2%} | {best:.2%} ({who}) | {slo_ok} | "
            f"{cold} | {infless} | {cold_ok} | {train:.3f} | {tgs:.3f} | {train_ok} |")


if __name__ == "__main__":
    main()
