"""The GPU proof: PyTorch workloads with and without the kernel-token shim (see gpu_check.sh).

Prints, each measured side by side in this one run:
- overhead: a matmul loop and a ResNet-style inference loop, without the shim and with the shim
  gated at 100 % (unlimited tokens); the token rate each reaches (blocks per second: the spread
  between workloads is why one capacity cannot serve them all open-loop);
- shares: the token managers run as in production, in their own process, with ONE capacity for
  every workload (the matmul's) and the closed loop on NVML's per-process device time. Achieved
  share = co-located it/s / alone it/s of each process, judged against its slice (absolute, not
  the split between the two): two matmuls at 30/70; two different models (ResNet inference at
  30 %, matmul at 70 %); a training loop fed by a DataLoader with worker processes at 50 %.
Latency isolation beside training is bench/collocation.py's (gpu_check.sh runs both).

    python bench/gpu_check.py [--seconds 10] [--smoke]      (--smoke: tiny CPU run of the harness)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from worker.tokens.manager import TokenManager, socket_path_for
from worker.tokens.process import ManagerProcess

SHIM = ROOT / "shim" / "build" / "libdilu_shim.so"
WORKLOADS = ROOT / "bench" / "gpu_workloads.py"


class Check:
    def __init__(self, seconds: float, smoke: bool) -> None:
        self.seconds = seconds
        self.flags = ["--device", "cpu", "--small"] if smoke else []
        self.tmp = Path(tempfile.mkdtemp(prefix="dilu-gpu-check-"))
        self.uuid = _gpu_uuid()
        self.capacity = 0.0

    def manager(self, capacity: float, production: bool = True) -> TokenManager | ManagerProcess:
        """A token manager for the GPU: as the worker runs it (own process, closed loop on NVML),
        or a plain in-process one (the calibration runs, where tokens are unlimited)."""
        name = f"GPU-check-{time.monotonic_ns()}"
        socket_path = socket_path_for(self.tmp, name)
        if production:
            manager = ManagerProcess(gpu_uuid=self.uuid or name, socket_path=socket_path, capacity_per_s=capacity,
                                     measure=True)
        else:
            manager = TokenManager(gpu_uuid=name, socket_path=socket_path, capacity_per_s=capacity)
        manager.start()
        return manager

    def start(self, workload: list[object], manager: TokenManager | None = None,
              instance: str = "-") -> subprocess.Popen:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "DILU_SHIM_LOG": "1"}
        if manager is not None:
            env.update({"LD_PRELOAD": str(SHIM), "DILU_TOKEN_SOCKET": str(manager.socket_path),
                        "DILU_INSTANCE_ID": instance})
        return subprocess.Popen([sys.executable, str(WORKLOADS), *map(str, workload), *self.flags], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    @staticmethod
    def result(process: subprocess.Popen) -> dict:
        stdout, stderr = process.communicate(timeout=900)
        if process.returncode != 0:
            raise RuntimeError(f"workload failed ({process.returncode}): {stderr[-2000:]}")
        return json.loads(stdout.strip().splitlines()[-1])

    def run(self, workload: list[object], manager: TokenManager | None = None, instance: str = "-") -> dict:
        return self.result(self.start(workload, manager, instance))

    def unlimited(self, workload: list[object]) -> tuple[dict, float]:
        """Runs under the shim with unlimited tokens; returns the result and the token rate."""
        manager = self.manager(1e15, production=False)
        manager.set_slice("cal", "batch", 1.0, 1.0)
        samples: list[tuple[float, int]] = []
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                view = manager.telemetry().get("cal")
                if view is not None:
                    samples.append((time.monotonic(), view["tokens"]))
                done.wait(0.25)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            result = self.run(workload, manager, "cal")
        finally:
            done.set()
            sampler.join()
            manager.stop()
        # The middle half of the run: past the warm-up, before the end.
        middle = samples[len(samples) // 4: max(len(samples) // 4 + 2, 3 * len(samples) // 4)]
        rate = (middle[-1][1] - middle[0][1]) / (middle[-1][0] - middle[0][0]) if len(middle) >= 2 and \
            middle[-1][0] > middle[0][0] else 0.0
        return result, rate

    # ---- the three checks ----
    def overhead(self) -> dict[str, float]:
        print("== overhead: without the shim vs with the shim at 100 % (alternating, 2 rounds)")
        rates: dict[str, float] = {}
        for workload in ("matmul", "resnet"):
            plain, shimmed, tokens = [], [], []
            for _ in range(2):
                plain.append(self.run([workload, self.seconds])["per_s"])
                result, rate = self.unlimited([workload, self.seconds])
                shimmed.append(result["per_s"])
                tokens.append(rate)
            base, gated = statistics.median(plain), statistics.median(shimmed)
            rates[workload] = statistics.median(tokens)
            print(f"{workload:<8} without {base:10.2f} it/s   with shim {gated:10.2f} it/s   "
                  f"overhead {100 * (1 - gated / base):6.2f} %   calibrated capacity {rates[workload]:,.0f} tokens/s")
            rates[f"{workload}_alone"] = base
            if rates[workload] <= 0:
                print(f"WARNING: the shim counted no launches for {workload}: interception did not work here, "
                      "so the shares below mean nothing")
        return rates

    def pair(self, title: str, capacity: float, runs: list[tuple[str, list[object], float]],
             alone: dict[str, float]) -> float:
        """Runs the workloads together under one manager, each at its slice; prints each one's
        achieved share (co-located it/s / alone it/s) against its slice; returns the worst error."""
        manager = self.manager(capacity or 1.0)
        try:
            for name, _, share in runs:
                manager.set_slice(name, "batch", share, share)
            started = [self.start(workload, manager, name) for name, workload, _ in runs]
            results = [self.result(process) for process in started]
            costs = {name: view.get("ns_per_token") for name, view in manager.telemetry().items()}
        finally:
            manager.stop()
        worst, parts = 0.0, []
        for (name, workload, share), result in zip(runs, results, strict=True):
            achieved = result["per_s"] / alone[str(workload[0])]
            worst = max(worst, abs(achieved - share) * 100)
            parts.append(f"{name} {100 * achieved:6.2f} % (slice {100 * share:.0f} %)")
        print(f"{title:<44} " + "   ".join(parts) + f"   worst error {worst:.2f} pp")
        if any(costs.values()):
            print(f"{'':<44} measured ns per token: " + ", ".join(f"{k} {v:,.1f}" for k, v in costs.items() if v))
        return worst

    def shares(self, capacity: float, alone: dict[str, float]) -> None:
        print(f"== shares: one capacity for every workload ({capacity:,.0f} tokens/s), closed loop on NVML, "
              "absolute shares of each process's alone speed")
        long = self.seconds * 1.5
        alone = {**alone, "loader": self.run(["loader", self.seconds])["per_s"]}
        worst = max(
            self.pair("two matmuls at 30/70", capacity,
                      [("a", ["matmul", long], 0.3), ("b", ["matmul", long], 0.7)], alone),
            self.pair("two models: ResNet inference 30, matmul 70", capacity,
                      [("resnet", ["resnet", long], 0.3), ("matmul", ["matmul", long], 0.7)], alone),
            self.pair("DataLoader training (2 workers) at 50", capacity,
                      [("loader", ["loader", long], 0.5)], alone))
        print(f"shares within 3 pp of every slice: {'met' if worst <= 3 else 'NOT met'} (worst {worst:.2f} pp)")


def _gpu_uuid() -> str | None:
    """The GPU's UUID, for NVML (None without nvidia-smi: the smoke run)."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.split()[0] if done.returncode == 0 and done.stdout.strip() else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--smoke", action="store_true", help="tiny CPU run that only checks the harness")
    args = parser.parse_args()
    check = Check(1.0 if args.smoke else args.seconds, args.smoke)
    started = time.monotonic()
    rates = check.overhead()
    check.capacity = rates["matmul"]
    check.shares(rates["matmul"], {"matmul": rates["matmul_alone"], "resnet": rates["resnet_alone"]})
    print(f"== done in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
