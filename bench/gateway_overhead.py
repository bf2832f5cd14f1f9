"""Gateway overhead beside nginx: a no-op function invoked through the gateway, through nginx
proxying to the same instance, and directly at the instance.

Starts `dilu up` (embedded default) in a child process, deploys a no-op function with one
instance, starts nginx (one worker process, kept-alive upstream connections, no access log) in
front of that instance, then runs the same closed-loop load against the three URLs, taking turns
round by round so machine noise hits them alike. Prints requests/s, p50 and p99 for each, what
the gateway and nginx add at p50 over the instance, and the gateway's requests/s over nginx's.
Beside each path's row, the CPU the `dilu up` process spent per request (user + system, read
from /proc): on the gateway's row that is the gateway's cost, on the others what the controller
and worker spend meanwhile.

    python bench/gateway_overhead.py [--seconds 5] [--rounds 2] [--clients 1,32] [--tcp-hop]

``--tcp-hop`` adds a second platform that reaches its instance over loopback TCP
(``DILU_INSTANCE_SOCKETS=off``) as the ``gw-tcp`` path: the Unix-socket hop's saving, side by side.

Targets (issue 47): the gateway adds at most 0.06 ms at p50 at one client, and serves at
least nginx's requests/s at 32 clients. Without nginx installed, its rows are left out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from loadgen import closed_loop, noop_function, percentile

from bench.peers.servers import PeerUnavailable, Proxy, start_nginx
from tests.platform import Platform  # reuses the test harness that runs `dilu up`
from tests.waiting import eventually

BODY = json.dumps({"hello": "dilu"}).encode()


def cpu_seconds(pid: int) -> float:
    """User + system CPU a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="length of one measured round")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per path")
    parser.add_argument("--clients", default="1,32", help="comma-separated concurrency levels")
    parser.add_argument("--tcp-hop", action="store_true", help="also a gateway reaching its instance over TCP")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="dilu-bench-"))
    spec = noop_function(ROOT / "examples", workdir)
    platform = Platform(workdir / "home")
    tcp_platform = Platform(workdir / "home-tcp", env={"DILU_INSTANCE_SOCKETS": "off"}) if args.tcp_hop else None
    proxy: Proxy | None = None
    try:
        assert platform.deploy_file(spec).status_code == 201
        platform.wait_ready("noop")
        endpoint = eventually(lambda: platform.instances("noop")[0]["endpoint"], what="the instance endpoint")
        paths = {"direct": f"{endpoint}/infer", "gateway": f"{platform.url}/v1/functions/noop/invoke"}
        if tcp_platform is not None:
            assert tcp_platform.deploy_file(spec).status_code == 201
            tcp_platform.wait_ready("noop")
            paths["gw-tcp"] = f"{tcp_platform.url}/v1/functions/noop/invoke"
        try:
            proxy = start_nginx(endpoint)
            paths["nginx"] = f"{proxy.url}/infer"
        except PeerUnavailable as exc:
            print(f"nginx: left out: {exc}")
        for url in paths.values():       # warm every path's connections and caches
            asyncio.run(closed_loop(url, BODY, 4, 1.0))

        print(f"gateway overhead: no-op function, {args.rounds} x {args.seconds:g}s rounds per path, paths "
              f"taking turns, {os.cpu_count()} CPUs")
        print(f"{'clients':>7} {'path':>8} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'p50 added ms':>13} "
              f"{'platform CPU us/req':>20}")
        pids = {path: (tcp_platform if path == "gw-tcp" else platform).role.process.pid for path in paths}
        for clients in (int(c) for c in args.clients.split(",")):
            samples: dict[str, list[float]] = {path: [] for path in paths}
            elapsed: dict[str, float] = dict.fromkeys(paths, 0.0)
            spent: dict[str, float] = dict.fromkeys(paths, 0.0)
            for _ in range(args.rounds):
                for path, url in paths.items():
                    started, used = time.perf_counter(), cpu_seconds(pids[path])
                    samples[path] += asyncio.run(closed_loop(url, BODY, clients, args.seconds))
                    elapsed[path] += time.perf_counter() - started
                    spent[path] += cpu_seconds(pids[path]) - used
            stats = {path: (len(samples[path]) / elapsed[path], percentile(samples[path], 0.5) * 1000,
                            percentile(samples[path], 0.99) * 1000) for path in paths}
            for path, (rps, p50, p99) in stats.items():
                added = p50 - stats["direct"][1]
                cpu_us = spent[path] / len(samples[path]) * 1e6
                print(f"{clients:>7} {path:>8} {rps:>9.0f} {p50:>8.2f} {p99:>8.2f} {added:>+13.3f} {cpu_us:>20.0f}")
            added = stats["gateway"][1] - stats["direct"][1]
            if "nginx" in stats:
                kept = stats["gateway"][0] / stats["nginx"][0]
                print(f"{clients:>7} {'ratio':>8} gateway req/s over nginx's {kept:.2f}x; p50 over nginx's "
                      f"{stats['gateway'][1] / stats['nginx'][1]:.2f}x; p99 over nginx's "
                      f"{stats['gateway'][2] / stats['nginx'][2]:.2f}x")
                if clients >= 32:
                    print(f"{'':>7} {'target':>8} req/s >= 1.0x nginx's: {'met' if kept >= 1.0 else 'NOT met'}")
            if clients == 1:
                print(f"{'':>7} {'target':>8} p50 added <= 0.06 ms: {'met' if added <= 0.06 else 'NOT met'} "
                      f"(+{added:.3f} ms)")
        print(f"(platform logs in {workdir})")
    finally:
        if proxy is not None:
            proxy.close()
        platform.close()
        if tcp_platform is not None:
            tcp_platform.close()


if __name__ == "__main__":
    main()
