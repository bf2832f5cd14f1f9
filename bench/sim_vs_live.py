"""The simulator checked against the platform: one trace replayed on a real `dilu up` and in
`dilu simulate`'s serving model, with the same functions, their measured service times and cold
starts, side by side.

    python bench/sim_vs_live.py [--seconds 240] [--compress 4] [--seed 3]

Three CPU functions (a handler that sleeps a known time per batch: 100, 200 and 400 ms plus 10 ms per
request; batches up to 4; loading takes 1 s; SLO p99 2.5x the batch-1 time; keep-alive 10 s; at
most 3 instances) get
arrivals from the `bursty`, `periodic` and `sporadic` rate shapes, time-compressed and scaled so
that their busiest seconds ask about 1.5x what one instance serves. A fourth streams text: each
step sleeps 40 ms plus 5 ms per stream in the running batch (up to 4 streams), each stream's
length is drawn from the Azure LLM conversation trace's output tokens (a tenth of them, at most
60), its arrivals follow `bursty`; its SLO is on the time to the first token (3x a step of 4),
and it scales by occupancy (4 streams per instance), as a text generator does. Every request is sent to the
live platform at its time; the same arrivals go through `simulate_serving` with the `dilu` policy,
each function's profile built from what the platform measured (its warm service time at batch 1,
the handler's known growth per request, and its cold start, creation to ready).

Printed per function and in all: SLO violations (over the SLO, failed, or never answered), cold
starts (starts a request waited for: the live platform's "scale from zero" decisions), instance
starts, and instance-seconds held (starting or ready; sampled every 0.2 s live, every tick in the
simulator); the ratio simulator / live, and whether it is within 25 %.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dilu.policy.profiler import Profile, TableRunner
from dilu.sim.models import ModelProfile
from dilu.sim.policies import build_policies
from dilu.sim.serving import ServingSetup, simulate_serving
from dilu.sim.traces import from_rates, generated_tokens
from tests.platform import Platform  # the harness that runs `dilu up`
from tests.waiting import eventually

BATCH = 4
PER_ITEM_S = 0.01
KEEP_ALIVE_S = 10.0
LOAD_S = 1.0
MAX_INSTANCES = 3
TIMELINE = False
EVENTS = False
FUNCTIONS = (("fast", 0.10, "bursty"), ("medium", 0.20, "periodic"), ("slow", 0.40, "sporadic"))
HANDLER = '''"""Sleeps a known time per batch: the service time the benchmark compares against."""
import time


class Sleeper:
    def __init__(self, base_s=0.05, per_item_s=0.005, load_s=1.0):
        self.base_s, self.per_item_s, self.load_s = float(base_s), float(per_item_s), float(load_s)

    def load(self):
        time.sleep(self.load_s)   # a model's weights being read

    def predict(self, inputs):
        time.sleep(self.base_s + self.per_item_s * len(inputs))
        return list(inputs)
'''
STREAM = ("stream", 0.04, 0.005, "bursty")   # name, step, per stream in the batch, rate shape
STREAM_HANDLER = '''"""Streams text: each step sleeps a known time, longer with more streams in the batch."""
import time

from dilu import Last


class Streamer:
    def __init__(self, step_s=0.04, per_stream_s=0.005, load_s=1.0):
        self.step_s, self.per_stream_s, self.load_s = float(step_s), float(per_stream_s), float(load_s)

    def load(self):
        time.sleep(self.load_s)

    def start(self, request):
        return {"left": int(request.get("max_new_tokens", 16))}

    def step(self, states):
        time.sleep(self.step_s + self.per_stream_s * len(states))
        chunks = []
        for state in states:
            state["left"] -= 1
            chunks.append(Last({"text": "x"}) if state["left"] <= 0 else {"text": "x"})
        return chunks

    def finish(self, chunks):
        return {"text": "".join(c["text"] for c in chunks)}
'''
SPEC = """name: {name}
handler: {handler}{generates}
model: {model}
slo:
  p99_ms: {slo_ms}
resources: {{memory: 256Mi, gpu: false{pinned}}}
scaling: {{min_instances: 0, max_instances: {max_instances}, keep_alive_s: {keep}}}
batching: {{max_batch_size: {batch}, max_wait_ms: 0}}
"""


@dataclass
class Tally:
    arrivals: int = 0
    violations: int = 0
    latencies: list[float] = field(default_factory=list)
    instance_s: float = 0.0
    cold_starts: int = 0
    starts: int = 0
    timeline: list[tuple[float, float, int]] = field(default_factory=list)   # (sent at, latency, instances then)


def slo_s(base: float) -> float:
    return 2.5 * (base + PER_ITEM_S)


def stream_slo_s() -> float:
    """The stream's SLO, on its first token: three steps of a full batch."""
    _, step, per_stream, _ = STREAM
    return 3 * (step + per_stream * BATCH)


def stream_tokens(count: int, seed: int) -> np.ndarray:
    return generated_tokens(count, np.random.default_rng(seed), trace="azure-conv", scale=0.1, cap=60)


def arrivals_for(shape: str, capacity: float, seconds: float, compress: float, seed: int) -> np.ndarray:
    """Poisson arrivals following a rate shape, ``compress`` x faster, scaled so that its busiest
    seconds (95th percentile) ask 1.5 x ``capacity``."""
    rates = np.array([float(x) for x in (ROOT / "data" / "traces" / "rps" / f"{shape}.txt").read_text().split()])
    squeezed = np.array([rates[int(i * compress):int((i + 1) * compress)].mean()
                         for i in range(int(len(rates) / compress))])[:int(seconds)]
    busy = max(float(np.percentile(squeezed, 95)), 1e-9)
    return from_rates(squeezed * 1.5 * capacity / busy, np.random.default_rng(seed))


def write_functions(folder: Path) -> list[Path]:
    specs = []
    for name, base, _ in FUNCTIONS:
        source = folder / name
        source.mkdir(parents=True)
        (source / "handler.py").write_text(HANDLER)
        (source / "request.json").write_text("[0]")   # the sample profiling sends
        model = {"base_s": base, "per_item_s": PER_ITEM_S, "load_s": LOAD_S}
        (source / "model.yaml").write_text(SPEC.format(name=name, handler="handler:Sleeper", generates="",
                                                       model=json.dumps(model), slo_ms=round(slo_s(base) * 1000),
                                                       pinned="", keep=KEEP_ALIVE_S, max_instances=MAX_INSTANCES,
                                                       batch=BATCH))
        specs.append(source / "model.yaml")
    name, step, per_stream, _ = STREAM
    source = folder / name
    source.mkdir(parents=True)
    (source / "handler.py").write_text(STREAM_HANDLER)
    model = {"step_s": step, "per_stream_s": per_stream, "load_s": LOAD_S}
    (source / "model.yaml").write_text(SPEC.format(name=name, handler="handler:Streamer", generates="\ngenerates: text",
                                                   model=json.dumps(model), slo_ms=round(stream_slo_s() * 1000),
                                                   pinned=", sm_request: 0.1, sm_limit: 0.2", keep=KEEP_ALIVE_S,
                                                   max_instances=MAX_INSTANCES, batch=BATCH))
    specs.append(source / "model.yaml")
    return specs


def stream_request(name: str, tokens: int) -> dict:
    """The arguments of ``client.stream`` for a stream of ``tokens`` tokens, as server-sent events."""
    return {"method": "POST", "url": f"/v1/functions/{name}/invoke", "json": {"max_new_tokens": tokens},
            "headers": {"accept": "text/event-stream"}}


def measure_stream(platform: Platform) -> tuple[float, float, float]:
    """The stream's time to its first token and per later token, alone (medians of 10 streams of
    20 tokens, from the client), and its cold start."""
    name = STREAM[0]
    firsts, steps = [], []
    for _ in range(10):
        began = time.perf_counter()
        with platform.http.stream(**stream_request(name, 20)) as reply:
            stamps = [time.perf_counter() for line in reply.iter_lines() if line.startswith("data: {")]
        firsts.append(stamps[0] - began)
        steps.append((stamps[-1] - stamps[0]) / (len(stamps) - 1))
    instance = [i for i in platform.instances(name) if i["ready_at"]][0]
    cold = (datetime.fromisoformat(instance["ready_at"]) - datetime.fromisoformat(instance["created_at"]))
    return statistics.median(firsts), statistics.median(steps), cold.total_seconds()


def measure(platform: Platform, name: str) -> tuple[float, float, dict | None]:
    """The function's warm time at batch 1 (median of 15, one at a time, from the client), its
    cold start (creation to ready of the serving instance its deploy started), and its profile."""
    times = []
    for index in range(15):
        began = time.perf_counter()
        assert platform.invoke(name, [index]).status_code == 200
        times.append(time.perf_counter() - began)
    instance = [i for i in platform.instances(name) if i["role"] == "serve" and i["ready_at"]][0]
    cold = (datetime.fromisoformat(instance["ready_at"]) - datetime.fromisoformat(instance["created_at"]))
    profile = platform.function(name).get("profile")
    return statistics.median(times), cold.total_seconds(), profile if (profile or {}).get("status") == "done" else None


async def replay(platform: Platform, arrivals: dict[str, np.ndarray], tokens: np.ndarray) -> dict[str, Tally]:
    tallies = {name: Tally(arrivals=len(times)) for name, times in arrivals.items()}
    limits = {**{name: slo_s(base) for name, base, _ in FUNCTIONS}, STREAM[0]: stream_slo_s()}
    done = asyncio.Event()
    counts = {name: 1 for name in arrivals}
    started = time.perf_counter()
    async with httpx.AsyncClient(base_url=platform.url, timeout=60,
                                 limits=httpx.Limits(max_connections=400, max_keepalive_connections=400)) as client:
        async def sample() -> None:
            last = time.monotonic()
            while not done.is_set():
                await asyncio.sleep(0.2)
                now = time.monotonic()
                for name in arrivals:
                    view = (await client.get(f"/v1/functions/{name}")).json()
                    counts[name] = view["ready_instances"]
                    tallies[name].instance_s += (view["ready_instances"] + view["starting_instances"]) * (now - last)
                last = now

        async def one(name: str, index: int) -> None:
            began = time.perf_counter()
            try:
                if name == STREAM[0]:   # its latency is its first token's; it must end with [DONE]
                    ok, latency = False, None
                    async with client.stream(**stream_request(name, int(tokens[index]))) as reply:
                        async for line in reply.aiter_lines():
                            if latency is None and line.startswith("data: {"):
                                latency = time.perf_counter() - began
                            ok = ok or line == "data: [DONE]"
                    ok = ok and reply.status_code == 200
                else:
                    reply = await client.post(f"/v1/functions/{name}/invoke", json=[index])
                    ok, latency = reply.status_code == 200, None
            except httpx.HTTPError:
                ok, latency = False, None
            latency = time.perf_counter() - began if latency is None else latency
            tallies[name].latencies.append(latency)
            tallies[name].timeline.append((began - started, latency, counts[name]))
            tallies[name].violations += (not ok) or latency > limits[name]

        schedule = sorted((float(t), name, k) for name, times in arrivals.items() for k, t in enumerate(times))
        replay_began = datetime.now(UTC)
        sampler = asyncio.create_task(sample())
        began, pending = time.monotonic(), []
        for offset, name, index in schedule:
            await asyncio.sleep(max(0.0, began + offset - time.monotonic()))
            pending.append(asyncio.create_task(one(name, index)))
        await asyncio.gather(*pending)
        done.set()
        await sampler
        for name in arrivals:
            events = (await client.get(f"/v1/functions/{name}/events", params={"limit": 10000})).json()
            # Only the replay's: the deploy's own start and the measures' wake-ups came before it.
            during = [e for e in events if datetime.fromisoformat(e["at"].replace("Z", "+00:00")) >= replay_began]
            if EVENTS:
                for e in during:
                    print(f"  {name} {e['at'][11:23]} {e['action']}: {e['reason']}")
            ups = [e for e in during if e["action"] == "scale-up"]
            tallies[name].starts = len(ups)
            tallies[name].cold_starts = sum(1 for e in ups if e["reason"].startswith("scale from zero"))
    return tallies


def simulated(arrivals: dict[str, np.ndarray], measured: dict[str, tuple[float, float, dict | None]],
              seconds: float, tokens: np.ndarray, stream: tuple[float, float, float]) -> dict[str, Tally]:
    """Each function alone through the simulator (so that its figures are its own), with the
    platform's measured times and, where the platform profiled it, its profile's batch (the lazy
    scaler then runs, as on the platform)."""
    tallies = {}
    for name, base, _ in FUNCTIONS:
        warm, cold, live_profile = measured[name]
        batch = int(live_profile["batch"]) if live_profile else BATCH
        overhead = max(0.0, warm - (base + PER_ITEM_S))   # gateway, HTTP and the instance's own path
        rows = [(b, sm, base + PER_ITEM_S * b + overhead, b / (base + PER_ITEM_S * b + overhead))
                for b in range(1, BATCH + 1) for sm in (1, 100)]
        at_batch = base + PER_ITEM_S * batch + overhead
        # The scaling yardstick is what the platform's profiling measured, as the controller uses it.
        throughput = float(live_profile["throughput_per_s"]) if live_profile else batch / at_batch
        profile = Profile(kind="inference", sm_request=0.1, sm_limit=0.1, batch=batch,
                          throughput_per_s=throughput, latency_s=at_batch, trials=0)
        model = ModelProfile(name=name, table=TableRunner(rows), slo_s=slo_s(base), profile=profile, memory_gb=0.25,
                             bound=BATCH)
        setup = ServingSetup(arrivals=arrivals[name], models=(model,), per_function=(arrivals[name],),
                             gpus=4, gpus_per_node=4, trainings=0, tick_s=0.01, cold_start_s=cold,
                             keep_alive_s=KEEP_ALIVE_S, max_instances=MAX_INSTANCES, duration_s=seconds + 30,
                             profiled=live_profile is not None)
        tallies[name] = _tally(simulate_serving(build_policies()["dilu"], setup))
    # The stream: a step's time is what the platform measured per token alone, plus the handler's
    # known growth per stream in the batch; pinned, so it scales by occupancy (no profile).
    name, step, per_stream, _ = STREAM
    first, per_token, cold = stream
    rows = [(b, sm, per_token + per_stream * (b - 1), b / (per_token + per_stream * (b - 1)))
            for b in range(1, BATCH + 1) for sm in (1, 100)]
    profile = Profile(kind="inference", sm_request=0.1, sm_limit=0.1, batch=BATCH, throughput_per_s=0.0,
                      latency_s=first, trials=0)
    model = ModelProfile(name=name, table=TableRunner(rows), slo_s=stream_slo_s(), profile=profile, memory_gb=0.25,
                         bound=BATCH, generates=True)
    setup = ServingSetup(arrivals=arrivals[name], models=(model,), per_function=(arrivals[name],), tokens=(tokens,),
                         gpus=4, gpus_per_node=4, trainings=0, tick_s=0.01, cold_start_s=cold,
                         keep_alive_s=KEEP_ALIVE_S, max_instances=MAX_INSTANCES, duration_s=seconds + 30,
                         profiled=False)
    tallies[name] = _tally(simulate_serving(build_policies()["dilu"], setup))
    return tallies


def _tally(result) -> Tally:
    return Tally(arrivals=result.arrivals, violations=result.violations, latencies=list(result.latencies),
                 instance_s=result.instance_seconds, cold_starts=result.cold_starts, starts=result.starts)


def ratio(sim: float, live: float) -> str:
    if live == 0:
        return "equal" if sim == 0 else "live 0"
    value = sim / live
    return f"{value:.2f}{'' if abs(value - 1) <= 0.25 else ' !'}"


def report(live: dict[str, Tally], sim: dict[str, Tally], measured: dict[str, tuple[float, float]]) -> None:
    print(f"{'function':<9}{'warm ms':>8}{'cold s':>7}  {'SLO viol live/sim':>19} {'ratio':>6}  "
          f"{'cold starts':>11} {'ratio':>6}  {'starts':>7}  {'instance-s live/sim':>20} {'ratio':>6}")
    names = [name for name, _, _ in FUNCTIONS] + [STREAM[0]]
    rows = [(n, live[n], sim[n]) for n in names]
    total_live = Tally(sum(t.arrivals for t in live.values()), sum(t.violations for t in live.values()), [],
                       sum(t.instance_s for t in live.values()), sum(t.cold_starts for t in live.values()),
                       sum(t.starts for t in live.values()))
    total_sim = Tally(sum(t.arrivals for t in sim.values()), sum(t.violations for t in sim.values()), [],
                      sum(t.instance_s for t in sim.values()), sum(t.cold_starts for t in sim.values()),
                      sum(t.starts for t in sim.values()))
    for name, a, b in rows + [("all", total_live, total_sim)]:
        warm, cold, _ = measured.get(name, (float("nan"), float("nan"), None))
        va, vb = a.violations / max(1, a.arrivals), b.violations / max(1, b.arrivals)
        print(f"{name:<9}{warm * 1000:>8.1f}{cold:>7.2f}  {va:>9.2%}/{vb:<9.2%} {ratio(vb, va):>6}  "
              f"{a.cold_starts:>5}/{b.cold_starts:<5} {ratio(b.cold_starts, a.cold_starts):>6}  "
              f"{a.starts:>3}/{b.starts:<3}  {a.instance_s:>9.1f}/{b.instance_s:<10.1f} "
              f"{ratio(b.instance_s, a.instance_s):>6}")
    for name, a, b in rows:
        if a.latencies and b.latencies:
            live_p = np.percentile(a.latencies, [50, 99]) * 1000
            sim_p = np.percentile(b.latencies, [50, 99]) * 1000
            print(f"  {name}: latency p50 {live_p[0]:.0f}/{sim_p[0]:.0f} ms, p99 {live_p[1]:.0f}/{sim_p[1]:.0f} ms "
                  f"(live/sim); {a.arrivals} requests")
    print("ratios are simulator / live; '!' marks one more than 25 % apart")
    if TIMELINE:
        for name, a, _ in rows:
            seconds: dict[int, list[tuple[float, int]]] = {}
            for at, latency, ready in a.timeline:
                seconds.setdefault(int(at), []).append((latency, ready))
            print(f"  {name} per second (sent, max latency ms, ready instances): " + " ".join(
                f"{s}:{len(v)}/{max(x for x, _ in v) * 1000:.0f}/{v[-1][1]}" for s, v in sorted(seconds.items())))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=240.0, help="length of the replay")
    parser.add_argument("--compress", type=float, default=4.0, help="trace seconds per replayed second")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--timeline", action="store_true", help="also print the live run second by second")
    parser.add_argument("--events", action="store_true", help="also print the live scaling events of the replay")
    parser.add_argument("--unprofiled", action="store_true", help="deploy without profiling: the functions then "
                        "scale by concurrency instead of the lazy scaler")
    args = parser.parse_args()
    global TIMELINE, EVENTS
    TIMELINE, EVENTS = args.timeline, args.events
    workdir = Path(tempfile.mkdtemp(prefix="dilu-simlive-"))
    platform = Platform(workdir / "home", env={} if args.unprofiled else
                        {"DILU_PROFILING": "true", "DILU_PROFILE_TRIAL_S": "0.4"})
    try:
        specs = write_functions(workdir)
        for spec in specs:
            assert platform.deploy_file(spec).status_code == 201, spec
        for name in [name for name, _, _ in FUNCTIONS] + [STREAM[0]]:
            # Deployed (its verifying instance may have gone idle since: the measures wake it).
            eventually(lambda name=name: platform.function(name)["status"] == "ready", timeout=300,
                       what=f"{name} deployed")
        measured = {name: measure(platform, name) for name, _, _ in FUNCTIONS}
        stream = measure_stream(platform)
        arrivals = {name: arrivals_for(shape, BATCH / (base + PER_ITEM_S * BATCH), args.seconds, args.compress,
                                       args.seed + k)
                    for k, (name, base, shape) in enumerate(FUNCTIONS)}
        name, step, per_stream, shape = STREAM
        tokens = stream_tokens(100_000, args.seed)
        mean_s = float(np.mean(tokens)) * (step + per_stream * BATCH)   # a stream's time in a full batch
        arrivals[name] = arrivals_for(shape, BATCH / mean_s, args.seconds, args.compress, args.seed + len(FUNCTIONS))
        tokens = tokens[:len(arrivals[name])]
        print(f"{name}: first token {stream[0] * 1000:.0f} ms, {stream[1] * 1000:.0f} ms per token alone, cold start "
              f"{stream[2]:.2f} s; {len(tokens)} streams of {np.mean(tokens):.1f} tokens on average")
        for name, (warm, cold, profile) in measured.items():
            print(f"{name}: warm {warm * 1000:.0f} ms, cold start {cold:.2f} s, "
                  + (f"profiled: batch {profile['batch']}, {profile['throughput_per_s']:.1f} req/s" if profile
                     else "not profiled"))
        print(f"replaying {sum(len(a) for a in arrivals.values())} requests over {args.seconds:g} s "
              f"({', '.join(f'{n}: {shape}' for n, _, shape in FUNCTIONS)}, compressed {args.compress:g}x)",
              flush=True)
        live = asyncio.run(replay(platform, arrivals, tokens))
    finally:
        platform.close()
        shutil.rmtree(workdir, ignore_errors=True)
    measured[STREAM[0]] = (stream[0], stream[2], None)
    report(live, simulated(arrivals, measured, args.seconds, tokens, stream), measured)


if __name__ == "__main__":
    main()
