"""Gateway overhead: a no-op function invoked through the gateway and directly at its instance.

Starts `dilu up` (embedded default) in a child process, deploys a no-op function with one
instance, then runs the same closed-loop load against both URLs, alternating rounds so machine
noise hits both alike. Prints requests/s, p50 and p99 for each, and the ratios.

    python bench/gateway_overhead.py [--seconds 5] [--rounds 2] [--clients 1,32]

Targets: the gateway adds at most 1 ms at p50, and keeps at least half of the direct
throughput at 32 clients.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from loadgen import closed_loop

from tests.platform import Platform  # reuses the test harness that runs `dilu up`
from tests.waiting import eventually

BODY = json.dumps({"hello": "dilu"}).encode()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="length of one measured round")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per path")
    parser.add_argument("--clients", default="1,32", help="comma-separated concurrency levels")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="dilu-bench-"))
    source = shutil.copytree(ROOT / "examples" / "echo", workdir / "noop")
    (source / "model.yaml").write_text(
        "name: noop\nhandler: handler:Echo\n"
        "resources:\n  memory: 128Mi\n  gpu: false\n  sm_request: 1.0\n  sm_limit: 1.0\n"
        "scaling:\n  min_instances: 1\n  max_instances: 1\n  keep_alive_s: 3600\n"
        "batching:\n  max_batch_size: 1\n")
    platform = Platform(workdir / "home")
    try:
        assert platform.deploy_file(source / "model.yaml").status_code == 201
        platform.wait_ready("noop")
        endpoint = eventually(lambda: platform.instances("noop")[0]["endpoint"], what="the instance endpoint")
        paths = {"gateway": f"{platform.url}/v1/functions/noop/invoke", "direct": f"{endpoint}/infer"}
        asyncio.run(closed_loop(paths["gateway"], BODY, 4, 1.0))  # warm both paths' connections and caches
        asyncio.run(closed_loop(paths["direct"], BODY, 4, 1.0))

        print(f"gateway overhead: no-op function, {args.rounds} x {args.seconds:g}s alternating rounds per path, "
              f"{os.cpu_count()} CPUs")
        print(f"{'clients':>7} {'path':>8} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
        for clients in (int(c) for c in args.clients.split(",")):
            samples: dict[str, list[float]] = {"direct": [], "gateway": []}
            elapsed: dict[str, float] = {"direct": 0.0, "gateway": 0.0}
            for _ in range(args.rounds):
                for path in ("direct", "gateway"):
                    started = time.perf_counter()
                    samples[path] += asyncio.run(closed_loop(paths[path], BODY, clients, args.seconds))
                    elapsed[path] += time.perf_counter() - started
            stats = {}
            for path in ("direct", "gateway"):
                stats[path] = (len(samples[path]) / elapsed[path], percentile(samples[path], 0.5) * 1000,
                               percentile(samples[path], 0.99) * 1000)
                rps, p50, p99 = stats[path]
                print(f"{clients:>7} {path:>8} {rps:>9.0f} {p50:>8.2f} {p99:>8.2f}")
            added_p50 = stats["gateway"][1] - stats["direct"][1]
            kept = stats["gateway"][0] / stats["direct"][0]
            p50 = stats["gateway"][1] / stats["direct"][1]
            print(f"{clients:>7} {'ratio':>8} throughput kept {kept:.2f}x, p50 {p50:.2f}x "
                  f"(+{added_p50:.2f} ms), p99 {stats['gateway'][2] / stats['direct'][2]:.2f}x")
            if clients == 1:
                print(f"{'':>7} {'target':>8} p50 added <= 1 ms: {'met' if added_p50 <= 1.0 else 'NOT met'}")
            if clients >= 32:
                print(f"{'':>7} {'target':>8} throughput kept >= 0.5x: {'met' if kept >= 0.5 else 'NOT met'}")
        print(f"(platform logs in {workdir})")
    finally:
        platform.close()


if __name__ == "__main__":
    main()
