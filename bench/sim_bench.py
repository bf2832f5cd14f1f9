"""How `dilu simulate` grows: time and memory per policy at the default scale, then with the fleet
(the instance workload replicated on that many times the nodes) and with the trace's length.

    python bench/sim_bench.py [--trace bursty] [--fleets 1,2,5,10] [--hours 0.25,1,6,24] [--skip-policies]

Three parts, in one run:

1. Every policy, both levels, at the default scale (instances-3200 on 1,000 nodes x 4 GPUs,
   serving on 8 GPUs): seconds each, and the total against the 2-minute target.
2. Placement (the `dilu` scheduler) on 1x, 2x, 5x and 10x the fleet and the workload: seconds,
   peak traced memory, the peak GPUs and its lower bound; ratios to 1x.
3. Serving (`dilu`) on the trace repeated to 15 minutes, 1, 6 and 24 hours: seconds, peak traced
   memory, requests simulated; ratios to the shortest.

Each measured run is a child process of its own (forked, so the workload and the trace are
already loaded): its time, and its peak resident memory (the interpreter and the libraries
included, about a hundred MiB before any work).
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dilu.sim.placement import peak_bound, simulate_placement
from dilu.sim.policies import POLICY_NAMES, build_policies
from dilu.sim.serving import ServingSetup, simulate_serving
from dilu.sim.traces import load_trace
from dilu.sim.workload import load_workload, replicate

TARGET_S = 120.0


def _child(run: Callable[[], object], pipe) -> None:
    started = time.perf_counter()
    summary = run()
    seconds = time.perf_counter() - started
    pipe.send((summary, seconds, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))


def measured(run: Callable[[], object]) -> tuple[object, float, float]:
    """What ``run`` returns (small), its seconds, and the peak RSS (MiB) of the child it ran in."""
    receive, send = multiprocessing.Pipe(duplex=False)
    child = multiprocessing.get_context("fork").Process(target=_child, args=(run, send))
    child.start()
    result = receive.recv()
    child.join()
    return result


def every_policy(trace: str) -> None:
    events = load_workload("instances-3200")
    setup = ServingSetup(arrivals=load_trace(trace))
    policies = build_policies()
    print(f"1. instances-3200 ({len(events)} events, 4,000 GPUs) + {trace} serving on 8 GPUs")
    print(f"{'policy':<24}{'placement s':>12}{'serving s':>11}{'total s':>9}")
    total = 0.0
    for name in POLICY_NAMES:
        started = time.perf_counter()
        simulate_placement(events, policies[name].scheduler)
        placed = time.perf_counter()
        simulate_serving(policies[name], setup)
        served = time.perf_counter()
        total += served - started
        print(f"{name:<24}{placed - started:>12.2f}{served - placed:>11.2f}{served - started:>9.2f}", flush=True)
    print(f"all {len(POLICY_NAMES)} policies: {total:.1f} s; target {TARGET_S:.0f} s: "
          f"{'met' if total <= TARGET_S else 'NOT met'} ({total / TARGET_S:.2f}x the target)\n")


def fleets(sizes: list[int]) -> None:
    events = load_workload("instances-3200")
    scheduler = build_policies()["dilu"].scheduler
    print("2. placement (dilu) as the fleet grows: the workload replicated on that many times 1,000 nodes")
    print(f"{'fleet':>6}{'GPUs':>8}{'events':>8}{'seconds':>9}{'x time':>8}{'RSS MiB':>8}{'x mem':>7}"
          f"{'peak GPUs':>11}{'bound':>7}")
    base = None
    for size in sizes:
        workload = replicate(events, size)
        peak, seconds, mib = measured(lambda w=workload, s=size: simulate_placement(w, scheduler,
                                                                                    nodes=1000 * s).peak_gpus)
        bound = peak_bound(workload, 40.0)
        base = base or (seconds, mib)
        print(f"{size:>5}x{4000 * size:>8}{len(workload):>8}{seconds:>9.1f}{seconds / base[0]:>8.1f}{mib:>8.0f}"
              f"{mib / base[1]:>7.1f}{peak:>11}{bound.gpus:>7}", flush=True)
    print()


def lengths(trace: str, hours: list[float]) -> None:
    policy = build_policies()["dilu"]
    print(f"3. serving (dilu) as the trace grows: {trace} repeated")
    print(f"{'hours':>6}{'requests':>11}{'seconds':>9}{'x time':>8}{'RSS MiB':>8}{'x mem':>7}{'SLO viol':>10}")
    base = None
    for length in hours:
        setup = ServingSetup(arrivals=load_trace(trace, duration_s=length * 3600), duration_s=length * 3600)
        (arrivals, violations), seconds, mib = measured(
            lambda s=setup: (lambda r: (r.arrivals, r.slo_violation_rate))(simulate_serving(policy, s)))
        base = base or (seconds, mib)
        print(f"{length:>6g}{arrivals:>11}{seconds:>9.1f}{seconds / base[0]:>8.1f}{mib:>8.0f}"
              f"{mib / base[1]:>7.1f}{violations:>10.2%}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", default="bursty")
    parser.add_argument("--fleets", default="1,2,5,10", help="fleet multiples for part 2")
    parser.add_argument("--hours", default="0.25,1,6,24", help="trace lengths for part 3")
    parser.add_argument("--skip-policies", action="store_true", help="leave out part 1")
    args = parser.parse_args()
    if not args.skip_policies:
        every_policy(args.trace)
    fleets([int(x) for x in args.fleets.split(",") if x])
    lengths(args.trace, [float(x) for x in args.hours.split(",") if x])


if __name__ == "__main__":
    main()
