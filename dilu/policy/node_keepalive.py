"""How long a workflow keeps each node's function loaded after a request (pure).

A node's cold start costs a request only the part that does not fit in its slack (the time its
ancestors take, all warm): ``exposed = max(0, cold_start - slack)``.

- A node with nothing exposed loses nothing by being unloaded: loading in the slack brings it
  back in time for the next request. It is **released** as soon as it is idle.
- A node with an exposed cold start is **held** for the window ``W`` within which the workflow's
  next request is likely (the ``window_quantile`` of its recent gaps) when the latency this saves
  outweighs the memory it holds::

      p_need * exposed_s  >=  price * memory_gib * W

  ``p_need``: the share of recent gaps within ``W`` times how often the node ran (branches).
  ``price``: seconds of latency one GiB held for one second is worth (``DEFAULT_PRICE``: holding
  1 GiB for 100 s is worth saving 1 s of one request).
- Otherwise (too little history, or not worth its memory) the function's own keep-alive applies.
"""

from __future__ import annotations

from dataclasses import dataclass

from dilu.policy.slack import NodeEstimate, plan
from dilu.workflow import WorkflowSpec

DEFAULT_PRICE = 0.01          # s of latency per GiB-second held
WINDOW_QUANTILE = 0.9
MAX_WINDOW_S = 600.0
MIN_GAPS = 2                  # gaps seen before holding anything
GiB = 2**30
DIRECT_QUIET_S = 60.0        # a function that served a direct request this recently is never released early


@dataclass(frozen=True)
class NodeKeep:
    verdict: str              # "hold" | "release" | "default"
    hold_s: float             # how long to hold (for "hold"), else 0
    exposed_s: float
    reason: str


def exposed_cold_s(spec: WorkflowSpec, estimates: dict[str, NodeEstimate]) -> dict[str, float]:
    """Each node's cold start left over after its slack, with every other node warm."""
    warm = {n: NodeEstimate(e.exec_s, e.cold_s, True) for n, e in estimates.items()}
    timeline = plan(spec, warm, policy="on-demand")
    return {name: round(max(0.0, estimates[name].cold_s - timeline[name].needed_at_s), 6) for name in timeline}


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
           margin_s: float = 0.1) -> dict[str, NodeKeep]:
    """Each node's keep verdict after a request. ``margin_s``: an exposure this small counts as none."""
    exposed = exposed_cold_s(spec, estimates)
    window = window_s(gaps)
    result = {}
    for node in spec.nodes:
        shown = exposed[node.name]
        if shown <= margin_s:
            result[node.name] = NodeKeep("release", 0.0, shown, "its loading hides in the slack")
            continue
        if window is None:
            result[node.name] = NodeKeep("default", 0.0, shown, "too few requests to weigh holding it")
            continue
        p_need = sum(1 for g in gaps if g <= window) / len(gaps) * ran_probability.get(node.name, 1.0)
        saving = p_need * shown
        cost = price * memory_bytes.get(node.name, 0) / GiB * window
        if saving >= cost:
            result[node.name] = NodeKeep("hold", window, shown, f"saves {saving:.3f} s per request for "
                                         f"{cost:.3f} s-worth of memory over {window:.1f} s")
        else:
            result[node.name] = NodeKeep("default", 0.0, shown, f"holding it ({cost:.3f}) is worth more than "
                                         f"the {saving:.3f} s it saves")
    return result


def releasable(release_idle_until: float | None, direct_at: float | None, now: float) -> bool:
    """Whether a function may be unloaded once idle for its workflows' sake: a gateway said so
    lately, and no direct request (one not from a workflow) came in the last ``DIRECT_QUIET_S``."""
    return (release_idle_until is not None and release_idle_until > now
            and (direct_at is None or now - direct_at > DIRECT_QUIET_S))
