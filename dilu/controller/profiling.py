"""Profiling jobs: one background job per new function version that needs a profile.

A job starts a profiling instance (the whole device, the spec's batch bound), waits until it is
ready, runs the class's search through a trial runner (``dilu.controller.trials``), stores the
profile and hands the function back to deployment. What goes wrong is told to the user:

- no usable sample input (``request.json``) for an inference function: the deployment fails at
  once with a message saying what to add (pinning the slice skips profiling);
- the handler cannot load, or requests with the sample input fail during a trial: the
  deployment fails with that error (a function that cannot serve its own sample is broken);
- the platform cannot profile (no worker fits the profiling instance, the worker cannot resize
  it): the function deploys with the default slice, and the event says why.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Sequence

from dilu.config import ControllerSettings
from dilu.controller.actuators import Actuator
from dilu.controller.context import ControllerContext
from dilu.controller.trials import (
    LiveTrialRunner,
    MissingSample,
    ProgressTrialRunner,
    SlicesUnavailable,
    TrialFailed,
    run_search,
    sample_request,
)
from dilu.db import repo
from dilu.db.models import FunctionRow, InstanceRow, ProfileRow
from dilu.messages import ACTIVE_STATES, FAILED, READY, FunctionStatus, InstanceRole, WorkerInfo
from dilu.policy.profiler import Profile, batch_below_bound
from dilu.slices import ComputeSlice, Slice
from dilu.worker_client import WorkerUnavailable

log = logging.getLogger(__name__)
READY_TIMEOUT_S = 600.0


class ProfilingJobs:
    def __init__(self, ctx: ControllerContext, actuator: Actuator, settings: ControllerSettings) -> None:
        self.ctx = ctx
        self.actuator = actuator
        self.settings = settings
        self._jobs: dict[tuple[str, int], asyncio.Task] = {}

    def needed(self, function: FunctionRow, profile: ProfileRow | None) -> bool:
        """Whether this version still needs a profile (profiling on, slice not pinned, none yet)."""
        resources = function.typed_spec.resources
        pinned = resources.sm_request is not None and resources.sm_limit is not None
        return self.settings.profiling and not pinned and profile is None

    def start(self, function: FunctionRow, live: Sequence[WorkerInfo]) -> None:
        """Starts the version's job unless one runs; idempotent."""
        key = (function.name, function.version)
        if key in self._jobs and not self._jobs[key].done():
            return
        self._jobs[key] = self.ctx.spawn(self._profile(function, list(live)))

    async def resume(self, function: FunctionRow, rows: list[InstanceRow], live: Sequence[WorkerInfo]) -> None:
        """A function left "profiling" with no job here (the controller restarted): start over."""
        task = self._jobs.get((function.name, function.version))
        if task is not None and not task.done():
            return
        for row in rows:
            if row.role == InstanceRole.PROFILE and row.state in ACTIVE_STATES:
                await self.actuator.stop(row, "profiling restarts")
        await self.ctx.event(function.name, "profile", "profiling restarts (no job was running it)")
        self.start(function, live)

    def cancel_except(self, versions: set[tuple[str, int]]) -> None:
        """Stops the jobs of versions that are gone (deleted or replaced): their instances are
        stopped as orphans, and nothing is written for a function that no longer exists."""
        for key, task in list(self._jobs.items()):
            if key not in versions:
                if not task.done():
                    log.info("profiling of %s version %d stopped: that version is gone", *key)
                task.cancel()
                del self._jobs[key]

    def cancel_all(self) -> None:
        """On shutdown: jobs stop where they are; the next controller starts them over."""
        for task in self._jobs.values():
            task.cancel()

    # ---- one job ----
    async def _profile(self, function: FunctionRow, live: list[WorkerInfo]) -> None:
        name, version = function.name, function.version
        training = function.typed_spec.function_class == "batch"
        try:
            bundle = await self.ctx.db(repo.get_bundle_data, digest=function.bundle) if function.bundle else None
            sample = None if training else sample_request(function.source_dir, bundle,
                                                          (function.spec or {}).get("warmup"))
        except MissingSample as exc:
            await self._deployment_failed(function, str(exc))
            return
        await self.ctx.db(repo.save_profile, function=name, version=version, status="running",
                          kind="training" if training else "inference", trials=0)
        await self.ctx.set_status(name, version, FunctionStatus.PROFILING)
        max_batch = function.typed_spec.batching.max_batch_size
        row = await self.actuator.start(function, Slice(ComputeSlice(1.0, 1.0), max_batch), live,
                                        "profiling the new version",
                                        role=InstanceRole.PROFILE, wait_ms=2.0)
        if row is None:
            await self._cannot_profile(function, "no worker could run the profiling instance")
            return
        try:
            error = await self._wait_ready(row, live)
            if error is not None:
                await self._deployment_failed(function, error, row.id)  # the handler itself cannot load
                return
            found = await self._search(function, row, live, sample)
            if found is not None:
                await self._done(function, found)
        except TrialFailed as exc:
            await self._deployment_failed(function, f"profiling failed: {exc}", row.id)
        except SlicesUnavailable as exc:
            await self._cannot_profile(function, str(exc))
        except Exception as exc:  # a broken trial must not leave the function stuck in "profiling"
            log.exception("profiling %s failed", name)
            await self._cannot_profile(function, f"{type(exc).__name__}: {exc}")
        finally:
            await self.actuator.stop(row, "profiling finished")

    async def _search(self, function: FunctionRow, row: InstanceRow, live: list[WorkerInfo],
                      sample: bytes | None) -> Profile:
        name, version = function.name, function.version
        info = next(w for w in live if w.id == row.worker_id)
        loop = asyncio.get_running_loop()

        def progress(trials: int) -> None:
            asyncio.run_coroutine_threadsafe(
                self.ctx.db(repo.save_profile, function=name, version=version, trials=trials), loop)

        client = self.ctx.directory.client_for(info.id, info.url)
        common = {"loop": loop, "client": client, "instance_id": row.id, "endpoint": row.endpoint,
                  "trial_s": self.settings.profile_trial_s, "on_trial": progress}
        runner = ProgressTrialRunner(**common) if sample is None else LiveTrialRunner(sample=sample, **common)
        spec = function.typed_spec
        return await run_search(runner, cls=spec.function_class, slo_s=spec.slo.p99_ms / 1000,
                                max_batch=spec.batching.max_batch_size, batch=spec.batching.max_batch_size)

    async def _done(self, function: FunctionRow, found: Profile) -> None:
        name, version = function.name, function.version
        spec = function.typed_spec
        await self.ctx.db(repo.save_profile, function=name, version=version, status="done", kind=found.kind,
                          sm_request=found.sm_request, sm_limit=found.sm_limit, batch=found.batch,
                          throughput_per_s=found.throughput_per_s, latency_s=found.latency_s,
                          meets_slo=found.meets_slo, trials=found.trials,
                          batch_note=batch_note(found, spec.batching.max_batch_size, spec.slo.p99_ms / 1000))
        await self.ctx.event(name, "profiled", describe_profile(found, spec.batching.max_batch_size,
                                                                spec.slo.p99_ms / 1000))
        await self.ctx.set_status(name, version, FunctionStatus.DEPLOYING)

    async def _wait_ready(self, row: InstanceRow, live: list[WorkerInfo]) -> str | None:
        """None once the profiling instance is ready; its error if it ended first."""
        info = next(w for w in live if w.id == row.worker_id)
        client = self.ctx.directory.client_for(info.id, info.url)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                status = next((s for s in await client.list_instances() if s.instance_id == row.id), None)
            except WorkerUnavailable as exc:
                return str(exc)
            if status is not None and status.state == READY:
                return None
            if status is not None and status.state == FAILED:
                return status.error or "the profiling instance failed"
            await asyncio.sleep(0.1)  # polling the worker; the instance is loading
        return "the profiling instance did not become ready"

    async def _deployment_failed(self, function: FunctionRow, error: str, instance_id: str | None = None) -> None:
        name, version = function.name, function.version
        await self.ctx.db(repo.save_profile, function=name, version=version, status="failed", error=error)
        await self.ctx.event(name, "failed", error, instance_id)
        await self.ctx.set_status(name, version, FunctionStatus.FAILED, error)

    async def _cannot_profile(self, function: FunctionRow, error: str) -> None:
        """The platform could not profile: deploy with the default slice rather than not at all."""
        name, version = function.name, function.version
        await self.ctx.db(repo.save_profile, function=name, version=version, status="failed", error=error)
        await self.ctx.event(name, "profile-failed", f"{error}; deploying with the default slice")
        await self.ctx.set_status(name, version, FunctionStatus.DEPLOYING)


def describe_profile(found: Profile, bound: int | None = None, slo_s: float = math.inf) -> str:
    """The "profiled" event's text: the slice, the batch (and the batch the runtime formed), and
    why the batch is below the spec's ``bound`` when it is."""
    if found.kind == "training":
        return (f"request {found.sm_request:g}, limit {found.sm_limit:g}: {found.throughput_per_s:.1f} units/s of "
                f"progress at the request, {found.trials} trials")
    text = (f"request {found.sm_request:g}, limit {found.sm_limit:g}, batch {found.batch}"
            + (f" ({found.batch_formed:.1f} formed on average)" if found.batch_formed else "")
            + f", {found.throughput_per_s:.1f} req/s per instance, p99 {found.latency_s * 1000:.1f} ms, "
              f"{found.trials} trials")
    text += "" if found.meets_slo else " (the SLO cannot be met)"
    note = batch_note(found, bound, slo_s) if bound is not None else None
    return text + (f"; {note}" if note else "")


def batch_note(found: Profile, bound: int, slo_s: float) -> str | None:
    """Why the profile's batch is below the spec's ``bound``, and that queued work still batches
    up to it; None when the batch is the bound."""
    below = batch_below_bound(found, bound, slo_s)
    return f"{below} (a queue is still served in batches of up to {bound})" if below else None
