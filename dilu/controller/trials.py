"""Profiling trials against a live instance whose slice is resized per trial.

The instance runs with the spec's ``max_batch_size`` (the search never goes above it); a trial
sets its compute slice (GPU tokens, or a CPU quota on CPU workers) and drives ``batch``
closed-loop clients with the function's sample input for at least ``trial_s`` seconds and
``MIN_REQUESTS`` requests, so the runtime's dynamic batching forms batches of that size. A trial
reports the p99 latency of one request (the SLO is a p99 target) and the mean batch the runtime
actually formed. A request that fails makes the trial fail with its error: a function that
cannot serve its own sample input is not deployed. Searches are the pure ones in
``dilu.policy.profiler``; they run in a thread and call back into the event loop per trial.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from dilu.bundles import read_member
from dilu.policy.profiler import Profile, TrialResult, hybrid_growth_search, training_search
from dilu.slices import ComputeSlice
from dilu.worker_client import WorkerClient

MIN_REQUESTS = 100          # per trial: a p99 over fewer is little more than the maximum
MAX_TRIAL_FACTOR = 10       # ... unless the trial has run this many times ``trial_s``
SETTLE_FRACTION = 0.25      # training trials: wait this share of ``trial_s`` after a resize
SAMPLE_FILE = "request.json"


class SlicesUnavailable(RuntimeError):
    """The worker cannot resize the instance (no shim, no cgroup): trials would measure nothing."""


class TrialFailed(RuntimeError):
    """Requests failed during a trial; the message names how many, where, and the first error."""


class MissingSample(ValueError):
    """The function has no usable sample input to profile with; the message says what to add."""


def _code_file(name: str, source_dir: str, bundle: bytes | None) -> str:
    if bundle is not None:
        return read_member(bundle, name).decode("utf-8")
    if source_dir:
        return (Path(source_dir) / name).read_text(encoding="utf-8")
    raise OSError("no code folder")


def sample_request(source_dir: str, bundle: bytes | None = None, warmup: dict | None = None) -> bytes:
    """The function's sample input: ``request.json`` beside its spec (one JSON request body), in
    its uploaded ``bundle`` or its local ``source_dir``; without one, the spec's warm-up request
    (``warmup``: inline, or its file in the code).

    Raises MissingSample, naming the file and what to do, when it is missing or not JSON.
    """
    pin = "or pin the slice (resources.sm_request and resources.sm_limit) to deploy without profiling"
    name = SAMPLE_FILE
    try:
        text = _code_file(SAMPLE_FILE, source_dir, bundle)
    except (OSError, KeyError, UnicodeDecodeError):
        if warmup and warmup.get("request") is not None:
            return json.dumps(warmup["request"]).encode()
        try:
            if not warmup or not warmup.get("file"):
                raise OSError("no warm-up file")
            name = warmup["file"]
            text = _code_file(name, source_dir, bundle)
        except (OSError, KeyError, UnicodeDecodeError):
            raise MissingSample(f"profiling needs a sample input: add {SAMPLE_FILE} (one JSON request body) beside "
                                f"model.yaml (or a warmup request to the spec), {pin}") from None
    try:
        json.loads(text)
    except ValueError as exc:
        raise MissingSample(f"{name} is not valid JSON ({exc}): fix it, {pin}") from None
    return text.encode()


class _LiveRunner:
    """What both live runners share: trials are called from the search's worker thread and run
    on the event loop; each resizes the instance first and reports the trial count."""

    def __init__(self, *, loop: asyncio.AbstractEventLoop, client: WorkerClient, instance_id: str, endpoint: str,
                 trial_s: float, on_trial: Callable[[int], None] | None = None) -> None:
        self.loop, self.client, self.instance_id, self.endpoint = loop, client, instance_id, endpoint
        self.trial_s, self.on_trial = trial_s, on_trial
        self.count = 0

    def trial(self, batch: int, sm_pct: int) -> TrialResult | None:
        result = asyncio.run_coroutine_threadsafe(self._resized_trial(batch, sm_pct), self.loop).result()
        self.count += 1
        if self.on_trial is not None:
            self.on_trial(self.count)
        return result

    async def _resized_trial(self, batch: int, sm_pct: int) -> TrialResult | None:
        share = sm_pct / 100
        if not await self.client.set_slice(self.instance_id, ComputeSlice(share, share)):
            raise SlicesUnavailable(f"the worker cannot resize {self.instance_id}")
        return await self._measure(batch, sm_pct)

    async def _measure(self, batch: int, sm_pct: int) -> TrialResult | None:
        raise NotImplementedError


class LiveTrialRunner(_LiveRunner):
    """Inference trials: closed-loop requests with the function's sample input."""

    def __init__(self, *, sample: bytes, **common: Any) -> None:
        super().__init__(**common)
        self.sample = sample

    async def _measure(self, batch: int, sm_pct: int) -> TrialResult | None:
        latencies: list[float] = []
        batches: list[int] = []
        failures: list[str] = []
        async with httpx.AsyncClient(base_url=self.endpoint, timeout=60,
                                     limits=httpx.Limits(max_connections=batch + 1)) as http:
            async def one() -> None:
                started = time.perf_counter()
                try:
                    reply = await http.post("/infer", content=self.sample,
                                            headers={"content-type": "application/json"})
                except httpx.HTTPError as exc:
                    failures.append(f"{type(exc).__name__}: {exc}")
                    return
                if reply.status_code != 200:
                    failures.append(f"HTTP {reply.status_code}: {_error_text(reply)}")
                    return
                latencies.append(time.perf_counter() - started)
                batches.append(int(reply.headers.get("x-dilu-batch-size", "1")))

            await asyncio.gather(*(one() for _ in range(batch)))  # warm-up round at the new share
            latencies.clear()
            batches.clear()
            started = time.perf_counter()
            deadline, cutoff = started + self.trial_s, started + MAX_TRIAL_FACTOR * self.trial_s

            async def loop() -> None:
                while not failures and time.perf_counter() < cutoff and (
                        time.perf_counter() < deadline or len(latencies) < MIN_REQUESTS):
                    await one()

            await asyncio.gather(*(loop() for _ in range(batch)))
            elapsed = time.perf_counter() - started
        if failures:
            raise TrialFailed(f"{len(failures)} request(s) with the sample input failed at batch {batch}, "
                              f"{sm_pct} % of the device: {failures[0]}")
        if not latencies:
            return None
        return TrialResult(_p99(latencies), len(latencies) / elapsed, statistics.fmean(batches))


def _p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98] if len(values) > 1 else values[0]


def _error_text(reply: httpx.Response) -> str:
    try:
        body = reply.json()
    except ValueError:
        return reply.text[:300]
    return str(body.get("error", body) if isinstance(body, dict) else body)[:300]


class ProgressTrialRunner(_LiveRunner):
    """Batch-class trials: after the resize settles, the rate of progress the handler reports
    (``dilu.report_progress``) over ``trial_s``."""

    async def _measure(self, batch: int, sm_pct: int) -> TrialResult:
        async with httpx.AsyncClient(base_url=self.endpoint, timeout=30) as http:
            await asyncio.sleep(SETTLE_FRACTION * self.trial_s)  # the new share takes hold
            first = await self._read(http)
            await asyncio.sleep(self.trial_s)  # the measurement window itself
            last = await self._read(http)
        rate = (last[0] - first[0]) / max(1e-9, last[1] - first[1])
        if rate <= 0:
            raise TrialFailed(f"the training function reported no progress in {self.trial_s:g}s at {sm_pct} % of "
                              "the device: call dilu.report_progress(units) from its training loop")
        return TrialResult(1.0 / rate, rate)

    @staticmethod
    async def _read(http: httpx.AsyncClient) -> tuple[float, float]:
        try:
            reply = (await http.get("/progress")).json()
            return float(reply["units"]), float(reply["at"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise TrialFailed(f"cannot read the instance's progress: {exc}") from exc


async def run_search(runner: LiveTrialRunner | ProgressTrialRunner, *, cls: str, slo_s: float, max_batch: int,
                     batch: int) -> Profile:
    """Runs the right search for the function's class in a thread (trials call back into the loop)."""
    if cls == "batch":
        return await asyncio.to_thread(training_search, runner, batch=batch)
    return await asyncio.to_thread(hybrid_growth_search, runner, slo_s, max_batch=max_batch)
