"""How long a workflow keeps each node's function loaded after a request (pure).

A node's cold start costs a request only the part that does not fit in its slack (the time its
ancestors take, all warm): ``exposed = max(0, cold_start - slack)``.

- A node with nothing exposed loses nothing by being unloaded: loading in the slack brings it
  back in time for the next request. It is **released** as soon as it is idle.
- A node with an exposed cold start (a root has no slack at all) costs a request ``exposed``
  seconds if it is cold, or memory if it is loaded. The workflow's recent gaps between requests
  say when the next one is likely: within ``W`` (the ``window_quantile`` of the gaps), and not
  before ``E`` (the ``early_quantile``). Three choices, each with its cost in seconds of latency
  (``price``: what one GiB held for one second is worth, ``DEFAULT_PRICE``: holding 1 GiB for
  100 s is worth saving 1 s of one request)::

      hold      price * GiB * (W + idle)              (loaded from now to the window's end)
      pre-warm  p_early * exposed + price * GiB * (W - unloaded + idle)
      neither   p_need * exposed                      (released once idle, loaded when needed)

  ``idle``: held or pre-warmed, the node is loaded when the next request arrives and sits there
  until it is needed (its slack), where loading it in the slack would have loaded it only its
  cold start before: ``idle = max(0, slack - cold)``. A node deep in a workflow with a small
  cost is cheaper loaded in the slack than waiting loaded through the nodes before it.

  **Pre-warm** releases it once idle and loads it again so that it is ready a margin before
  ``E``: it is unloaded for ``unloaded = E - elapsed - cold - ready_margin`` seconds (a root, which has
  no slack to hide lateness in, takes a larger margin; its whole cold
  start, so that nothing of it runs beside the next request), considered only when that is at least
  ``MIN_UNLOADED_S`` (shorter is churn); a request that comes before it is loaded again
  (``p_early``, the share of gaps that short) meets it cold. Regular traffic (a camera's frames,
  a periodic job) makes it much cheaper than holding; random traffic makes ``E`` small and
  leaves holding. ``p_need``: the share of gaps within ``W`` times how often the node ran
  (branches). The cheapest choice wins (ties: hold, then pre-warm). **Neither** releases it
  like a node that hides: left to its function's keep-alive instead, it would be held for that
  long, a memory cost the comparison does not count (and, with a keep-alive shorter than the
  gaps, a cold start it does).
- A node behind a condition taken less often than the slack policy loads ahead
  (``MIN_BRANCH_PROBABILITY``) is not loaded ahead: it starts loading once its condition is
  decided to hold (the node the condition reads has answered), in whatever time the nodes
  still before it take (``decided_ahead_s``); what that does not hide is its ``exposed``. Below
  a chosen branch, a node without a condition of its own loads when reached: all of its cold
  start shows.
- Otherwise ``exposed`` is the larger of the estimate (counted only above the margin: it is a difference
  of estimates) and what was **measured**: what the node still waited when loaded in the slack,
  plus its share of the slowdown its load caused to the nodes running meanwhile
  (``dilu.workflows.interference``, which leaves out what is within a request's noise); below
  ``NEGLIGIBLE_S`` it counts as none.
- A node whose measured cost is not known yet (``probe``) is pre-warmed whenever that is
  possible, so that a request runs with nothing loading beside it and measures the difference.
- With too little history, the function's own keep-alive applies.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from dilu.workflows.plan import MIN_BRANCH_PROBABILITY, NodeEstimate, PlannedNode, behind_conditions, plan
from dilu.workflows.spec import WorkflowSpec

DEFAULT_PRICE = 0.01          # s of latency per GiB-second held
WINDOW_QUANTILE = 0.9
EARLY_QUANTILE = 0.1
MIN_UNLOADED_S = 1.0          # a pre-warm that unloads for less is not worth the reload
READY_MARGIN_S = 0.05         # a pre-warm is ready this long before the next request is likely
# ... and a root's (no slack: late costs its whole lateness) this long. Traced on two cores, the
# fan-in's backbone pre-warm at 0.05 s was still loading when 4 of 8 requests came (+19 to +201 ms).
ROOT_READY_MARGIN_S = 0.2
MAX_WINDOW_S = 600.0
MIN_GAPS = 2                  # gaps seen before holding anything
NEGLIGIBLE_S = 0.01           # a measured cost below this leaves the node released (not to its keep-alive)
GiB = 2**30
# What stopping an instance costs the nodes of its request still running: the controller's pass,
# the worker's stop and the process's exit take CPU beside them (a fan-in's four parallel nodes
# took 93 ms instead of 56 ms, median, when their parent's instance stopped as they ran; two-core host).
STOP_COST_S = 0.04


class Verdict(StrEnum):
    HOLD = "hold"             # kept loaded until the window ends
    PREWARM = "prewarm"       # unloaded once idle, loaded again just before the next request is likely
    RELEASE = "release"       # unloaded once idle, loaded in the next request's slack (or when reached)
    DEFAULT = "default"       # too little history: the function's own keep-alive applies


@dataclass(frozen=True)
class NodeKeep:
    verdict: Verdict
    hold_s: float             # hold (or, pre-warmed, keep) it until this long from now; else 0
    exposed_s: float
    reason: str
    prewarm_in_s: float = 0.0  # "prewarm": unloaded until this long from now, then loaded again


def exposed_cold_s(spec: WorkflowSpec, estimates: dict[str, NodeEstimate]) -> dict[str, float]:
    """Each node's cold start left over after its slack, with every other node warm."""
    return _exposed(_needed_at_s(spec, estimates), estimates)


def idle_loaded_s(spec: WorkflowSpec, estimates: dict[str, NodeEstimate]) -> dict[str, float]:
    """How long each node, loaded before a request arrives, sits loaded in it before it is
    needed, beyond what loading it in the slack would hold: its slack less its cold start."""
    return _idle(_needed_at_s(spec, estimates), estimates)


def _exposed(needed: dict[str, float], estimates: dict[str, NodeEstimate]) -> dict[str, float]:
    return {name: round(max(0.0, estimates[name].cold_s - at), 6) for name, at in needed.items()}


def _idle(needed: dict[str, float], estimates: dict[str, NodeEstimate]) -> dict[str, float]:
    return {name: round(max(0.0, at - estimates[name].cold_s), 6) for name, at in needed.items()}


def warm_timeline(spec: WorkflowSpec, estimates: dict[str, NodeEstimate]) -> dict[str, PlannedNode]:
    """The request's timeline with every node warm: what slack and exposure are measured against."""
    warm = {n: NodeEstimate(e.exec_s, e.cold_s, True) for n, e in estimates.items()}
    return plan(spec, warm, policy="on-demand")


def _needed_at_s(spec: WorkflowSpec, estimates: dict[str, NodeEstimate],
                 timeline: dict[str, PlannedNode] | None = None) -> dict[str, float]:
    timeline = timeline or warm_timeline(spec, estimates)
    return {name: planned.needed_at_s for name, planned in timeline.items()}


def decided_ahead_s(spec: WorkflowSpec, estimates: dict[str, NodeEstimate],
                    timeline: dict[str, PlannedNode] | None = None) -> dict[str, float]:
    """For each node with a condition: how long before the node is needed (everything warm) its
    condition is decided, when the node it reads answers."""
    timeline = timeline or warm_timeline(spec, estimates)
    return {node.name: round(max(0.0, timeline[node.name].needed_at_s - timeline[node.when.node].done_at_s), 6)
            for node in spec.nodes if node.when is not None}


def window_s(gaps: list[float], quantile: float = WINDOW_QUANTILE, maximum: float = MAX_WINDOW_S) -> float | None:
    """The gap within which ``quantile`` of the workflow's requests followed the one before
    (None without ``MIN_GAPS`` gaps)."""
    if len(gaps) < MIN_GAPS:
        return None
    ordered = sorted(gaps)
    index = min(len(ordered) - 1, max(0, int(round(quantile * len(ordered))) - 1))
    return min(maximum, ordered[index])


def decide(spec: WorkflowSpec, estimates: dict[str, NodeEstimate], memory_bytes: dict[str, int],
           gaps: list[float], ran_probability: dict[str, float], *, price: float = DEFAULT_PRICE,
           margin_s: float = 0.1, ready_margin_s: float = READY_MARGIN_S,
           root_ready_margin_s: float = ROOT_READY_MARGIN_S, elapsed_s: float = 0.0,
           observed_exposed: dict[str, float] | None = None, probe: frozenset[str] = frozenset()) -> dict[str,
                                                                                                          NodeKeep]:
    """Each node's keep verdict after a request. ``margin_s``: an estimated exposure this small
    counts as none. ``ready_margin_s``: a pre-warm is ready this much before the next request is
    likely (small: the cold start it is loaded ahead by is already a long estimate of the
    function's loads, see ``dilu.workflows.history.lead_estimate``); a node needed as the
    request arrives (a root) uses ``root_ready_margin_s``: nothing hides its lateness. ``elapsed_s``: since
    the request arrived (the gaps count from arrivals). ``observed_exposed``: what loading each
    node in the slack was measured to cost a request lately (its wait and its share of the
    slowdown of the nodes beside its load; noise already left out). ``probe``: nodes whose cost
    is not measured yet."""
    observed = observed_exposed or {}
    timeline = warm_timeline(spec, estimates)      # computed once: every measure below reads it
    needed = _needed_at_s(spec, estimates, timeline)
    estimated, idle = _exposed(needed, estimates), _idle(needed, estimates)
    window = window_s(gaps)
    early = window_s(gaps, EARLY_QUANTILE)
    result = {}
    conditional = behind_conditions(spec)
    decided_ahead = decided_ahead_s(spec, estimates, timeline)
    for node in spec.nodes:
        measured = observed.get(node.name, 0.0)
        shown = max(estimated[node.name] if estimated[node.name] > margin_s else 0.0,
                    measured if measured >= NEGLIGIBLE_S else 0.0)
        if node.name in conditional and ran_probability.get(node.name, 1.0) < MIN_BRANCH_PROBABILITY:
            # Loaded once chosen, not in the slack: hidden only by what runs after the decision.
            shown = round(max(0.0, estimates[node.name].cold_s - decided_ahead.get(node.name, 0.0)), 6)
        if shown == 0.0 and node.name not in probe:
            result[node.name] = NodeKeep(Verdict.RELEASE, 0.0, shown, "its loading hides in the slack")
            continue
        if window is None or early is None:
            result[node.name] = NodeKeep(Verdict.DEFAULT, 0.0, shown, "too few requests to weigh holding it")
            continue
        ran = ran_probability.get(node.name, 1.0)
        gib = memory_bytes.get(node.name, 0) / GiB
        lead = estimates[node.name].cold_s
        margin = ready_margin_s if needed[node.name] > 0 else max(ready_margin_s, root_ready_margin_s)
        unloaded = early - elapsed_s - lead - margin
        if node.name in probe and unloaded >= MIN_UNLOADED_S:
            result[node.name] = NodeKeep(Verdict.PREWARM, window, shown, "pre-warmed once to measure what loading it "
                                         "beside a request costs", prewarm_in_s=round(unloaded, 6))
            continue
        if shown == 0.0:
            result[node.name] = NodeKeep(Verdict.RELEASE, 0.0, shown, "its loading hides in the slack")
            continue
        neither = sum(1 for g in gaps if g <= window) / len(gaps) * ran * shown
        # Held or pre-warmed, it is also loaded in the next request until it is needed.
        hold = price * gib * (window + idle[node.name])
        prewarm = None
        if unloaded >= MIN_UNLOADED_S:
            p_early = sum(1 for g in gaps if g < elapsed_s + unloaded + lead) / len(gaps)
            prewarm = p_early * ran * shown + price * gib * (max(0.0, window - unloaded) + idle[node.name])
        best = min(hold, prewarm if prewarm is not None else hold, neither)
        if hold == best:
            result[node.name] = NodeKeep(Verdict.HOLD, window, shown, f"saves {neither:.3f} s per request for "
                                         f"{hold:.3f} s-worth of memory over {window:.1f} s")
        elif prewarm == best:
            result[node.name] = NodeKeep(Verdict.PREWARM, window, shown, f"unloaded for {unloaded:.1f} s of the "
                                         f"{window:.1f} s before the next request (costs {prewarm:.3f} s, "
                                         f"holding {hold:.3f} s)", prewarm_in_s=round(unloaded, 6))
        else:
            result[node.name] = NodeKeep(Verdict.RELEASE, 0.0, shown, f"holding it ({hold:.3f}) is worth more than "
                                         f"the {neither:.3f} s it saves: loaded when needed")
    return result


def release_hint_s(window: float, took_s: float, minimum_s: float = 0.25) -> float:
    """How long after a request's end a node released or pre-warmed by the rule may still be
    unloaded the moment it is idle: until it is done in the next request. That one comes within
    ``window`` of this one's arrival, so it is done about ``window`` after this one's end; arrivals
    and runs jitter by up to a request's length, so this one's length (``took_s``) is the margin.
    A hint that ran out first kept the node to the end of its request."""
    return max(window, minimum_s) + took_s


def release_mid_request(gib: float, remaining_s: float, *, price: float = DEFAULT_PRICE,
                        stop_cost_s: float = STOP_COST_S) -> bool:
    """Whether a node done while the rest of its request still runs lets its function go now
    (unloaded once idle) rather than when the request ends: when the memory it would hold until
    then (``gib`` for the ``remaining_s`` the plan expects the request still to take, at
    ``price``) is worth more than what its stop costs the nodes running meanwhile. At the
    default price a few hundred MiB are kept to the end of a request that ends within seconds;
    a model of several GiB before a long tail leaves at once."""
    return price * gib * max(0.0, remaining_s) > stop_cost_s
