"""PyTorch workloads for bench/gpu_check.py; each runs in its own process and prints one JSON line.

    python bench/gpu_workloads.py matmul SECONDS      4096x4096 matmuls, synchronised every 10
    python bench/gpu_workloads.py resnet SECONDS      ResNet-34-style inference, batch 32 at 112 px
    python bench/gpu_workloads.py train SECONDS       ResNet-34-style training steps, batch 64
    python bench/gpu_workloads.py loader SECONDS      the same, fed by a DataLoader with 2 worker processes
    python bench/gpu_workloads.py latency REQUESTS GAP_MS   ResNet-18-style batch-1 requests, p50/p99 latency

The models are examples/resnet's (built in code, nothing downloaded).

``--device cpu --small`` runs tiny versions on the CPU (to check the harness without a GPU).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "resnet"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from handler import ResNet  # noqa: E402  (examples/resnet/handler.py)

SIZE = 112


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def models(small: bool) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(the throughput model, the latency model)."""
    if small:
        return ResNet(10, 8, (1, 1)), ResNet(10, 8, (1, 1))
    return ResNet(1000, 64, (3, 4, 6, 3)), ResNet(1000, 64, (2, 2, 2, 2))


def timed_loop(seconds: float, step, device: str, sync_every: int = 10) -> dict:  # noqa: ANN001
    for _ in range(3):
        step()
    sync(device)
    started, iterations = time.perf_counter(), 0
    while time.perf_counter() - started < seconds:
        step()
        iterations += 1
        if iterations % sync_every == 0:
            sync(device)
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workload", choices=["matmul", "resnet", "train", "loader", "latency"])
    parser.add_argument("amount", type=float)
    parser.add_argument("gap_ms", type=float, nargs="?", default=20.0)
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

        result = timed_loop(args.amount, step, device, sync_every=1)
    elif args.workload == "loader":
        result = loader_training(args.amount, device, small)
    else:
        model = models(small)[1].to(device).eval()
        sample = torch.randn(1, 3, 16 if small else SIZE, 16 if small else SIZE, device=device)
        latencies = []
        with torch.inference_mode():
            for _ in range(5):
                model(sample)
            sync(device)
            for _ in range(int(args.amount)):
                started = time.perf_counter()
                model(sample)
                sync(device)
                latencies.append((time.perf_counter() - started) * 1000)
                time.sleep(args.gap_ms / 1000)
        latencies.sort()
        result = {"requests": len(latencies), "p50_ms": statistics.median(latencies),
                  "p99_ms": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]}
    sys.stdout.write(json.dumps({"workload": args.workload, **result}) + "\n")


if __name__ == "__main__":
    main()
