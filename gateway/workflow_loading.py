"""Loading a workflow request's nodes ahead of need (``dilu.policy.slack`` decides when; this
module gathers its inputs and acts on its plan).

Inputs per node: its function's expected execution time (the median of what this gateway saw
lately, waits for cold starts left out: those are what the plan is about), its cold start (the
loading stages' estimate of its current version), whether a ready instance exists, and how often the node ran in the workflow's recent requests (for branches).
Acting: at each node's load time the gateway tells the controller the function will be needed
until the node is done (``ActivityRecorder.expect``, then a demand signal), and the controller
starts an instance if none runs and keeps it meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from dilu.policy import node_keepalive
from dilu.policy.interference import interference_s, loading_costs
from dilu.policy.slack import NodeEstimate, plan
from dilu.workflow import WorkflowSpec
from gateway.workflow_run import NodeRun

logger = logging.getLogger(__name__)

DEFAULT_EXEC_S = 0.05     # a node of a function this gateway has not served yet
UNKNOWN_COLD_S = 2.0      # a function version never started yet
RELEASE_HINT_MIN_S = 0.25  # a release hint lasts at least this long after a request (estimates' spread)
HISTORY = 50              # recent requests per workflow that branch probabilities and gaps come from
MEAN_WEIGHT = 0.3         # of the newest sample in the running means (waits, service times)
LEADS_KEPT = 5            # the newest loads of a function its lead estimate comes from
LEAD_TIMEOUT_S = 60.0
REMEASURE_AFTER = 30      # requests after which a slowdown measured beside loads is measured again
LOADS_KEPT_S = 300.0      # how long a finished load's span is kept to compare node runs against


class WorkflowHistory:
    """When each workflow's recent requests arrived, and how often each of its nodes ran."""

    def __init__(self) -> None:
        self._ran: dict[tuple[str, str], deque[bool]] = {}
        self._arrivals: dict[str, deque[float]] = {}
        self._leads: dict[str, deque[float]] = {}
        self._prewarms: dict[str, asyncio.TimerHandle] = {}
        self._waits: dict[tuple[str, str], float] = {}
        self._loads: list[list] = []           # [function, began, ended or None (monotonic clock), owner]
        self._alone: dict[tuple[str, str], float] = {}     # (workflow, function): service time, no load beside
        self._beside: dict[tuple[str, str], tuple[float, int]] = {}   # ... beside loads, and at which request
        self._overlap: dict[tuple[str, str], float] = {}   # (workflow, function): its load beside a node's run, s
        self._requests: dict[str, int] = {}
        self._decisions: dict[str, dict[str, dict[str, Any]]] = {}

    def loaded(self, function: str, seconds: float) -> None:
        """A load this gateway asked for took ``seconds`` until the function could be routed to:
        the loading stages plus what they do not cover (the controller's decision, placement,
        the news of readiness reaching the gateway)."""
        self._leads.setdefault(function, deque(maxlen=LEADS_KEPT)).append(seconds)

    def lead_s(self, function: str) -> float | None:
        return lead_estimate(self._leads.get(function, ()))

    def arrived(self, workflow: str, at: float) -> None:
        self._arrivals.setdefault(workflow, deque(maxlen=HISTORY + 1)).append(at)
        self._requests[workflow] = self._requests.get(workflow, 0) + 1

    def load_began(self, function: str, at: float, owner: object = None) -> list:
        """A load this gateway asked for (for ``owner``: a request's ``Loads``, a pre-warm) is in
        flight from ``at`` (monotonic); ``load_ended`` with the returned span closes it. An
        earlier load of the function still in flight ends here: from now on this one covers it
        (and it may never have started: see ``superseded``)."""
        self._loads = [span for span in self._loads if span[2] is None or at - span[2] < LOADS_KEPT_S]
        for older in self._loads:
            if older[0] == function and older[2] is None:
                older[2] = at
        span = [function, at, None, owner]
        self._loads.append(span)
        return span

    def adopt(self, function: str, previous: object, owner: object) -> None:
        """``owner`` took over ``previous``'s load of ``function`` still in flight (a request
        arrived while its pre-warm was loading): that load is now the request's own."""
        for span in self._loads:
            if span[0] == function and span[2] is None and span[3] is previous:
                span[3] = owner

    def in_flight(self, function: str, owner: object) -> list | None:
        """``owner``'s load of ``function`` still in flight, if any: a node reached before the
        load its request asked for (or took over) is done waits for that same load, which goes
        on being timed from when it was asked for (a pre-warm that came late counts as late,
        not as a load that never was)."""
        return next((span for span in self._loads if span[0] == function and span[2] is None and span[3] is owner), None)

    def superseded(self, span: list) -> bool:
        """Whether a newer load of the span's function began before this one became routable: a
        load asked for and then no longer needed (its node skipped or done before the controller
        acted) is never started, and becomes routable only through the next request's load; its
        time says nothing of how long loading takes."""
        return any(other is not span and other[0] == span[0] and other[1] > span[1] for other in self._loads)

    @staticmethod
    def load_ended(span: list, at: float) -> None:
        span[2] = at

    def last_arrival(self, workflow: str) -> float | None:
        times = self._arrivals.get(workflow)
        return times[-1] if times else None

    def prewarm_later(self, function: str, handle: asyncio.TimerHandle) -> None:
        """Keeps one pending pre-warm per function: a newer plan replaces the older one."""
        older = self._prewarms.pop(function, None)
        if older is not None:
            older.cancel()
        self._prewarms[function] = handle

    def gaps(self, workflow: str) -> list[float]:
        times = list(self._arrivals.get(workflow, ()))
        return [b - a for a, b in zip(times, times[1:])]

    def waited(self, workflow: str, ahead: frozenset[str], runs: dict[str, NodeRun],
               waits: dict[str, float], spec: WorkflowSpec) -> None:
        """What the nodes loaded ahead in one request (cold when it arrived) still waited for
        their instance when they were reached: the part of their loading the slack did not
        hide, as it happened. Nodes warm at arrival say nothing about it."""
        for name in ahead:
            if runs.get(name) is not None and runs[name].status == "ok":
                self._waits[(workflow, name)] = _running_mean(self._waits.get((workflow, name)),
                                                              waits.get(spec.node(name).function, 0.0))

    def served(self, workflow: str, function: str, began: float, ended: float) -> None:
        """A node's function served a workflow request from ``began`` to ``ended`` (monotonic,
        its wait for an instance left out): remembered as alone or beside other functions' loads,
        and, beside them, how long each of those loads overlapped it."""
        overlaps = {}
        for other, start, end, _ in self._loads:
            overlap = min(ended, end if end is not None else ended) - max(began, start)
            if other != function and overlap > 0:   # one load may have two spans (planned, then reached cold)
                overlaps[other] = max(overlaps.get(other, 0.0), overlap)
        key = (workflow, function)
        if not overlaps:
            self._alone[key] = _running_mean(self._alone.get(key), ended - began)
            return
        known = self._beside.get(key)
        self._beside[key] = (_running_mean(known[0] if known else None, ended - began), self._requests.get(workflow, 0))
        for other, overlap in overlaps.items():
            self._overlap[(workflow, other)] = _running_mean(self._overlap.get((workflow, other)), overlap)

    def loading_cost(self, workflow: str, spec: WorkflowSpec) -> tuple[dict[str, float], frozenset[str]]:
        """What loading each node in the slack was measured to cost a request lately (its wait,
        and its share of the slowdown of the nodes running beside the loads, by how long its load
        overlapped them), and the nodes whose cost is unknown until a request runs with nothing
        loading beside it."""
        now = self._requests.get(workflow, 0)
        for key in [k for k, (_, at) in self._beside.items() if k[0] == workflow and now - at > REMEASURE_AFTER]:
            del self._beside[key]
        waits = self.observed_exposure(workflow)
        blame = {n.name: self._overlap[(workflow, n.function)] for n in spec.nodes
                 if (workflow, n.function) in self._overlap}
        alone = {n.name: self._alone[(workflow, n.function)] for n in spec.nodes if (workflow, n.function) in self._alone}
        beside = {n.name: self._beside[(workflow, n.function)][0] for n in spec.nodes
                  if (workflow, n.function) in self._beside}
        slowdown = interference_s(spec, alone, beside)
        if slowdown is None:
            return loading_costs(waits, 0.0, {}), frozenset(waits) | frozenset(blame)
        return loading_costs(waits, slowdown, blame), frozenset()

    def decided(self, workflow: str, verdicts: dict[str, node_keepalive.NodeKeep]) -> None:
        self._decisions[workflow] = {node: {"verdict": v.verdict, "exposed_s": v.exposed_s, "reason": v.reason}
                                     for node, v in verdicts.items()}

    def decisions(self, workflow: str) -> dict[str, dict[str, Any]]:
        """The latest keep decision per node of ``workflow`` (empty before its first)."""
        return self._decisions.get(workflow, {})

    def observed_exposure(self, workflow: str) -> dict[str, float]:
        return {node: seconds for (name, node), seconds in self._waits.items() if name == workflow}

    def record(self, workflow: str, runs: dict[str, NodeRun]) -> None:
        for node, run in runs.items():
            if run.status in ("ok", "skipped", "failed", "timeout"):
                self._ran.setdefault((workflow, node), deque(maxlen=HISTORY)).append(run.status != "skipped")

    def probability(self, workflow: str, spec: WorkflowSpec) -> dict[str, float]:
        result = {}
        for node in spec.nodes:
            seen = self._ran.get((workflow, node.name))
            result[node.name] = sum(seen) / len(seen) if seen else 0.0
        return result


def lead_estimate(samples) -> float | None:  # noqa: ANN001 - any sequence of seconds
    """How long a load takes to become routable, from the newest samples: the second longest
    (the longest with fewer than three). A load that shows up late costs a request the
    difference, one that is early only its memory for that long, so the estimate leans long;
    but not to the very longest, which can be one load that waited on something unrelated (a
    load asked for and then no longer needed, which only became routable at the next one) and
    would otherwise move every later load far ahead of need."""
    ordered = sorted(samples)
    if not ordered:
        return None
    return ordered[-2] if len(ordered) >= 3 else ordered[-1]


def _running_mean(known: float | None, sample: float) -> float:
    return sample if known is None else known + MEAN_WEIGHT * (sample - known)


def estimates(services: Any, spec: WorkflowSpec, now: float) -> dict[str, NodeEstimate]:
    result = {}
    for node in spec.nodes:
        entry = services.functions.get(node.function)
        cold = entry.cold_start_s if entry is not None and entry.cold_start_s is not None else UNKNOWN_COLD_S
        lead = services.workflows.lead_s(node.function)
        cold = max(cold, lead) if lead is not None else cold      # what loading really took, end to end
        result[node.name] = NodeEstimate(exec_s=services.service_time.median_s(node.function, now) or DEFAULT_EXEC_S,
                                         cold_s=cold, warm=bool(services.routing.endpoints(node.function)))
    return result


PREWARM = "pre-warm"       # the owner of a pre-warm's expectation: the next request takes it over
HOLD = "hold"


@dataclass(eq=False)           # the owner of its request's expectations: compared by identity
class Loads:
    """The loads arranged for one request, and which nodes they are for."""
    handles: list[asyncio.TimerHandle]
    ahead: frozenset[str]      # nodes cold at arrival that the plan loads ahead of need
    ends_at: float = 0.0       # when the plan expects the request to be done (unix time)
    deadline: float = 0.0      # when the request's time limit runs out: its expectations last no longer

    def cancel(self) -> None:
        for handle in self.handles:
            handle.cancel()


def schedule_loads(services: Any, name: str, spec: WorkflowSpec) -> Loads:
    """Arranges the loads the plan asks for, and expects every node's function until the node is
    done: the request owns those expectations, ``node_finished`` ends each, and the caller cancels
    what is left when the request ends. Their time limit is the request's own (the workflow's
    timeout), not the plan's estimate of the node's end: a request that runs longer than its
    plan (an upstream node slower than its history) must not see the nodes it still needs
    released under it and loaded again when reached."""
    now = time.time()
    services.workflows.arrived(name, now)
    expected = estimates(services, spec, now)
    timeline = plan(spec, expected, policy=spec.loading, branch_probability=services.workflows.probability(name, spec))
    loop = asyncio.get_running_loop()
    loads = Loads([], frozenset(n for n, planned in timeline.items() if planned.load_at_s is not None),
                  ends_at=now + max((planned.done_at_s for planned in timeline.values()), default=0.0),
                  deadline=now + spec.timeout_s)
    for node_name, planned in timeline.items():
        function, until = spec.node(node_name).function, loads.deadline
        # What it was pre-warmed for has come: the request holds it now (ready or still loading).
        if services.activity.take_over(function, PREWARM, loads, until):
            services.workflows.adopt(function, PREWARM, loads)
            continue
        if expected[node_name].warm:
            services.activity.expect(function, until, loads)     # kept until its node is done
        elif planned.load_at_s is not None:
            loads.handles.append(loop.call_later(planned.load_at_s, _load, services, function, until, loads))
    # The controller sees expectations as of the gateway's latest flush: until the next one it
    # would still see the pre-warms' own, which end about when their request arrives, and
    # release the nodes the request has just taken over.
    services.spawn(services.flush_activity())
    return loads


def node_finished(services: Any, loads: Loads, spec: WorkflowSpec, node: str, runs: dict[str, NodeRun]) -> None:
    """A node of the request is done (or skipped): once no other node of the request still needs
    its function, the request stops expecting it now if its memory until the request's expected
    end is worth more than the stop costs the nodes still running
    (``node_keepalive.release_mid_request``), and a function the keep-alive rule lets go when
    idle is released now; otherwise ``request_finished`` lets it go."""
    function = spec.node(node).function
    if any(runs[other.name].status == "pending" for other in spec.nodes if other.function == function):
        return
    gib = _memory_bytes(services, function) / node_keepalive.GiB
    if not node_keepalive.release_mid_request(gib, loads.ends_at - time.time(),
                                              price=services.settings.workflow_memory_price):
        # Kept however long the request still runs (its expectation was only until the node's
        # expected end); ``request_finished`` ends it.
        services.activity.expect(function, loads.deadline, loads)
        return
    services.activity.fulfilled(function, loads)
    if services.activity.releasable_now(function):
        services.spawn(services.wake_controller())


def branch_chosen(services: Any, loads: Loads, spec: WorkflowSpec, node: str) -> None:
    """A node behind a condition was chosen (its condition holds) before it can run: loading in
    the slack, if the plan did not load it ahead (a branch taken too rarely) and it is cold, it
    starts loading now, in the time its other ancestors still take, not once it is reached. The
    request holds it until it ends."""
    function = spec.node(node).function
    if spec.loading != "slack" or node in loads.ahead or services.routing.endpoints(function):
        return
    _load(services, function, loads.deadline, loads)


def request_finished(services: Any, loads: Loads, spec: WorkflowSpec) -> None:
    """The request is over (answered or failed): its pending loads are cancelled and it expects
    none of its functions any more."""
    loads.cancel()
    for node in spec.nodes:
        services.activity.fulfilled(node.function, loads)


def _memory_bytes(services: Any, function: str) -> int:
    entry = services.functions.get(function)
    return int((entry.spec.get("resources") or {}).get("memory") or 0) if entry else 0


def _load(services: Any, function: str, until: float, owner: object = None) -> None:
    """Has ``function`` loaded (if it is not) and kept until ``until``, and measures how long
    the load takes to become routable."""
    services.activity.expect(function, until, owner)
    services.spawn(services.demand(function))
    if not services.routing.endpoints(function):
        services.spawn(_measure_lead(services, function, owner))


async def _measure_lead(services: Any, function: str, owner: object) -> None:
    started = time.monotonic()
    span = services.workflows.load_began(function, started, owner)
    try:
        # A load nobody wants any more when its function becomes routable (its node was skipped
        # or done first) was likely never started: the function came through something else.
        if (await services.routing.until_routable(function, LEAD_TIMEOUT_S)
                and not services.workflows.superseded(span) and services.activity.expects(function)):
            services.workflows.loaded(function, time.monotonic() - started)
    finally:
        if span[2] is None:
            services.workflows.load_ended(span, time.monotonic())


def keep_nodes(services: Any, name: str, spec: WorkflowSpec) -> dict[str, node_keepalive.NodeKeep]:
    """After a request of a workflow loading in the slack: holds the nodes whose cold start would
    show and are worth their memory, or releases them and loads them again just before the next
    request is likely (pre-warm); marks those whose loading hides as releasable once idle."""
    if spec.loading != "slack":
        return {}
    now = time.time()
    memory = {node.name: _memory_bytes(services, node.function) for node in spec.nodes}
    arrived = services.workflows.last_arrival(name)
    expected = estimates(services, spec, now)
    cost, probe = services.workflows.loading_cost(name, spec)
    verdicts = node_keepalive.decide(spec, expected, memory, services.workflows.gaps(name),
                                     services.workflows.probability(name, spec),
                                     price=services.settings.workflow_memory_price,
                                     elapsed_s=max(0.0, now - arrived) if arrived is not None else 0.0,
                                     observed_exposed=cost, probe=probe)
    services.workflows.decided(name, verdicts)
    logger.debug("workflow %s keeps (measured cost %s, to measure %s): %s", name, cost, sorted(probe),
                 "; ".join(f"{n} {v.verdict} ({v.exposed_s:.3f} s: {v.reason})" for n, v in verdicts.items()))
    window = node_keepalive.window_s(services.workflows.gaps(name)) or 0.0
    took = max(0.0, now - arrived) if arrived is not None else 0.0
    hint_until = now + node_keepalive.release_hint_s(window, took, RELEASE_HINT_MIN_S)
    for node in spec.nodes:
        verdict, function = verdicts[node.name], node.function
        others = [verdicts[n.name].verdict for n in spec.nodes if n.function == function]
        if verdict.verdict == "hold":
            services.activity.expect(function, now + verdict.hold_s, HOLD)
        elif verdict.verdict == "prewarm" and "hold" not in others:
            # Released when idle until the window ends: now, and again once its node is done in
            # the next request (the pre-warm's expectation keeps it in between).
            services.activity.release_when_idle(function, hint_until)
            services.workflows.prewarm_later(function, asyncio.get_running_loop().call_later(
                verdict.prewarm_in_s, _load, services, function, now + verdict.hold_s, PREWARM))
        elif verdict.verdict == "release" and all(v == "release" for v in others):
            services.activity.release_when_idle(function, hint_until)
    services.spawn(services.wake_controller())   # the controller acts on releases now, not at its next pass
    return verdicts
