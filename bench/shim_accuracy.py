"""Share accuracy: two processes on one (fake) GPU, each saturating it, with slices 30/70 and
10/90; the achieved shares of device time come from the fake driver's device clock.

    python bench/shim_accuracy.py [--seconds 5]

Target: within 2 percentage points of the targets.
"""

from __future__ import annotations

import argparse

import shimbench


def measure(split: tuple[float, float], seconds: float) -> tuple[float, float, float]:
    tmp = shimbench.workdir()
    manager = shimbench.manager(tmp)
    try:
        for name, share in zip(("a", "b"), split):
            manager.set_slice(name, "batch", share, share)
        processes = [shimbench.launcher(shimbench.env(tmp, shim=True, socket=manager.socket_path, instance=name),
                                        "run", seconds, 100, 0) for name in ("a", "b")]
        (a,), (b,) = (shimbench.results(p) for p in processes)
    finally:
        manager.stop()
    total = a["device_ns"] + b["device_ns"]
    busy = total / (max(a["seconds"], b["seconds"]) * 1e9)
    return a["device_ns"] / total, b["device_ns"] / total, busy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    shimbench.build()
    print(f"shim accuracy: two saturating processes for {args.seconds:g}s each split")
    print(f"{'target':>11} {'achieved':>17} {'error pp':>9} {'device busy':>12}")
    worst = 0.0
    for split in ((0.3, 0.7), (0.1, 0.9)):
        a, b, busy = measure(split, args.seconds)
        error = max(abs(a - split[0]), abs(b - split[1])) * 100
        worst = max(worst, error)
        print(f"{split[0]*100:>4.0f}/{split[1]*100:<4.0f}  {a*100:>7.2f}/{b*100:<7.2f} {error:>9.2f} {busy*100:>11.1f}%")
    print(f"target within 2 pp: {'met' if worst <= 2 else 'NOT met'} (worst {worst:.2f} pp)")


if __name__ == "__main__":
    main()
