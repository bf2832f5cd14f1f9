"""Instance-count decisions: scale from zero, keep-alive, scale to zero, failures."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dilu.policy.keepalive import Verdict
from dilu.policy.replicas import ReplicaContext, desired_instances

BASE = ReplicaContext(status="ready", min_instances=0, max_instances=4, current=1, concurrency_per_instance=2)
UNLOAD = {"keep": Verdict.UNLOAD, "keep_reason": "idle for 60s >= keep-alive 60s"}


def expect(ctx: ReplicaContext, desired: int, reason_has: str) -> None:
    decision = desired_instances(ctx)
    assert decision.desired == desired, decision
    assert reason_has in decision.reason, decision


@pytest.mark.parametrize(("label", "ctx", "desired", "reason"), [
    ("failed function runs nothing", replace(BASE, status="failed", min_instances=2), 0, "failed"),
    ("deploying starts one to verify", replace(BASE, status="deploying", current=0), 1, "verifying"),
    ("deploying keeps min when larger", replace(BASE, status="deploying", current=0, min_instances=3), 3, "verifying"),
    ("queued request scales from zero", replace(BASE, current=0, queued=1), 1, "scale from zero"),
    ("demand beyond capacity adds instances", replace(BASE, current=1, in_flight=5), 3, "need 3"),
    ("demand capped at max", replace(BASE, current=1, in_flight=100), 4, "need 50"),
    ("requests queued behind a cold start wait for it", replace(BASE, current=1, starting=1, queued=9), 1,
     "waiting for a starting instance"),
    ("busy never scales in", replace(BASE, current=3, in_flight=1), 3, "serving"),
    ("idle within keep-alive keeps instances", replace(BASE, current=2), 2, "within keep-alive"),
    ("idle past keep-alive goes to zero", replace(BASE, current=2, **UNLOAD), 0, "keep-alive 60s"),
    ("idle past keep-alive stops at minimum", replace(BASE, current=3, min_instances=1, **UNLOAD), 1, "idle"),
    ("below minimum is restored", replace(BASE, current=0, min_instances=2, **UNLOAD), 2, "at minimum"),
    ("profiling runs no serving instance", replace(BASE, status="profiling", current=0), 0, "profiling"),
    ("busy and profiled: the lazy scaler decides", replace(BASE, current=2, in_flight=9, lazy_desired=2), 2, "serving"),
    ("lazy scale out", replace(BASE, current=2, in_flight=9, lazy_desired=3), 3, "horizontal"),
    ("lazy scale out between requests", replace(BASE, current=1, lazy_desired=2), 2, "horizontal"),
    ("lazy scale in while lightly used", replace(BASE, current=3, lazy_desired=2), 2, "horizontal"),
    ("keep-alive says unload after use", replace(BASE, current=1, keep=Verdict.UNLOAD,
                                                 keep_reason="pre-warm at 8.0s idle"), 0, "pre-warm at 8.0s"),
    ("keep-alive pre-warms before the next request", replace(BASE, current=0, keep=Verdict.WARM,
                                                              keep_reason="next request due in 1.0s"), 1, "pre-warm"),
    ("a warm verdict keeps what runs", replace(BASE, current=2, keep=Verdict.WARM, keep_reason="due"), 2, "due"),
    ("a hold verdict starts nothing", replace(BASE, current=0), 0, "within keep-alive"),
    ("an idle workflow node whose loading hides is released", replace(BASE, current=2, release_idle=True), 0,
     "released until a workflow needs it"),
    ("a released node keeps its minimum", replace(BASE, current=2, min_instances=1, release_idle=True), 1,
     "released until a workflow needs it"),
    ("a busy released node keeps serving", replace(BASE, current=1, in_flight=1, release_idle=True), 1, "serving"),
    ("a node a workflow expects is not released", replace(BASE, current=1, expected=True, release_idle=True), 1,
     "needs it soon"),
])
def test_desired_instances(label: str, ctx: ReplicaContext, desired: int, reason: str) -> None:
    expect(ctx, desired, reason)
