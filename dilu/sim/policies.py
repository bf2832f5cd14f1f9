"""The policies the simulator compares, each a composition of the live policy modules.

Nothing here decides anything itself: placement is a live ``Scheduler`` (built from the same
profiles and plugins the controller uses), shares come from ``dilu.policy.vertical.allocate``
or a fixed rule; the instance count from ``dilu.policy.autoscale.plan``, the controller's own
composition of horizontal scaling (lazy, or for the baselines the conventional rule of scaling to
the current rate at once) and keep-alive (its histogram, or its fixed path).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from dilu.policy import autoscale, isolation, vertical
from dilu.policy.autoscale import ScalingParams
from dilu.policy.horizontal import HorizontalParams
from dilu.policy.keepalive import KeepAliveParams
from dilu.policy.scheduler import Scheduler, create_scheduler
from dilu.policy.scheduler.plugins.compute_cap import ComputeCap

Shares = Literal["vertical", "limit", "request", "whole", "priority"]


@dataclass(frozen=True)
class SimPolicy:
    name: str
    scheduler: Scheduler
    shares: Shares            # how a running instance's compute share is set
    horizontal: Literal["lazy", "eager"]
    keepalive: Literal["histogram", "fixed"]
    summary: str
    # "bound": a queue is served in batches up to the spec's bound (Dilu's runtime); "profiled":
    # every batch at most the profile's batch, as a fixed-batch server does.
    batching: Literal["bound", "profiled"] = "profiled"
    scaling: ScalingParams = ScalingParams()   # the controller's parameters, for Dilu's ablations


def _without(scheduler: Scheduler, plugin: str, name: str) -> Scheduler:
    """The same pipeline minus one score plugin (the very plugin objects, not copies)."""
    return Scheduler(name, scheduler.filters, [s for s in scheduler.scores if s.name != plugin])


def build_policies() -> dict[str, SimPolicy]:
    dilu = create_scheduler("dilu")
    return {p.name: p for p in (
        SimPolicy("dilu", dilu, "vertical", "lazy", "histogram",
                  "profiled slices, complementary placement, vertical + lazy horizontal scaling, histogram keep-alive",
                  batching="bound"),
        SimPolicy("exclusive", create_scheduler("exclusive"), "whole", "eager", "fixed",
                  "a whole GPU per instance"),
        SimPolicy("mps", create_scheduler("static-limits"), "limit", "eager", "fixed",
                  "static slices sized by the limit (limits add up to at most one GPU), MPS-like"),
        SimPolicy("infless", create_scheduler("request-only"), "request", "eager", "fixed",
                  "packing by requests, fixed slices at the request, no vertical scaling (INFless-like)"),
        SimPolicy("horizontal-only", create_scheduler("request-only"), "limit", "eager", "fixed",
                  "conventional autoscaling: fixed slices at the limit, scale to the rate at once"),
        SimPolicy("tgs", create_scheduler("time-sharing"), "priority", "eager", "fixed",
                  "priority time-sharing: one latency and one batch job per GPU, batch runs in the rest (TGS-like)"),
        SimPolicy("dilu-no-vertical", dilu, "request", "lazy", "histogram",
                  "Dilu with slices fixed at the request", batching="bound"),
        SimPolicy("dilu-no-complementary", _without(dilu, "Complementary", "dilu-no-complementary"), "vertical",
                  "lazy", "histogram", "Dilu without complementary placement", batching="bound"),
    )}


def build_ablations() -> dict[str, SimPolicy]:
    """Dilu with one rule of its serving off at a time (for the ablation tables)."""
    dilu = build_policies()["dilu"]
    limits_overlap = Scheduler("dilu-no-batch-yields", [
        ComputeCap("limit", f.cap) if isinstance(f, ComputeCap) and f.of == "limit" else f
        for f in dilu.scheduler.filters], dilu.scheduler.scores)
    rules = {
        "no-batch-to-bound": {"batching": "profiled"},
        "no-batch-yields": {"scheduler": limits_overlap},
        "no-limits-apart": {"scheduler": _without(dilu.scheduler, "LimitsApart", "dilu-no-limits-apart")},
        "no-quiet-minute": {"scaling": ScalingParams(horizontal=HorizontalParams(window=40, in_samples=30))},
        "no-trend": {"scaling": ScalingParams(horizontal=HorizontalParams(trend=False))},
        "no-memory-weighing": {"scaling": ScalingParams(keepalive=KeepAliveParams(request_worth_gb_s=0))},
        "no-weighed-extension": {"scaling": ScalingParams(keepalive=KeepAliveParams(weighed_extension=0.0))},
    }
    return {f"dilu-{rule}": replace(dilu, name=f"dilu-{rule}", summary=f"Dilu, {rule}", **change)
            for rule, change in rules.items()}


POLICY_NAMES = ("dilu", "exclusive", "mps", "infless", "horizontal-only", "tgs", "dilu-no-vertical",
                "dilu-no-complementary")
# The live modules the simulator calls (a test holds these to be the controller's own).
LIVE = {"allocate": vertical.allocate, "isolate": isolation.shares_while_serving, "plan": autoscale.plan,
        "observe": autoscale.observe_second}


def parse_policies(text: str) -> list[str]:
    """``dilu,exclusive`` (or ``all``) to names; ValueError naming an unknown one."""
    names = list(POLICY_NAMES) if text.strip() == "all" else [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in POLICY_NAMES]
    if unknown or not names:
        raise ValueError(f"unknown policy {', '.join(unknown) or '(none given)'}; "
                         f"known: {', '.join(POLICY_NAMES)}, all")
    return names
