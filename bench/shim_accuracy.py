"""Share accuracy: two processes on one (fake) GPU, each saturating it, with slices 30/70 and
10/90; the achieved shares of device time come from the fake driver's device clock.

    python bench/shim_accuracy.py [--seconds 5]

Target: within 2 percentage points of the targets. Then kernels of different costs: the process
at 30 % runs blocks that take 4x the device time of the other's (a heavy model beside a light
one), judged on each process's absolute share of the device's time (not the ratio between
them), open-loop (tokens = blocks) and with the manager's closed loop (its own process, reading
per-process device time from the fake NVML). Target: within 3 points, closed-loop, after the
first second (the loop's settling).
"""

from __future__ import annotations

import argparse

import shimbench

from worker.tokens.manager import socket_path_for
from worker.tokens.process import ManagerProcess


def measure(split: tuple[float, float], seconds: float) -> tuple[float, float, float]:
    tmp = shimbench.workdir()
    manager = shimbench.manager(tmp)
    try:
        for name, share in zip(("a", "b"), split, strict=True):
            manager.set_slice(name, "batch", share, share)
        processes = [shimbench.launcher(shimbench.env(tmp, shim=True, socket=manager.socket_path, instance=name),
                                        "run", seconds, 100, 0) for name in ("a", "b")]
        (a,), (b,) = (shimbench.results(p) for p in processes)
    finally:
        manager.stop()
    total = a["device_ns"] + b["device_ns"]
    busy = total / (max(a["seconds"], b["seconds"]) * 1e9)
    return a["device_ns"] / total, b["device_ns"] / total, busy


def _share_after(trace: list[dict], settle_s: float) -> float:
    """The share of the device's time from ``settle_s`` after the start to the end of a trace."""
    trace = [sample for sample in trace if "t" in sample]      # the samples, not the closing summary
    start = next(sample for sample in trace if sample["t"] - trace[0]["t"] >= settle_s)
    return (trace[-1]["device_ns"] - start["device_ns"]) / ((trace[-1]["t"] - start["t"]) * 1e9)


def measure_costs(closed_loop: bool, seconds: float) -> tuple[float, float]:
    """(heavy, light) absolute shares: heavy at 30 % with 4000 ns blocks, light at 70 % with 1000."""
    tmp = shimbench.workdir()
    manager = ManagerProcess(gpu_uuid="GPU-costs", socket_path=socket_path_for(tmp, "GPU-costs"),
                             capacity_per_s=1e9 / shimbench.NS_PER_BLOCK, measure=closed_loop,
                             env={"LD_LIBRARY_PATH": str(shimbench.BUILD / "fake"),
                                  "DILU_FAKE_CLOCK": str(tmp / "clock")})
    manager.start()
    try:
        manager.set_slice("heavy", "batch", 0.3, 0.3)
        manager.set_slice("light", "batch", 0.7, 0.7)
        processes = [shimbench.launcher(shimbench.env(tmp, shim=True, socket=manager.socket_path, instance=name,
                                                      ns_per_block=ns), "trace", seconds, blocks, 50)
                     for name, ns, blocks in (("heavy", 4000, 25), ("light", 1000, 100))]
        heavy, light = (shimbench.results(p) for p in processes)
    finally:
        manager.stop()
    return _share_after(heavy, 1.0), _share_after(light, 1.0)


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
        print(f"{split[0] * 100:>4.0f}/{split[1] * 100:<4.0f}  {a * 100:>7.2f}/{b * 100:<7.2f} "
              f"{error:>9.2f} {busy * 100:>11.1f}%")
    print(f"target within 2 pp: {'met' if worst <= 2 else 'NOT met'} (worst {worst:.2f} pp)")
    print("kernels of different costs (blocks 4:1), 30/70, absolute shares of device time after 1 s")
    print(f"{'manager':>11} {'achieved':>17} {'error pp':>9}")
    for closed_loop in (False, True):
        heavy, light = measure_costs(closed_loop, args.seconds)
        error = max(abs(heavy - 0.3), abs(light - 0.7)) * 100
        label = "closed-loop" if closed_loop else "open-loop"
        print(f"{label:>11}  {heavy*100:>7.2f}/{light*100:<7.2f} {error:>9.2f}")
    print(f"closed-loop target within 3 pp: {'met' if error <= 3 else 'NOT met'} ({error:.2f} pp)")


if __name__ == "__main__":
    main()
