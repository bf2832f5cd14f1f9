"""When to start loading each node of a workflow request so it is ready just as it is needed (pure).

With each node's expected execution time and its function's cold start (the loading stages'
estimate), walk the DAG in order from the request's arrival (time 0):

- a node can run once its parents are done: ``needed = max(parent done)`` (0 for a root);
- a warm node runs at ``needed``; a cold one loads from ``start = max(0, needed - cold - margin)``
  and runs at ``max(needed, start + cold)``; ``done = run + exec``.

So a node's loading hides in the time its ancestors spend loading and running (its slack), and
starts no earlier than that needs: not at request arrival (eager), not when its parents finish
(on demand). A node behind a condition is loaded ahead only when the branch was taken at least
``min_probability`` of the time lately; otherwise it loads on demand if chosen. Policies:
``slack`` (the above), ``eager`` (every cold node at arrival), ``on-demand`` (none ahead).
"""

from __future__ import annotations

from dataclasses import dataclass

from dilu.workflows.spec import WorkflowSpec

POLICIES = ("slack", "eager", "on-demand")
MIN_BRANCH_PROBABILITY = 0.5   # a node behind a condition taken less often than this is not loaded ahead


@dataclass(frozen=True)
class NodeEstimate:
    exec_s: float       # expected time of the node's request on a warm instance
    cold_s: float       # expected cold start of its function
    warm: bool          # a ready instance exists now


@dataclass(frozen=True)
class PlannedNode:
    load_at_s: float | None   # when to start loading (from the request's arrival); None: not ahead
    needed_at_s: float        # when it is expected to be able to run
    done_at_s: float


def plan(spec: WorkflowSpec, estimates: dict[str, NodeEstimate], *, policy: str = "slack",
         branch_probability: dict[str, float] | None = None, margin_s: float = 0.1,
         min_probability: float = MIN_BRANCH_PROBABILITY) -> dict[str, PlannedNode]:
    """Each node's load time (None where nothing is loaded ahead) and its expected timeline."""
    if policy not in POLICIES:
        raise ValueError(f"unknown loading policy {policy!r}; known: {', '.join(POLICIES)}")
    probability = branch_probability or {}
    conditional = behind_conditions(spec)
    result: dict[str, PlannedNode] = {}
    for name in spec.order():
        node, estimate = spec.node(name), estimates[name]
        needed = max((result[p].done_at_s for p in node.after), default=0.0)
        likely = name not in conditional or probability.get(name, 0.0) >= min_probability
        load_at: float | None = None
        if not estimate.warm and policy != "on-demand" and likely:
            load_at = 0.0 if policy == "eager" else max(0.0, needed - estimate.cold_s - margin_s)
        if estimate.warm:
            runs = needed
        elif load_at is not None:
            runs = max(needed, load_at + estimate.cold_s)
        else:
            runs = needed + estimate.cold_s      # loads when it is reached
        result[name] = PlannedNode(load_at, round(needed, 6), round(runs + estimate.exec_s, 6))
    return result


def behind_conditions(spec: WorkflowSpec) -> set[str]:
    """Nodes that run only if some condition holds: those with ``when`` and their descendants."""
    behind: set[str] = set()
    for name in spec.order():
        node = spec.node(name)
        if node.when is not None or (node.after and all(p in behind for p in node.after)):
            behind.add(name)
    return behind
