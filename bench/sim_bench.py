"""Time of `dilu simulate` per policy on instances-3200.txt (1,000 nodes x 4 GPUs of 40 GB) with
the bursty request trace serving on 8 GPUs: both levels, each policy on its own, in one run.

    python bench/sim_bench.py [--trace bursty]

Prints the seconds per policy (placement + serving), the total, and the ratio to the 2-minute
target for all of them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dilu.sim.placement import simulate_placement  # noqa: E402
from dilu.sim.policies import POLICY_NAMES, build_policies  # noqa: E402
from dilu.sim.serving import ServingSetup, simulate_serving  # noqa: E402
from dilu.sim.traces import load_trace  # noqa: E402
from dilu.sim.workload import load_workload  # noqa: E402

TARGET_S = 120.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", default="bursty")
    args = parser.parse_args()
    events = load_workload("instances-3200")
    setup = ServingSetup(arrivals=load_trace(args.trace))
    policies = build_policies()
    print(f"instances-3200 ({len(events)} events, 4,000 GPUs) + {args.trace} serving on 8 GPUs")
    print(f"{'policy':<24}{'placement s':>12}{'serving s':>11}{'total s':>9}")
    total = 0.0
    for name in POLICY_NAMES:
        started = time.perf_counter()
        simulate_placement(events, policies[name].scheduler)
        placed = time.perf_counter()
        simulate_serving(policies[name], setup)
        served = time.perf_counter()
        total += served - started
        print(f"{name:<24}{placed - started:>12.2f}{served - placed:>11.2f}{served - started:>9.2f}")
    print(f"all {len(POLICY_NAMES)} policies: {total:.1f} s; target {TARGET_S:.0f} s: "
          f"{'met' if total <= TARGET_S else 'NOT met'} ({total / TARGET_S:.2f}x the target)")


if __name__ == "__main__":
    main()
