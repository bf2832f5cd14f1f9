"""What loading beside a workflow request costs the nodes that run meanwhile (pure).

Loading a node in its slack is free only when the load does not take what the running nodes
need. On a GPU host the upstream node computes on the device while the load imports and builds
on the CPU; on a host where both need the same cores, the running node slows down and the
request takes longer although no node waited. That slowdown is part of what the loads cost.

From each node's service time measured *alone* (no load in flight while it ran) and *beside*
loads, the request's critical path is computed both ways (the DAG walked with those times, as
``dilu.workflows.plan`` does); the difference is the interference. It is shared among the nodes
whose loads ran beside the request's nodes, in proportion to how long each overlapped them (the
root, loaded before anything runs, takes none), and adds to what each of them costs a request
when it is not loaded ahead.

A node seen beside loads but never alone leaves the interference unknown: only a request whose
nodes are all loaded beforehand measures it (the keep-alive rule pre-warms them once for that).
"""

from __future__ import annotations

from dilu.workflows.plan import NodeEstimate, plan
from dilu.workflows.spec import WorkflowSpec

NOTICEABLE_S = 0.02      # below this, a measured time is within a request's run-to-run noise


def critical_path_s(spec: WorkflowSpec, exec_s: dict[str, float]) -> float:
    """The end-to-end time of a request whose nodes are all warm and take ``exec_s`` (missing: 0)."""
    warm = {node.name: NodeEstimate(exec_s.get(node.name, 0.0), 0.0, True) for node in spec.nodes}
    return max(planned.done_at_s for planned in plan(spec, warm, policy="on-demand").values())


def interference_s(spec: WorkflowSpec, alone: dict[str, float], beside: dict[str, float]) -> float | None:
    """How much longer the critical path is with the nodes' times beside loads than alone (at
    least 0); None when a node was seen beside loads but never alone."""
    if any(node not in alone for node in beside):
        return None
    return round(max(0.0, critical_path_s(spec, {**alone, **beside}) - critical_path_s(spec, alone)), 6)


def shares(interference: float, overlap_s: dict[str, float]) -> dict[str, float]:
    """The interference divided among the nodes whose loads ran beside the request's nodes, by
    how long each overlapped them."""
    total = sum(overlap_s.values())
    if total <= 0:
        return {node: interference / len(overlap_s) for node in overlap_s}
    return {node: round(interference * overlap / total, 6) for node, overlap in overlap_s.items()}


def loading_costs(waits: dict[str, float], slowdown: float, overlap_s: dict[str, float]) -> dict[str, float]:
    """What loading each node in the slack costs a request: its wait for its instance (counted
    above ``NOTICEABLE_S``: one node's noise) plus its share of the slowdown (counted whenever
    the slowdown is noticeable, however small each share: together they are one cost, and a
    share near the threshold would flip the node between loaded ahead and not)."""
    share = shares(slowdown, overlap_s) if slowdown > NOTICEABLE_S and overlap_s else {}
    return {node: round((waits.get(node, 0.0) if waits.get(node, 0.0) > NOTICEABLE_S else 0.0)
                        + share.get(node, 0.0), 6) for node in set(waits) | set(share)}
