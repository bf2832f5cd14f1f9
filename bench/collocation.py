"""Latency isolation: a latency function beside a training loop on one GPU.

    python bench/collocation.py [--seconds 10]                the simulated GPU (fake driver)
    python bench/collocation.py --device gpu [--seconds 5]    a real GPU with PyTorch (gpu_check.sh)

For two loads of the latency function (one request at a time, busy about 30 % of the time alone;
and bursts whose requests queue), side by side in one run: its p50/p99 alone (without and under
the shim: the shim's cost on the latency path), beside the training loop without control, with
token-rate control alone (Dilu before isolation; open loop, where every token costs what the
device's capacity says, and with the closed loop on measured device time) and with Dilu's
isolation (hold, window, floor: ``dilu.policy.isolation``), and the training loop's throughput in
each case, over the same stretch of time as the requests. Ratios are to the latency function
alone, to training alone and to training beside the uncontrolled latency function.

The simulated GPU is the fake driver in its time-sliced mode (a GPU without MPS: one process's
kernels at a time, a 2 ms timeslice when both have work); the workloads are shim/build/collocate:
a request is 24 kernels of 100 us made of many small blocks (400 blocks of 250 ns: four times the
tokens per device-second of the training's kernels, as a batch-1 model's kernels differ from a
training step's), a training step 20 kernels of 300 us, synchronised. On a GPU they are
bench/gpu_workloads.py's ResNet-18 requests and ResNet-34 training steps.

Targets (issue 28): simulated, with control: p99 at most 1.1x alone and training at least 60 % of
its uncontrolled throughput at 30 % busy. GPU: p99 at most 1.2x alone and below uncontrolled,
training at least 50 % of its solo throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dilu.policy.isolation import IsolationParams
from worker.tokens.manager import socket_path_for
from worker.tokens.process import ManagerProcess

BUILD = ROOT / "shim" / "build"
SHIM = BUILD / "libdilu_shim.so"
LATENCY_SLICE = (0.5, 1.0)          # what gpu_check used before isolation, for a like-for-like row
TRAINING_SLICE = (0.5, 1.0)
WARM_UP_S = 1.5                     # training runs this long before the requests start


@dataclass(frozen=True)
class Load:
    name: str
    title: str
    args: tuple[str, ...]           # the serve command's pattern arguments
    requests: int


class FakeDevice:
    """The simulated GPU: the C clients on the fake driver, time-sliced like a GPU without MPS."""

    name = "simulated GPU (fake driver, time-sliced contexts, 2 ms slices)"
    uuid = None
    NS_PER_BLOCK = 1000
    REQUEST = ("24", "400")         # kernels, blocks: 2.4 ms of device time
    LATENCY_NS_PER_BLOCK = 250
    STEP = ("20", "300")            # 6 ms of device time per training step

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.capacity = 1e9 / self.NS_PER_BLOCK
        self.runs = 0

    def fresh_clock(self) -> None:
        """Each case on a device of its own (nothing queued from the case before)."""
        self.runs += 1

    def env(self) -> dict[str, str]:
        return {"LD_LIBRARY_PATH": str(BUILD / "fake"), "DILU_FAKE_NS_PER_BLOCK": str(self.NS_PER_BLOCK),
                "DILU_FAKE_CLOCK": str(self.tmp / f"clock-{self.runs}"), "DILU_FAKE_SCHED": "timeslice",
                "DILU_FAKE_TIMESLICE_US": "2000"}

    def loads(self, seconds: float) -> list[Load]:
        service_ms = 2.4
        gap_us = service_ms * 1000 * 7 / 3             # busy 30 % alone
        closed = Load("closed", "one request at a time, busy 30 % alone", ("closed", f"{gap_us:.0f}"),
                      int(seconds * 1000 / (service_ms / 0.3)))
        bursty = Load("bursty", "bursts of 16 requests arriving one service time apart, 150 ms between",
                      ("bursty", "16", "150", f"{service_ms * 1000:.0f}"), int(seconds * 1000 / (150 + 16 * 2.4) * 16))
        return [closed, bursty]

    def latency(self, load: Load) -> list[str]:
        return ["env", f"DILU_FAKE_NS_PER_BLOCK={self.LATENCY_NS_PER_BLOCK}", str(BUILD / "collocate"), "serve",
                str(load.requests), *self.REQUEST, *load.args]

    def training(self, seconds: float) -> list[str]:
        return [str(BUILD / "collocate"), "train", f"{seconds:.2f}", *self.STEP]


class RealGpu:
    """A GPU with PyTorch: bench/gpu_workloads.py's models."""

    name = "GPU"

    def __init__(self, tmp: Path, smoke: bool) -> None:
        self.tmp = tmp
        self.flags = ["--device", "cpu", "--small"] if smoke else []
        self.capacity = 0.0
        self.service_ms = 0.0
        self.name, self.uuid = _gpu_query("name") or "GPU", _gpu_query("uuid")

    def fresh_clock(self) -> None:
        pass

    def env(self) -> dict[str, str]:
        return {}

    def calibrate(self) -> None:
        """The latency function's service time alone sets the loads' gaps; the token capacity is
        what the training loop runs unlimited under the shim (as gpu_check calibrates it)."""
        result = _result(_start(self.latency(Load("probe", "", ("closed", "20000"), 60)), {}))
        self.service_ms = result["p50_ms"]
        self.capacity = _training_token_rate(self)

    def loads(self, seconds: float) -> list[Load]:
        service_ms = self.service_ms or 2.5
        gap_us = service_ms * 1000 * 7 / 3
        closed = Load("closed", "one request at a time, busy 30 % alone", ("closed", f"{gap_us:.0f}"),
                      int(seconds * 1000 / (service_ms / 0.3)))
        pause_ms = 16 * service_ms * 4
        bursty = Load("bursty", f"bursts of 16 requests arriving one service time apart, {pause_ms:.0f} ms between",
                      ("bursty", "16", f"{pause_ms:.0f}", f"{service_ms * 1000:.0f}"),
                      int(seconds * 1000 / (pause_ms + 16 * service_ms) * 16))
        return [closed, bursty]

    def latency(self, load: Load) -> list[str]:
        return [sys.executable, str(ROOT / "bench" / "gpu_workloads.py"), "serve", str(load.requests), *load.args,
                *self.flags]

    def training(self, seconds: float) -> list[str]:
        return [sys.executable, str(ROOT / "bench" / "gpu_workloads.py"), "train", f"{seconds:.2f}", *self.flags]


def _gpu_query(field: str) -> str | None:
    """A field of the first GPU from nvidia-smi (its uuid is what NVML's closed loop needs)."""
    try:
        done = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None


def _start(argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(argv, env={**os.environ, "PYTHONPATH": str(ROOT), "DILU_SHIM_LOG": "1", **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _lines(process: subprocess.Popen) -> list[dict]:
    stdout, stderr = process.communicate(timeout=900)
    if process.returncode != 0:
        raise RuntimeError(f"{process.args[1:3]} failed ({process.returncode}): {stderr[-2000:]}")
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def _result(process: subprocess.Popen) -> dict:
    return _lines(process)[-1]


def _rate_between(progress: list[dict], started: float, ended: float) -> float:
    """Training steps per second over [started, ended], from its progress lines."""
    inside = [p for p in progress if "t" in p and started <= p["t"] <= ended]
    if len(inside) < 2:
        return 0.0
    return (inside[-1]["steps"] - inside[0]["steps"]) / (inside[-1]["t"] - inside[0]["t"])


def _training_token_rate(device: RealGpu, seconds: float = 6.0) -> float:
    """Tokens per second the training loop consumes alone under the shim with unlimited tokens
    (what gpu_check calibrates the capacity with), sampled while it runs: past its first second."""
    manager = _manager(device, 1e15, isolation=True)
    samples: list[tuple[float, int]] = []
    try:
        manager.set_slice("cal", "batch", 1.0, 1.0)
        process = _start(device.training(seconds), _shimmed(device, manager, "cal"))
        started = time.monotonic()
        while process.poll() is None:
            view = manager.telemetry().get("cal")
            if view is not None and time.monotonic() - started > 1.0:
                samples.append((time.monotonic(), view["tokens"]))
            time.sleep(0.25)   # sampling a running process's counters
        _lines(process)
    finally:
        manager.stop()
    if len(samples) < 2 or samples[-1][0] <= samples[0][0] or samples[-1][1] <= samples[0][1]:
        print("WARNING: the shim counted no training launches: interception did not work here")
        return 1e7
    return (samples[-1][1] - samples[0][1]) / (samples[-1][0] - samples[0][0])


def _manager(device: FakeDevice | RealGpu, capacity: float, isolation: bool, measure: bool = True) -> ManagerProcess:
    """A token manager as the worker runs it: its own process, the closed loop on (fake) NVML
    unless ``measure`` is False."""
    name = f"GPU-collocation-{time.monotonic_ns()}"
    manager = ManagerProcess(gpu_uuid=device.uuid or name, socket_path=socket_path_for(device.tmp, name),
                             capacity_per_s=capacity, measure=measure, env=device.env(),
                             isolation=IsolationParams() if isolation else None,
                             log_level="WARNING")
    manager.start()
    return manager


def _shimmed(device: FakeDevice | RealGpu, manager: ManagerProcess, instance: str) -> dict[str, str]:
    return {**device.env(), "LD_PRELOAD": str(SHIM), "DILU_TOKEN_SOCKET": str(manager.socket_path),
            "DILU_INSTANCE_ID": instance}


@dataclass
class Row:
    name: str
    latency: dict | None = None
    training: float | None = None
    telemetry: dict | None = None


def alone(device: FakeDevice | RealGpu, load: Load, shim: bool) -> Row:
    device.fresh_clock()
    if not shim:
        return Row("latency alone", _result(_start(device.latency(load), device.env())))
    manager = _manager(device, device.capacity, isolation=True)
    try:
        manager.set_slice("lat", "latency", *LATENCY_SLICE)
        return Row("latency alone, under the shim", _result(_start(device.latency(load), _shimmed(device, manager,
                                                                                                  "lat"))))
    finally:
        manager.stop()


CONTROLS = {"none": "beside training, no control",
            "tokens-open": "beside training, tokens, open loop",
            "tokens": "beside training, token-rate control",
            "isolation": "beside training, Dilu isolation"}


def beside_training(device: FakeDevice | RealGpu, load: Load, control: str, seconds: float) -> Row:
    """``control``: one of CONTROLS: none; token-rate control alone (Dilu before isolation), with
    its closed loop on measured device time or open loop (every token costs what the capacity
    says, as before the loop existed); isolation."""
    device.fresh_clock()
    manager = None if control == "none" else _manager(device, device.capacity, isolation=control == "isolation",
                                                      measure=control != "tokens-open")
    try:
        if manager is not None:
            manager.set_slice("lat", "latency", *LATENCY_SLICE)
            manager.set_slice("train", "batch", *TRAINING_SLICE)
        plain = device.env()
        training = _start(device.training(seconds * 3 + WARM_UP_S + 5),
                          plain if manager is None else _shimmed(device, manager, "train"))
        time.sleep(WARM_UP_S)   # a benchmark's warm-up: the training loop is in its stride
        serving = _start(device.latency(load), plain if manager is None else _shimmed(device, manager, "lat"))
        telemetry = None
        while serving.poll() is None:      # the manager's view of both, while both are registered
            telemetry = manager.telemetry() if manager is not None else None
            time.sleep(0.5)
        latency = _result(serving)
        training.terminate()
        progress = _lines_after_terminate(training)
    finally:
        if manager is not None:
            manager.stop()
    return Row(CONTROLS[control], latency, _rate_between(progress, latency["started"], latency["ended"]), telemetry)


def _lines_after_terminate(process: subprocess.Popen) -> list[dict]:
    stdout, _ = process.communicate(timeout=60)
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def training_alone(device: FakeDevice | RealGpu, seconds: float) -> float:
    device.fresh_clock()
    progress = _lines(_start(device.training(seconds + 1), device.env()))
    samples = [p for p in progress if "t" in p]
    return _rate_between(samples, samples[0]["t"] + 0.5, samples[-1]["t"]) if len(samples) > 2 else 0.0


def table(load: Load, rows: list[Row], solo: float) -> list[str]:
    base = rows[0].latency
    uncontrolled = next(r.training for r in rows if r.name.endswith("no control"))
    out = [f"== {load.title}",
           f"{'case':<38}{'p50 ms':>9}{'p99 ms':>9}{'p50/alone':>11}{'p99/alone':>11}"
           f"{'train it/s':>12}{'/solo':>8}{'/uncontrolled':>15}"]
    out.append(f"{'training alone':<38}{'':>9}{'':>9}{'':>11}{'':>11}{solo:>12.2f}{1.0:>7.2f}x{'':>15}")
    for row in rows:
        lat = row.latency
        cells = f"{lat['p50_ms']:>9.3f}{lat['p99_ms']:>9.3f}{lat['p50_ms'] / base['p50_ms']:>10.2f}x" \
                f"{lat['p99_ms'] / base['p99_ms']:>10.2f}x"
        if row.training is not None:
            cells += f"{row.training:>12.2f}{row.training / solo:>7.2f}x{row.training / uncontrolled:>14.2f}x"
        out.append(f"{row.name:<38}{cells}")
    return out


def verdicts(device: FakeDevice | RealGpu, load: Load, rows: list[Row], solo: float) -> list[str]:
    by = {r.name: r for r in rows}
    alone_p99 = by["latency alone"].latency["p99_ms"]
    ours = by["beside training, Dilu isolation"]
    free = by["beside training, no control"]
    shimmed, plain = by["latency alone, under the shim"].latency, by["latency alone"].latency
    lines = [f"shim cost on the latency path alone: {100 * (shimmed['p50_ms'] / plain['p50_ms'] - 1):+.1f} % at p50, "
             f"{100 * (shimmed['p99_ms'] / plain['p99_ms'] - 1):+.1f} % at p99"]
    ratio = ours.latency["p99_ms"] / alone_p99
    if isinstance(device, FakeDevice):
        lines.append(f"target p99 <= 1.1x alone: {'met' if ratio <= 1.1 else 'NOT met'} ({ratio:.2f}x)")
        if load.name == "closed":
            kept = ours.training / free.training
            lines.append(f"target training >= 60 % of uncontrolled at 30 % busy: {'met' if kept >= 0.6 else 'NOT met'} "
                         f"({100 * kept:.0f} %)")
    else:
        below = ours.latency["p99_ms"] < free.latency["p99_ms"]
        lines.append(f"target p99 <= 1.2x alone and below uncontrolled: "
                     f"{'met' if ratio <= 1.2 and below else 'NOT met'} ({ratio:.2f}x; uncontrolled "
                     f"{free.latency['p99_ms'] / alone_p99:.2f}x)")
        kept = ours.training / solo if solo else 0.0
        lines.append(f"target training >= 50 % of solo: {'met' if kept >= 0.5 else 'NOT met'} ({100 * kept:.0f} %)")
    for row in rows:
        lat, train = (row.telemetry or {}).get("lat"), (row.telemetry or {}).get("train")
        if lat and train:
            lines.append(f"{row.name}: latency waited for tokens {lat['blocked_ms']:.0f} ms; training waited for "
                         f"tokens {train['blocked_ms']:.0f} ms, held {train.get('held_ms', 0):.0f} ms "
                         f"(window {train.get('window_tokens', 0)} tokens); batch factor {train['batch_factor']}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["fake", "gpu"], default="fake")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long each case serves requests")
    parser.add_argument("--loads", default="closed,bursty")
    parser.add_argument("--smoke", action="store_true", help="GPU mode on the CPU, to check the harness")
    args = parser.parse_args()
    subprocess.run(["make", "-s", "-C", str(ROOT / "shim")], check=True)
    tmp = Path(tempfile.mkdtemp(prefix="dilu-collocation-"))
    device: FakeDevice | RealGpu = FakeDevice(tmp) if args.device == "fake" else RealGpu(tmp, args.smoke)
    if isinstance(device, RealGpu):
        device.calibrate()
    started = time.monotonic()
    print(f"device: {device.name}")
    solo = training_alone(device, args.seconds)
    for load in device.loads(args.seconds):
        if load.name not in args.loads.split(","):
            continue
        rows = [alone(device, load, shim=False), alone(device, load, shim=True)]
        rows += [beside_training(device, load, control, args.seconds) for control in CONTROLS]
        print("\n".join(table(load, rows, solo)))
        print("\n".join(verdicts(device, load, rows, solo)))
        print()
    print(f"== done in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
