"""Which functions a reconcile pass visits (pure; the clock is passed in).

A function is visited when something may be decided for it: it changed (a deploy, a status),
it has instances (their keep-alive, scaling and rollout), it must hold instances it lacks
(``min_instances``), it is being deployed or profiled, the gateways report demand for it, or its
last decision set a time to decide again (keep-alive's pre-warm of a function it unloaded).
A function with none of these (scaled to zero, no traffic, nothing pending) would be decided
to stay as it is, so it is left alone until the next full resync, the safety net against a
missed event.
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
    if activity is None:
        return False
    recent = any(count and second >= now - RECENT_REQUESTS_S for second, count in activity.requests.items())
    return recent or activity.in_flight > 0 or activity.queued > 0 or activity.workflow.expected(now)
