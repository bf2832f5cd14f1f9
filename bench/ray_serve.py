"""Dilu beside Ray Serve: a no-op function, requests/s and p50 at 1 and 32 clients, and the
memory each holds idle, measured side by side in one run.

Both run in a network namespace of their own holding only loopback, so neither can bind or
reach an outside address (Ray otherwise looks for the host's address and binds it): the bench
re-runs itself under ``unshare --net`` (root). Dilu is `dilu up` (embedded default, spares
preloading torch as in production) with one no-op function pinned to the whole host; Ray Serve
is ``bench/peers/ray_noop.py`` in a virtual environment of its own (``bench/peers/servers.py``
installs ``ray[serve]`` there on first use). The load takes turns round by round so machine
noise hits both alike. Memory: each platform's
process tree, RSS and PSS, once idle. Where Ray cannot be installed or started, its rows are
left out with the reason.

    python bench/ray_serve.py [--seconds 5] [--rounds 2] [--clients 1,32]

Targets (issue 47): at least 15x Ray Serve's requests/s at 1 and at 32 clients; idle memory at
most 0.3x Ray's by PSS.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from loadgen import closed_loop, noop_function, percentile

from bench.peers.servers import PeerUnavailable, start_ray_serve
from bench.process_memory import settled_memory_mib
from tests.platform import Platform
from tests.waiting import eventually

BODY = json.dumps({"hello": "dilu"}).encode()
INSIDE = "DILU_BENCH_LOOPBACK_ONLY"


def in_loopback_namespace() -> None:
    """Re-runs this bench in a network namespace holding only loopback; returns when it already is."""
    if os.environ.get(INSIDE) == "1":
        return
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None:
        sys.exit("ray_serve: needs root, unshare and ip to run in a loopback-only network namespace; skipped")
    command = " ".join(["ip link set lo up && exec", sys.executable, *map(_quoted, sys.argv)])
    done = subprocess.run(["unshare", "--net", "--", "sh", "-c", command], env={**os.environ, INSIDE: "1"})
    sys.exit(done.returncode)


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="length of one measured round")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per platform")
    parser.add_argument("--clients", default="1,32", help="comma-separated concurrency levels")
    args = parser.parse_args()
    in_loopback_namespace()

    workdir = Path(tempfile.mkdtemp(prefix="dilu-bench-ray-"))
    spec = noop_function(ROOT / "examples", workdir)
    platform = Platform(workdir / "home", env={"DILU_SPARE_PRELOAD": "torch"})   # the production default
    ray = None
    try:
        assert platform.deploy_file(spec).status_code == 201
        platform.wait_ready("noop")
        eventually(lambda: platform.instances("noop")[0]["endpoint"], what="the instance endpoint")
        urls = {"Dilu": f"{platform.url}/v1/functions/noop/invoke"}
        try:
            ray = start_ray_serve()
            urls["Ray Serve"] = ray.url
        except PeerUnavailable as exc:
            print(f"Ray Serve: left out: {exc}")
        for url in urls.values():
            asyncio.run(closed_loop(url, BODY, 4, 1.0))
        memory = {"Dilu": settled_memory_mib(platform.role.process.pid)}
        if ray is not None:
            memory["Ray Serve"] = settled_memory_mib(ray.process.pid)

        print(f"Dilu beside Ray Serve: no-op, {args.rounds} x {args.seconds:g}s rounds each, taking turns, "
              f"{os.cpu_count()} CPUs, loopback-only network namespace")
        print(f"{'clients':>7} {'platform':>10} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
        for clients in (int(c) for c in args.clients.split(",")):
            samples: dict[str, list[float]] = {name: [] for name in urls}
            elapsed = dict.fromkeys(urls, 0.0)
            for _ in range(args.rounds):
                for name, url in urls.items():
                    started = time.perf_counter()
                    samples[name] += asyncio.run(closed_loop(url, BODY, clients, args.seconds))
                    elapsed[name] += time.perf_counter() - started
            rates = {name: len(samples[name]) / elapsed[name] for name in urls}
            for name in urls:
                print(f"{clients:>7} {name:>10} {rates[name]:>9.0f} {percentile(samples[name], 0.5) * 1000:>8.2f} "
                      f"{percentile(samples[name], 0.99) * 1000:>8.2f}")
            if "Ray Serve" in rates:
                ratio = rates["Dilu"] / rates["Ray Serve"]
                print(f"{clients:>7} {'ratio':>10} Dilu {ratio:.1f}x Ray Serve's req/s (target >= 15x: "
                      f"{'met' if ratio >= 15 else 'NOT met'})")
        print("\nidle memory, MiB (the platform's process tree)")
        for name, (rss, pss, count) in memory.items():
            print(f"{name:>10} {rss:>7.0f} RSS {pss:>7.0f} PSS  {count} processes")
        if "Ray Serve" in memory:
            ratio = memory["Dilu"][1] / memory["Ray Serve"][1]
            verdict = "met" if ratio <= 0.3 else "NOT met"
            print(f"{'ratio':>10} Dilu {ratio:.2f}x Ray Serve's PSS (target <= 0.3x: {verdict}), "
                  f"{memory['Dilu'][0] / memory['Ray Serve'][0]:.2f}x its RSS")
    finally:
        if ray is not None:
            ray.close()
        platform.close()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
