"""Reaction time of a slice change: one process saturating a (fake) GPU at 80 %, then its slice
is cut to 20 % and raised back; how long until its achieved share, over a sliding 10 ms window
(sampled every millisecond), settles within 5 % of the new target.

    python bench/shim_reaction.py [--changes 5]

Target: two token periods plus the measurement window (2 x 5 ms + 10 ms = 20 ms).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import shimbench

from worker.tokens.manager import HEADROOM

WINDOW_MS = 10.0
SAMPLE_MS = 1.0
HOLD_S = 0.6


def sliding_shares(samples: list[dict], window_s: float) -> list[dict]:
    """The share over the window ending at each sample: {"t": end, "share": ...}."""
    result, start = [], 0
    for _end, sample in enumerate(samples):
        while samples[start]["t"] < sample["t"] - window_s:
            start += 1
        if start > 0 and sample["t"] - samples[start - 1]["t"] >= window_s:
            first = samples[start - 1]
            span = sample["t"] - first["t"]
            result.append({"t": sample["t"], "share": (sample["device_ns"] - first["device_ns"]) / (span * 1e9)})
    return result


def settle_time(trace: list[dict], changed_at: float, target: float, until: float) -> float | None:
    """Seconds from the change to the end of the first window that is within 5 % of ``target``
    and after which at least 95 % of the windows (up to ``until``) are too. (Single 10 ms
    windows scatter by a few percent on a busy machine; one stray window is not a relapse.)"""
    windows = [w for w in trace if changed_at < w["t"] <= until]
    for index, window in enumerate(windows):
        rest = windows[index:]
        inside = sum(abs(w["share"] - target) <= 0.05 * target for w in rest)
        if abs(window["share"] - target) <= 0.05 * target and inside >= 0.95 * len(rest):
            return window["t"] - changed_at
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--changes", type=int, default=5, help="down-and-up cycles")
    args = parser.parse_args()
    shimbench.build()
    tmp = shimbench.workdir()
    manager = shimbench.manager(tmp)
    manager.set_slice("r", "batch", 0.8, 0.8)
    duration = 0.5 + args.changes * 2 * HOLD_S + 0.2
    process = shimbench.launcher(shimbench.env(tmp, shim=True, socket=manager.socket_path, instance="r"),
                                 "trace", duration, 20, SAMPLE_MS)
    changes: list[tuple[float, float]] = []

    def drive() -> None:
        time.sleep(0.5)  # let the tracer register and fill the queue at the first slice
        for _ in range(args.changes):
            for share in (0.2, 0.8):
                changes.append((time.monotonic(), share))
                manager.set_slice("r", "batch", share, share)
                time.sleep(HOLD_S)

    driver = threading.Thread(target=drive)
    driver.start()
    try:
        trace = sliding_shares(shimbench.results(process)[:-1], WINDOW_MS / 1000)
    finally:
        driver.join()
        manager.stop()
    period_ms = manager.params.period_s * 1000
    downs, ups = [], []
    for index, (at, share) in enumerate(changes):
        until = changes[index + 1][0] if index + 1 < len(changes) else trace[-1]["t"]
        settled = settle_time(trace, at, share * (1 - HEADROOM), until)
        (downs if share < 0.5 else ups).append(settled)
    target_ms = 2 * period_ms + WINDOW_MS
    print(f"shim reaction: {args.changes} cuts 80%->20% and raises 20%->80%, sliding {WINDOW_MS:g} ms window, "
          f"{period_ms:g} ms token period")
    for name, values in (("80% -> 20%", downs), ("20% -> 80%", ups)):
        settled = [v * 1000 for v in values if v is not None]
        missing = sum(v is None for v in values)
        print(f"{name}: median {statistics.median(settled):.1f} ms, max {max(settled):.1f} ms"
              + (f", {missing} never settled" if missing else "")
              + f"  (ratio to target {statistics.median(settled) / target_ms:.2f}x)")
    steady = [w["share"] for at, share in changes for w in trace if at + 0.2 < w["t"] < at + HOLD_S and share < 0.5]
    if steady:
        print(f"steady windows at 20%: mean {statistics.mean(steady):.4f}, stdev {statistics.pstdev(steady):.4f}")
    worst = max(v for v in downs + ups if v is not None) * 1000
    never = sum(v is None for v in downs + ups)
    verdict = "met" if worst <= target_ms and not never else "NOT met"
    print(f"target {target_ms:g} ms (2 periods + window): {verdict} (worst {worst:.1f} ms)")


if __name__ == "__main__":
    main()
