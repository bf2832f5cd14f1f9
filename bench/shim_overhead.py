"""Launch overhead of the shim: launches per second straight to the (fake) driver and through the
shim, side by side in one run. The fake kernels take no device time, so only the call path is
measured.

    python bench/shim_overhead.py [--launches 5000000] [--rounds 5]

Paths: direct (no shim); shim with gating off (no manager); shim gated by a token manager with
an unlimited quota (the fast path every launch takes). Target: at most 100 ns added per launch.
"""

from __future__ import annotations

import argparse
import statistics

import shimbench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--launches", type=int, default=5_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    shimbench.build()
    tmp = shimbench.workdir()
    manager = shimbench.manager(tmp, capacity_per_s=1e15)  # unlimited: every launch takes the fast path
    manager.set_slice("bench", "batch", 1.0, 1.0)
    paths = {
        "direct": shimbench.env(tmp, shim=False, ns_per_block=0),
        "shim, no manager": shimbench.env(tmp, shim=True, ns_per_block=0),
        "shim, gated (unlimited)": shimbench.env(tmp, shim=True, socket=manager.socket_path, instance="bench",
                                                 ns_per_block=0),
    }
    samples: dict[str, list[float]] = {name: [] for name in paths}
    try:
        for _ in range(args.rounds):
            for name, environment in paths.items():  # alternating, so noise hits every path alike
                (result,) = shimbench.results(shimbench.launcher(environment, "count", args.launches, 1))
                samples[name].append(result["ns_per_launch"])
        gated_seen = manager.periods > 0
    finally:
        manager.stop()
    print(f"shim overhead: {args.launches:,} launches x {args.rounds} alternating rounds per path")
    print(f"{'path':<26} {'ns/launch':>10} {'launches/s':>14} {'added ns':>9}")
    direct = statistics.median(samples["direct"])
    for name, values in samples.items():
        median = statistics.median(values)
        print(f"{name:<26} {median:>10.2f} {1e9 / median:>14,.0f} {median - direct:>9.2f}")
    added = statistics.median(samples["shim, gated (unlimited)"]) - direct
    gated = statistics.median(samples["shim, gated (unlimited)"])
    print(f"ratio gated/direct launches per second: {direct / gated:.3f}")
    met = "met" if added <= 100 and gated_seen else "NOT met"
    print(f"target <= 100 ns added per gated launch: {met} ({added:.1f} ns)")


if __name__ == "__main__":
    main()
