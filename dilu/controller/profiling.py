"""Profiling jobs: run a function's search against a live instance whose slice is resized per trial.

The instance runs with a large batch limit; a trial sets its compute slice (GPU tokens, or a CPU
quota on CPU workers) and drives ``batch`` closed-loop clients for ``trial_s`` seconds, so the
runtime's dynamic batching forms batches of that size. Searches are the pure ones in
``dilu.policy.profiler``; they run in a thread and call back into the event loop per trial.
"""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from dilu.policy.profiler import Profile, TrialResult, hybrid_growth_search, training_search
from worker.client import WorkerClient

log = logging.getLogger(__name__)


class SlicesUnavailable(RuntimeError):
    """The worker cannot resize the instance (no shim, no cgroup): trials would measure nothing."""


def sample_request(source_dir: str) -> bytes:
    """The function's sample input: ``request.json`` beside its spec, else ``{}``."""
    path = Path(source_dir) / "request.json"
    try:
        text = path.read_text(encoding="utf-8")
        json.loads(text)
        return text.encode()
    except (OSError, ValueError):
        return b"{}"


class LiveTrialRunner:
    """A TrialRunner whose trials run against a live instance (called from a worker thread)."""

    def __init__(self, *, loop: asyncio.AbstractEventLoop, client: WorkerClient, instance_id: str, endpoint: str,
                 sample: bytes, trial_s: float, on_trial: Callable[[int], None] | None = None) -> None:
        self.loop, self.client, self.instance_id, self.endpoint = loop, client, instance_id, endpoint
        self.sample, self.trial_s, self.on_trial = sample, trial_s, on_trial
        self.count = 0

    def trial(self, batch: int, sm_pct: int) -> TrialResult | None:
        result = asyncio.run_coroutine_threadsafe(self._trial(batch, sm_pct), self.loop).result()
        self.count += 1
        if self.on_trial is not None:
            self.on_trial(self.count)
        return result

    async def _trial(self, batch: int, sm_pct: int) -> TrialResult | None:
        share = sm_pct / 100
        if not await self.client.set_slice(self.instance_id, share, share):
            raise SlicesUnavailable(f"the worker cannot resize {self.instance_id}")
        latencies: list[float] = []
        async with httpx.AsyncClient(base_url=self.endpoint, timeout=60,
                                     limits=httpx.Limits(max_connections=batch + 1)) as http:
            async def one() -> None:
                started = time.perf_counter()
                reply = await http.post("/infer", content=self.sample, headers={"content-type": "application/json"})
                if reply.status_code == 200:
                    latencies.append(time.perf_counter() - started)

            await asyncio.gather(*(one() for _ in range(batch)))  # warm-up round at the new share
            latencies.clear()
            deadline = time.perf_counter() + self.trial_s
            started = time.perf_counter()

            async def loop() -> None:
                while time.perf_counter() < deadline:
                    await one()

            await asyncio.gather(*(loop() for _ in range(batch)))
            elapsed = time.perf_counter() - started
        if not latencies:
            return None
        return TrialResult(statistics.median(latencies), len(latencies) / elapsed)


async def run_search(runner: LiveTrialRunner, *, cls: str, slo_s: float, max_batch: int, batch: int) -> Profile:
    """Runs the right search for the function's class in a thread (trials call back into the loop)."""
    if cls == "batch":
        return await asyncio.to_thread(training_search, runner, batch=batch)
    return await asyncio.to_thread(hybrid_growth_search, runner, slo_s, max_batch=max_batch)
