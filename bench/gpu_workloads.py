"""PyTorch workloads for bench/gpu_check.py; each runs in its own process and prints one JSON line.

    python bench/gpu_workloads.py matmul SECONDS      4096x4096 matmuls, synchronised every 10
    python bench/gpu_workloads.py resnet SECONDS      ResNet-34-style inference, batch 32 at 112 px
    python bench/gpu_workloads.py train SECONDS       ResNet-34-style training steps, batch 64; prints
                                                      {"t", "steps"} every 50 ms as it goes
    python bench/gpu_workloads.py loader SECONDS      the same, fed by a DataLoader with 2 worker processes
    python bench/gpu_workloads.py serve REQUESTS closed GAP_US
    python bench/gpu_workloads.py serve REQUESTS bursty BURST PAUSE_MS SPACING_US
        ResNet-18-style batch-1 requests, as shim/tests/collocate.c serves them (its header says
        how): p50/p99 latency, bracketed with the shim's request API when it is preloaded

The models are examples/resnet's (built in code, nothing downloaded).

``--device cpu --small`` runs tiny versions on the CPU (to check the harness without a GPU).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "resnet"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from handler import ResNet  # examples/resnet/handler.py

SIZE = 112


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def models(small: bool) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(the throughput model, the latency model)."""
    if small:
        return ResNet(10, 8, (1, 1)), ResNet(10, 8, (1, 1))
    return ResNet(1000, 64, (3, 4, 6, 3)), ResNet(1000, 64, (2, 2, 2, 2))


def timed_loop(seconds: float, step, device: str, sync_every: int = 10, progress: bool = False) -> dict:
    for _ in range(3):
        step()
    sync(device)
    started, iterations, next_report = time.perf_counter(), 0, 0.0
    while time.perf_counter() - started < seconds:
        step()
        iterations += 1
        if iterations % sync_every == 0:
            sync(device)
            if progress and time.monotonic() >= next_report:
                print(json.dumps({"t": time.monotonic(), "steps": iterations}), flush=True)
                next_report = time.monotonic() + 0.05
    sync(device)
    elapsed = time.perf_counter() - started
    return {"iterations": iterations, "seconds": elapsed, "per_s": iterations / elapsed}


class _Images(torch.utils.data.Dataset):
    """Synthetic images made on the CPU by the DataLoader's workers (forked processes of the
    instance: under the shim they belong to the same instance)."""

    def __init__(self, size: int, classes: int) -> None:
        self.size, self.classes = size, classes

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        generator = torch.Generator().manual_seed(index)
        return torch.randn(3, self.size, self.size, generator=generator), index % self.classes


def loader_training(seconds: float, device: str, small: bool) -> dict:
    model = models(small)[0].to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    size, classes = (16, 10) if small else (SIZE, 1000)
    loader = iter(torch.utils.data.DataLoader(_Images(size, classes), batch_size=4 if small else 64, num_workers=2,
                                              pin_memory=device == "cuda", persistent_workers=True))

    def step() -> None:
        images, labels = next(loader)
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(images), labels).backward()
        optimizer.step()

    return timed_loop(seconds, step, device, sync_every=1)


class RequestApi:
    """The shim's request API, as Dilu's instance server calls it; nothing without the shim."""

    def __init__(self) -> None:
        import ctypes

        process = ctypes.CDLL(None)
        self.begin = getattr(process, "dilu_request_begin", None)
        self.end = getattr(process, "dilu_request_end", None)


def arrivals(requests: int, pattern: list[str], started: float) -> list[float] | None:
    """Arrival times of a bursty load (seeded), or None for one request at a time."""
    if pattern[0] != "bursty":
        return None
    import random

    burst, pause, spacing = int(pattern[1]), float(pattern[2]) / 1e3, float(pattern[3]) / 1e6
    rng, at, times = random.Random(12345), started, []
    for index in range(requests):
        at += pause if index and index % burst == 0 else (rng.expovariate(1 / spacing) if index else 0.0)
        times.append(at)
    return times


def serve(requests: int, pattern: list[str], device: str, small: bool) -> dict:
    model = models(small)[1].to(device).eval()
    sample = torch.randn(1, 3, 16 if small else SIZE, 16 if small else SIZE, device=device)
    api = RequestApi()
    latencies, busy = [], 0.0
    with torch.inference_mode():
        for _ in range(5):
            model(sample)
        sync(device)
        started = time.monotonic() + 0.01
        times = arrivals(requests, pattern, started)
        gap = float(pattern[1]) / 1e6 if times is None else 0.0
        begun = 0
        for index in range(requests):
            arrival = times[index] if times else time.monotonic()
            if times and time.monotonic() < arrival:
                time.sleep(arrival - time.monotonic())
            serving = time.monotonic()
            arrived = sum(1 for t in times[begun:] if t <= time.monotonic()) if times else 1
            for _ in range(arrived):              # each arrived request is in flight from now
                if api.begin:
                    api.begin()
            begun += arrived
            model(sample)
            sync(device)
            done = time.monotonic()
            if api.end:
                api.end()
            latencies.append((done - arrival) * 1000)
            busy += done - serving
            if gap:
                time.sleep(max(0.0, done + gap - time.monotonic()))
        ended = time.monotonic()
    ordered = sorted(latencies)
    return {"requests": len(ordered), "p50_ms": statistics.median(ordered),
            "p90_ms": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
            "p99_ms": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], "max_ms": ordered[-1],
            "busy": busy / (ended - started), "started": started, "ended": ended, "request_api": bool(api.begin)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workload", choices=["matmul", "resnet", "train", "loader", "serve"])
    parser.add_argument("amount", type=float)
    parser.add_argument("pattern", nargs="*", help="serve: closed GAP_US | bursty BURST PAUSE_MS SPACING_US")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true")
    args = parser.parse_args()
    device, small = args.device, args.small
    torch.manual_seed(0)
    if device == "cuda":
        torch.backends.cudnn.benchmark = True
    if args.workload == "matmul":
        n = 256 if small else 4096
        a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
        result = timed_loop(args.amount, lambda: a @ b, device)
    elif args.workload == "resnet":
        model = models(small)[0].to(device).eval()
        batch = torch.randn(4 if small else 32, 3, 16 if small else SIZE, 16 if small else SIZE, device=device)

        def infer() -> None:
            with torch.inference_mode():
                model(batch)

        result = timed_loop(args.amount, infer, device, sync_every=2)
    elif args.workload == "train":
        model = models(small)[0].to(device).train()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        batch = torch.randn(4 if small else 64, 3, 16 if small else SIZE, 16 if small else SIZE, device=device)
        labels = torch.randint(0, 10 if small else 1000, (batch.shape[0],), device=device)

        def step() -> None:
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(batch), labels).backward()
            optimizer.step()

        result = timed_loop(args.amount, step, device, sync_every=1, progress=True)
    elif args.workload == "loader":
        result = loader_training(args.amount, device, small)
    else:
        result = serve(int(args.amount), args.pattern or ["closed", "20000"], device, small)
    sys.stdout.write(json.dumps({"workload": args.workload, **result}) + "\n")


if __name__ == "__main__":
    main()
