"""Per-function reconciliation: rollout, profiling, vertical slices, and how many instances to run.

Decisions come from ``dilu.policy`` (replicas, horizontal, keepalive, profiler); this module keeps
each function's policy state between passes (rebuildable: a restarted controller starts with empty
windows and histograms) and carries decisions out through the actuator.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from dilu.config import ControllerSettings
from dilu.controller.actuators import Actuator
from dilu.controller.context import ControllerContext
from dilu.controller.profiling import ProfilingJobs
from dilu.db import repo
from dilu.db.models import FunctionRow, InstanceRow, ProfileRow
from dilu.messages import ACTIVE_STATES, READY, FunctionActivity, FunctionStatus, InstanceRole, WorkerInfo
from dilu.policy.autoscale import ScalingInputs, ScalingParams, ScalingState, observe_second, plan
from dilu.policy.horizontal import HorizontalParams
from dilu.policy.keepalive import KeepAliveParams
from dilu.policy.replicas import ReplicaDecision
from dilu.slices import effective_slice

log = logging.getLogger(__name__)


@dataclass
class _FunctionMemory:
    scaling: ScalingState = field(default_factory=ScalingState)
    last_second_seen: int = 0


class FunctionManager:
    def __init__(self, ctx: ControllerContext, actuator: Actuator, settings: ControllerSettings) -> None:
        self.ctx = ctx
        self.actuator = actuator
        self.settings = settings
        self.params = ScalingParams(
            HorizontalParams(settings.horizontal_interval_s, settings.horizontal_window,
                             settings.horizontal_out_samples, settings.horizontal_in_samples,
                             settings.horizontal_trend),
            KeepAliveParams(min_samples=settings.keepalive_min_samples, min_unload_s=settings.keepalive_min_unload_s,
                            request_worth_gb_s=settings.keepalive_request_worth_gb_s))
        self._memory: dict[str, _FunctionMemory] = {}
        self.recheck_at: dict[str, float] = {}   # function -> when its last decision asked to be made again
        self.profiling = ProfilingJobs(ctx, actuator, settings)

    async def reconcile(self, function: FunctionRow, rows: list[InstanceRow], profile: ProfileRow | None,
                        activity: FunctionActivity, live: Sequence[WorkerInfo], telemetry: dict) -> None:
        serving = [r for r in rows if r.role == InstanceRole.SERVE and r.state in ACTIVE_STATES]
        current = [r for r in serving if r.function_version == function.version]
        old = [r for r in serving if r.function_version != function.version]
        memory = self._memory.setdefault(function.name, _FunctionMemory())
        self.recheck_at.pop(function.name, None)    # this visit is the one it asked for; the decision may set another

        if function.status == FunctionStatus.DEPLOYING and self.profiling.needed(function, profile):
            self.profiling.start(function, live)
            return
        if function.status == FunctionStatus.PROFILING:
            await self.profiling.resume(function, rows, live)
            return
        if function.status == FunctionStatus.DEPLOYING and any(r.state == READY for r in current):
            await self.ctx.event(function.name, "deployed", f"version {function.version} is ready")
            await self.ctx.set_status(function.name, function.version, FunctionStatus.READY)
            function = await self.ctx.db(repo.get_function, name=function.name)
        if old and function.status in (FunctionStatus.READY, FunctionStatus.FAILED):
            for row in old:
                await self.actuator.stop(row, f"replaced by version {function.version}")

        chosen = effective_slice(function.typed_spec, profile)
        await self.actuator.resize(function, current, chosen, live)
        decision = self._decide(function, rows, current, profile, activity, telemetry, memory)
        if decision.recheck_in_s is not None:
            self.recheck_at[function.name] = time.time() + decision.recheck_in_s
        if decision.desired > len(current):
            for _ in range(decision.desired - len(current)):
                if await self.actuator.start(function, chosen, live, decision.reason, in_background=True) is None:
                    break
        elif decision.desired < len(current):
            # Starting instances go first, then the newest ready ones.
            victims = sorted(current, key=lambda r: (r.state == READY, r.created_at))[: len(current) - decision.desired]
            for row in victims:
                await self.actuator.stop(row, decision.reason)

    def _decide(self, function: FunctionRow, rows: list[InstanceRow], current: list[InstanceRow],
                profile: ProfileRow | None, activity: FunctionActivity, telemetry: dict,
                memory: _FunctionMemory) -> ReplicaDecision:
        spec, now = function.typed_spec, time.time()
        scaling = spec.scaling
        # Idle times come from the per-second request counts: every gap between two seconds with
        # requests is one (1 s resolution: consecutive busy seconds are a gap of one second).
        for second in sorted(s for s, count in activity.requests.items() if count and s > memory.last_second_seen
                             and s < int(now)):
            memory.scaling = observe_second(memory.scaling, float(second), activity.requests[second], self.params)
            memory.last_second_seen = second
        throughput = profile.throughput_per_s if profile is not None and profile.status == "done" else None
        target = spec.occupancy_target()      # in flight per instance, streams for their whole duration
        # The newest second every gateway has flushed (a flush period late, and as much again for
        # a busy gateway): the second just ended still lacks the counts of its last flush.
        flushed = int(now - 2 * self.settings.stats_flush_s) - 1
        became_ready = function.updated_at.timestamp() if function.status == FunctionStatus.READY else None
        last_active = max([t for t in (activity.last_request_at, became_ready) if t is not None], default=None)
        decision, memory.scaling = plan(ScalingInputs(
            now=now, current=len(current), min_instances=scaling.min_instances, max_instances=scaling.max_instances,
            status=function.status, starting=sum(1 for r in current if r.state != READY),
            in_flight=activity.in_flight, queued=activity.queued,
            concurrency_per_instance=target or 2 * spec.batching.max_batch_size,
            target_concurrency=target or math.inf,
            rate_per_s=float(activity.requests.get(flushed, 0)), throughput_per_instance=throughput,
            at_vertical_limit=_at_limits(current, telemetry), latency_target_s=spec.slo.p99_ms / 1000,
            idle_s=math.inf if last_active is None else max(0.0, now - last_active),
            cold_start_s=cold_start_estimate(rows, function.version, self.settings.cold_start_default_s),
            keep_alive_s=scaling.keep_alive_s, memory_gb=spec.resources.memory / 2**30,
            expected=activity.workflow.expected(now), release_idle=activity.workflow.releasable(now)),
            memory.scaling, self.params)
        return decision

    def forget_except(self, current: set[tuple[str, int]]) -> None:
        """Drops the policy state and the profiling jobs of functions (versions) that no longer exist."""
        names = {name for name, _ in current}
        for name in [n for n in self._memory if n not in names]:
            del self._memory[name]
        for name in [n for n in self.recheck_at if n not in names]:
            del self.recheck_at[name]
        self.profiling.cancel_except(current)


def _at_limits(current: list[InstanceRow], telemetry: dict) -> bool:
    """Whether every instance already uses (nearly) its whole compute limit; CPU instances, which
    report no telemetry, count as having no vertical headroom."""
    views = [v if v and "used_share" in v else None for v in (telemetry.get(r.id) for r in current)]
    if not any(views):
        return True
    return all(v is None or v.get("used_share", 0) >= 0.9 * (r.sm_limit or 1.0) for r, v in zip(current, views,
                                                                                                strict=True))


def cold_start_estimate(rows: list[InstanceRow], version: int, default_s: float, newest: int = 5) -> float:
    """The function version's cold-start time: the median, over its newest serving instances that
    became ready, of creation to ready (placement, process start, imports, ``load()``)."""
    times = sorted(((r.created_at, (r.ready_at - r.created_at).total_seconds()) for r in rows
                    if r.function_version == version and r.role == InstanceRole.SERVE and r.ready_at is not None),
                   reverse=True)[:newest]
    return statistics.median(t for _, t in times) if times else default_s
