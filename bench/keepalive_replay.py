"""Keep-alive replay through the real platform: the idle-time histogram against a fixed window.

Starts two `dilu up` platforms side by side (child processes, embedded default) with the same
no-op function scaled to zero (at most one instance: this measures keep-alive, not horizontal
scaling): one with the histogram policy (the default), one whose histogram
is never trusted, so the spec's fixed `keep_alive_s` always applies. The same arrivals are sent
to both at once:

- `bursts`: bursts of a few requests per second for tens of seconds, long pauses between them;
- `trace`: one of the request-rate traces in data/traces/rps, time-compressed.

For each policy it prints cold starts per burst, the requests that met a cold start (their
reply carries `x-dilu-queued-ms`), the instances started (cold starts and pre-warms), and the
instance-seconds held (instances starting or ready,
sampled every 0.2 s), and the ratio of instance-seconds histogram / fixed.

    python bench/keepalive_replay.py [--bursts 8 --burst-s 15 --rate 3 --pause-s 40]
                                     [--trace sporadic --compress 2 --trace-s 300] [--skip-trace]

Targets: once learned, at most one cold start per burst; fewer instance-seconds than fixed.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.platform import Platform  # reuses the harness that runs `dilu up`

VERBOSE = False
SPEC = ("name: noop\nhandler: handler:Echo\nresources:\n  memory: 128Mi\n  gpu: false\n  sm_request: 0.5\n"
        "  sm_limit: 1.0\nscaling:\n  min_instances: 0\n  max_instances: 1\n  keep_alive_s: {keep}\n")


@dataclass
class Tally:
    sent: int = 0
    failed: int = 0
    cold: list[int] = field(default_factory=list)      # per burst: requests that met a cold start
    instance_s: float = 0.0
    starts: int = 0                                     # instances started (cold starts and pre-warms)
    errors: dict[str, int] = field(default_factory=dict)  # failure reason -> count
    decisions: dict[str, int] = field(default_factory=dict)  # scaling decision (reason) -> count

    def record(self, burst: int, reply: httpx.Response | BaseException) -> None:
        self.sent += 1
        while len(self.cold) <= burst:
            self.cold.append(0)
        if isinstance(reply, BaseException) or reply.status_code != 200:
            self.failed += 1
            reason = repr(reply)[:120] if isinstance(reply,
                                                     BaseException) else f"{reply.status_code} {reply.text[:100]}"
            self.errors[reason] = self.errors.get(reason, 0) + 1
        elif "x-dilu-queued-ms" in reply.headers:
            self.cold[burst] += 1


def burst_arrivals(bursts: int, burst_s: float, rate: float, pause_s: float) -> list[tuple[float, int]]:
    """(offset seconds, burst index): evenly spaced requests at ``rate`` per second in each burst."""
    arrivals = []
    for burst in range(bursts):
        start = burst * (burst_s + pause_s)
        arrivals += [(start + i / rate, burst) for i in range(int(burst_s * rate))]
    return arrivals


def trace_arrivals(name: str, compress: float, length_s: float, seed: int = 7) -> list[tuple[float, int]]:
    """Poisson arrivals following a per-second rate trace, ``compress`` x faster; a "burst" is a
    run of arrivals with gaps under 2 s."""
    rates = [float(x) for x in (ROOT / "data" / "traces" / "rps" / f"{name}.txt").read_text().split()]
    rng, arrivals, burst, last = random.Random(seed), [], -1, -10.0
    for second, rate in enumerate(rates):
        begin = second / compress
        if begin >= length_s:
            break
        for _ in range(_poisson(rng, rate)):
            at = begin + rng.random() / compress
            arrivals.append(at)
    arrivals.sort()
    out = []
    for at in arrivals:
        if at - last >= 2.0:
            burst += 1
        out.append((at, burst))
        last = at
    return out


def _poisson(rng: random.Random, mean: float) -> int:
    count, limit, product = 0, pow(2.718281828459045, -mean), rng.random()
    while product > limit:
        count += 1
        product *= rng.random()
    return count


async def replay(platforms: dict[str, Platform], arrivals: list[tuple[float, int]]) -> dict[str, Tally]:
    tallies = {name: Tally() for name in platforms}
    clients = {name: httpx.AsyncClient(base_url=p.url, timeout=120) for name, p in platforms.items()}
    done = asyncio.Event()

    async def sample() -> None:
        last = time.monotonic()
        while not done.is_set():
            await asyncio.sleep(0.2)
            now = time.monotonic()
            for name, client in clients.items():
                view = (await client.get("/v1/functions/noop")).json()
                tallies[name].instance_s += (view["ready_instances"] + view["starting_instances"]) * (now - last)
            last = now

    async def one(name: str, burst: int) -> None:
        try:
            reply = await clients[name].post("/v1/functions/noop/invoke", json={"n": burst})
        except httpx.HTTPError as exc:
            reply = exc
        tallies[name].record(burst, reply)

    sampler = asyncio.create_task(sample())
    began, pending = time.monotonic(), []
    for offset, burst in arrivals:
        await asyncio.sleep(max(0.0, began + offset - time.monotonic()))
        pending += [asyncio.create_task(one(name, burst)) for name in platforms]
    await asyncio.gather(*pending)
    done.set()
    await sampler
    for name, client in clients.items():
        events = (await client.get("/v1/functions/noop/events", params={"limit": 10000})).json()
        tallies[name].starts = sum(1 for e in events if e["action"] == "scale-up")
        for e in events:
            if e["action"] in ("scale-up", "scale-down"):
                key = f'{e["action"]}: {e["reason"].split(";")[0][:50]}'
                tallies[name].decisions[key] = tallies[name].decisions.get(key, 0) + 1
    for client in clients.values():
        await client.aclose()
    return tallies


def report(title: str, tallies: dict[str, Tally]) -> None:
    print(f"\n{title}")
    print(f"{'policy':<10} {'requests':>8} {'failed':>6} {'cold starts/burst (requests that met one)':<44} "
          f"{'bursts w/ >1':>12} {'starts':>6} {'instance-s':>10}")
    for name, tally in tallies.items():
        per_burst = " ".join(str(c) for c in tally.cold)
        print(f"{name:<10} {tally.sent:>8} {tally.failed:>6} {per_burst[:44]:<44} "
              f"{sum(1 for c in tally.cold[1:] if c > 1):>12} {tally.starts:>6} {tally.instance_s:>10.1f}")
    for name, tally in tallies.items():
        for reason, count in sorted(tally.errors.items(), key=lambda item: -item[1])[:3]:
            print(f"  {name}: {count} x {reason}")
    if VERBOSE:
        for name, tally in tallies.items():
            for reason, count in sorted(tally.decisions.items(), key=lambda item: -item[1]):
                print(f"  {name}: {count} x {reason}")
    learned = tallies["histogram"].cold[2:]
    print(f"histogram, after two bursts: most requests meeting a cold start in one burst = "
          f"{max(learned, default=0)}; bursts with any = {sum(1 for c in learned if c)} of {len(learned)}")
    print(f"instance-seconds histogram / fixed = "
          f"{tallies['histogram'].instance_s / max(1e-9, tallies['fixed'].instance_s):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bursts", type=int, default=8)
    parser.add_argument("--burst-s", type=float, default=15.0)
    parser.add_argument("--rate", type=float, default=3.0)
    parser.add_argument("--pause-s", type=float, default=40.0)
    parser.add_argument("--keep-alive-s", type=float, default=60.0, help="the fixed window (spec keep_alive_s)")
    parser.add_argument("--trace", default="sporadic", choices=["bursty", "periodic", "sporadic"])
    parser.add_argument("--compress", type=float, default=2.0)
    parser.add_argument("--trace-s", type=float, default=300.0)
    parser.add_argument("--skip-trace", action="store_true")
    parser.add_argument("--verbose", action="store_true", help="also list the scaling decisions and their reasons")
    args = parser.parse_args()
    global VERBOSE
    VERBOSE = args.verbose
    workdir = Path(tempfile.mkdtemp(prefix="dilu-keepalive-"))

    def start(run: str) -> dict[str, Platform]:
        platforms = {"histogram": Platform(workdir / f"{run}-histogram"),
                     "fixed": Platform(workdir / f"{run}-fixed", env={"DILU_KEEPALIVE_MIN_SAMPLES": "1000000"})}
        source = shutil.copytree(ROOT / "examples" / "echo", workdir / f"noop-{time.monotonic_ns()}")
        (source / "model.yaml").write_text(SPEC.format(keep=args.keep_alive_s))
        for platform in platforms.values():
            assert platform.deploy_file(source / "model.yaml").status_code == 201
        for platform in platforms.values():
            platform.wait_ready("noop")
        return platforms

    runs = [("bursts", f"bursts: {args.bursts} x {args.burst_s:g} s at {args.rate:g} req/s, "
                       f"{args.pause_s:g} s pauses", burst_arrivals(args.bursts, args.burst_s, args.rate,
                                                                    args.pause_s))]
    runs = runs if args.bursts > 0 else []
    if not args.skip_trace:
        runs.append(("trace", f"trace: {args.trace}.txt compressed {args.compress:g}x, first {args.trace_s:g} s",
                     trace_arrivals(args.trace, args.compress, args.trace_s)))
    try:
        for run, title, arrivals in runs:
            platforms = start(run)
            try:
                report(title, asyncio.run(replay(platforms, arrivals)))
            finally:
                for platform in platforms.values():
                    platform.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
