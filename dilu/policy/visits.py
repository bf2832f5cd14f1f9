"""Which functions a reconcile pass visits (pure; the clock is passed in).

A function is visited when something may be decided for it: it changed (a deploy, a status),
it has instances (their keep-alive, scaling and rollout), it must hold instances it lacks
(``min_instances``), it is being deployed or profiled, the gateways report demand for it, or its
last decision set a time to decide again (keep-alive's pre-warm of a function it unloaded).
A function with none of these (scaled to zero, no traffic, nothing pending) would be decided
to stay as it is, so it is left alone until the next full resync, the safety net against a
missed event.

How often the pass runs: at its interval while anything happens, and at the longer quiet
interval while nothing does (``quiet``), as long as no timer falls due sooner.
"""

from __future__ import annotations

from dataclasses import dataclass

from dilu.messages import FunctionActivity

SETTLED_STATUSES = frozenset({"ready", "failed"})
RECENT_REQUESTS_S = 10   # requests this recent still feed the scaling windows


@dataclass(frozen=True)
class FunctionFacts:
    """What the choice needs of one function, read by the pass."""

    name: str
    version: int
    status: str
    min_instances: int
    instances: int   # active or stopping


def needs_visit(facts: FunctionFacts, activity: FunctionActivity | None, last_seen: tuple[int, str] | None,
                now: float, recheck_at: float | None = None) -> bool:
    """Whether the pass reconciles this function; ``last_seen``: its (version, status) when it
    was last reconciled (None: never); ``recheck_at``: when its last decision asked to be made
    again (a pre-warm due), if it did."""
    if last_seen != (facts.version, facts.status) or facts.status not in SETTLED_STATUSES:
        return True
    if recheck_at is not None and recheck_at <= now:
        return True
    if facts.instances > 0 or facts.min_instances > 0:
        return True
    return activity is not None and _demand(activity, now)


def quiet(activity: dict[str, FunctionActivity], now: float, *, acted: bool, settling: bool) -> bool:
    """Whether nothing happens that a pass at the short interval would follow: the pass acted on
    nothing (``acted``: no start, stop, resize, status or instance change recorded), nothing is
    starting, stopping, deploying or running in the background (``settling``), and no function
    has requests now or lately, or a workflow request expecting it."""
    return not (acted or settling or any(_demand(seen, now) for seen in activity.values()))


def _demand(activity: FunctionActivity, now: float) -> bool:
    """Requests in flight, queued or lately, or a workflow request expecting the function."""
    recent = any(count and second >= now - RECENT_REQUESTS_S for second, count in activity.requests.items())
    return recent or activity.in_flight > 0 or activity.queued > 0 or activity.workflow.expected(now)


def pass_interval_s(*, quiet_now: bool, interval_s: float, quiet_interval_s: float,
                    next_timer_in_s: float | None = None) -> float:
    """How long the loop sleeps before its next pass (events wake it sooner): the quiet interval
    while quiet, else the interval, and never past a timer (a pre-warm, a workflow's release)."""
    sleep = max(interval_s, quiet_interval_s) if quiet_now else interval_s
    return sleep if next_timer_in_s is None else max(0.0, min(sleep, next_timer_in_s))
