"""Running a workflow request on a gateway, loading its nodes ahead of need and keeping them after.

``WorkflowLoader`` is the one place a request goes through, typed against ``Platform`` (what it
needs of the gateway: ``gateway.workflow_platform`` adapts it). Per request it

1. reads what recent requests said (``history``, shared through the state store) and plans each
   node's load (``plan``): at each load time the function is *expected* until the request's
   limit, which has the controller start an instance and keep it (``hints``);
2. runs the nodes (``run``), timing each node's wait and run against the loads in flight
   (``spans``), and lets each function go as its last node is done if its memory until the
   request's end is worth more than its stop (``keep.release_mid_request``);
3. appends the request's record to the shared history and, loading in the slack, decides each
   node's keep-alive from it (``keep.decide``): hold, pre-warm (a timer here) or release.

Pre-warm timers and the spans of loads in flight belong to the gateway that asked for them; all
that decisions are made from is shared, so two gateways decide as one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from dilu.state.base import StateStore
from dilu.workflows import keep
from dilu.workflows.hints import WorkflowHints
from dilu.workflows.history import HISTORY, LEADS_KEPT, RequestRecord, Served, WorkflowHistory, fold, lead_estimate
from dilu.workflows.plan import NodeEstimate, plan
from dilu.workflows.run import NodeRun, WorkflowFailed, run_workflow
from dilu.workflows.spans import LoadSpans
from dilu.workflows.spec import WorkflowSpec

logger = logging.getLogger(__name__)

DEFAULT_EXEC_S = 0.05     # a node of a function no request has run yet
UNKNOWN_COLD_S = 2.0      # a function version never started yet
RELEASE_HINT_MIN_S = 0.25  # a release hint lasts at least this long after a request (estimates' spread)
LEAD_TIMEOUT_S = 60.0
HISTORY_TTL_S = 86400.0   # a workflow's history outlives a day without requests no longer
STORE_TIMEOUT_S = 1.0     # a state store slower than this is out: the request goes on without it
PREWARM = "pre-warm"      # the owner of a pre-warm's expectation: the next request takes it over
HOLD = "hold"


class Invoked(NamedTuple):
    status: int
    body: bytes
    queued_s: float       # how long it waited for an instance


class Platform(Protocol):
    """What running workflows needs of the gateway."""

    hints: WorkflowHints
    memory_price: float   # s of latency per GiB-second held (DILU_WORKFLOW_MEMORY_PRICE)

    def cold_start_s(self, function: str) -> float | None: ...
    def memory_bytes(self, function: str) -> int: ...
    def warm(self, function: str) -> bool: ...
    def service_time_s(self, function: str, now: float) -> float | None: ...
    async def invoke(self, function: str, body: bytes) -> Invoked: ...
    async def until_routable(self, function: str, timeout_s: float) -> bool: ...
    def demand(self, function: str) -> None: ...
    def flush_hints(self) -> None: ...
    def wake_controller(self) -> None: ...
    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> None: ...


def records_key(workflow: str) -> str:
    return f"workflow:{workflow}"


def leads_key(function: str) -> str:
    return f"workflow-lead:{function}"


def decision_key(workflow: str) -> str:
    return f"workflow-keep:{workflow}"


@dataclass(eq=False)           # the owner of its request's expectations: compared by identity
class RequestLoads:
    """One request: the loads arranged for it, and what it measured."""

    loader: WorkflowLoader
    spec: WorkflowSpec
    arrived_at: float                       # unix time
    ahead: frozenset[str] = frozenset()     # nodes cold at arrival that the plan loads ahead of need
    ends_at: float = 0.0                    # when the plan expects the request to be done
    deadline: float = 0.0                   # when its time limit runs out: its expectations last no longer
    handles: list[asyncio.TimerHandle] = field(default_factory=list)
    waits: dict[str, float] = field(default_factory=dict)    # function: its longest wait for an instance
    served: list[Served] = field(default_factory=list)

    async def call(self, function: str, body: bytes) -> tuple[int, bytes]:
        """One node's invocation. A node reached cold waits for the load its request asked for
        (or took over from a pre-warm), or loads its function now, beside the nodes running."""
        platform, spans = self.loader.platform, self.loader.spans
        began = time.monotonic()
        cold = None if platform.warm(function) else (
            spans.in_flight(function, self) or spans.begin(function, began, self))
        outcome = await platform.invoke(function, body)
        ready = began + outcome.queued_s
        if cold is not None:
            spans.end(cold, ready)
        self.waits[function] = max(self.waits.get(function, 0.0), outcome.queued_s)
        if outcome.status < 400:
            ended = time.monotonic()
            self.served.append(Served(function, ended - ready, spans.overlaps(function, ready, ended)))
        return outcome.status, outcome.body

    def node_finished(self, node: str, runs: dict[str, NodeRun]) -> None:
        """Once no other node of the request still needs its function, the request stops
        expecting it now if its memory until the request's expected end is worth more than its
        stop costs the nodes still running; otherwise it is kept until the request ends."""
        platform = self.loader.platform
        function = self.spec.node(node).function
        if any(runs[other.name].status == "pending" for other in self.spec.nodes if other.function == function):
            return
        gib = platform.memory_bytes(function) / keep.GiB
        if not keep.release_mid_request(gib, self.ends_at - self.loader.clock(), price=platform.memory_price):
            platform.hints.expect(function, self.deadline, self)
            return
        platform.hints.fulfilled(function, self)
        if platform.hints.releasable_now(function, self.loader.clock()):
            platform.wake_controller()

    def branch_chosen(self, node: str) -> None:
        """A node behind a condition was chosen before it can run: if the plan did not load it
        ahead (a branch taken too rarely) and it is cold, it starts loading now, in the time its
        other ancestors still take."""
        function = self.spec.node(node).function
        if self.spec.loading != "slack" or node in self.ahead or self.loader.platform.warm(function):
            return
        self.loader.load(function, self.deadline, self)

    def release(self) -> None:
        """The request is over: its pending loads are cancelled and it expects none of its functions."""
        for handle in self.handles:
            handle.cancel()
        for node in self.spec.nodes:
            self.loader.platform.hints.fulfilled(node.function, self)

    def record(self, runs: dict[str, NodeRun], answered: bool) -> RequestRecord:
        ran = {n: r.status != "skipped" for n, r in runs.items() if r.status in ("ok", "skipped", "failed", "timeout")}
        # What the nodes loaded ahead still waited when reached: the part the slack did not hide.
        waits = {n: self.waits.get(self.spec.node(n).function, 0.0) for n in self.ahead
                 if answered and runs.get(n) is not None and runs[n].status == "ok"}
        return RequestRecord(self.arrived_at, ran, waits, tuple(self.served))


class WorkflowLoader:
    """One gateway's workflow requests (see the module's docstring)."""

    def __init__(self, platform: Platform, store: StateStore, clock: Callable[[], float] = time.time) -> None:
        self.platform = platform
        self.store = store
        self.clock = clock            # unix time: arrivals, expectations, hints
        self.spans = LoadSpans()
        self._prewarms: dict[str, asyncio.TimerHandle] = {}

    async def invoke(self, name: str, spec: WorkflowSpec, request: Any) -> tuple[Any, dict[str, NodeRun]]:
        """The workflow's output and each node's run; ``WorkflowFailed`` when it fails."""
        loads = await self._schedule(name, spec, self.clock())
        try:
            output, runs = await run_workflow(spec, request, loads.call, loads.node_finished, loads.branch_chosen)
        except WorkflowFailed as failure:
            loads.release()
            await self.record(name, loads.record(failure.runs, answered=False))
            self.platform.wake_controller()       # what it no longer needs may go now
            raise
        loads.release()
        await self.record(name, loads.record(runs, answered=True))
        await self.keep_nodes(name, spec)
        return output, runs

    async def record(self, name: str, record: RequestRecord) -> None:
        """Adds a finished request of ``name`` to the history every gateway reads."""
        await self._append(records_key(name), record.to_wire(), HISTORY)

    async def decisions(self, name: str) -> dict[str, dict[str, Any]]:
        """The latest keep decision per node of ``name`` made by any gateway (empty before the first)."""
        found = (await self._read([decision_key(name)])).get(decision_key(name))
        return found[-1] if found else {}

    async def history(self, name: str, spec: WorkflowSpec) -> tuple[WorkflowHistory, dict[str, list[float]]]:
        """What the shared records say of ``name``, and each of its functions' recent load times."""
        functions = sorted({node.function for node in spec.nodes})
        lists = await self._read([records_key(name), *(leads_key(f) for f in functions)])
        records = [RequestRecord.from_wire(item) for item in lists.get(records_key(name), [])]
        leads = {f: [float(item["s"]) for item in lists.get(leads_key(f), [])] for f in functions}
        return fold(records), leads

    def estimates(self, spec: WorkflowSpec, history: WorkflowHistory, leads: dict[str, list[float]],
                  now: float) -> dict[str, NodeEstimate]:
        """Each node's execution time (what its function took in the workflow lately), cold start
        (the loading stages' estimate, or what loading really took end to end if longer) and
        whether it is warm."""
        result = {}
        for node in spec.nodes:
            cold = self.platform.cold_start_s(node.function)
            cold = UNKNOWN_COLD_S if cold is None else cold
            lead = lead_estimate(leads.get(node.function, []))
            exec_s = history.exec_s(node.function) or self.platform.service_time_s(node.function, now)
            result[node.name] = NodeEstimate(exec_s=exec_s or DEFAULT_EXEC_S,
                                             cold_s=max(cold, lead) if lead is not None else cold,
                                             warm=self.platform.warm(node.function))
        return result

    async def _schedule(self, name: str, spec: WorkflowSpec, now: float) -> RequestLoads:
        """Arranges the loads the plan asks for, and expects every node's function until the
        request's limit (not the plan's estimate of its end: a request slower than its plan must
        not see the nodes it still needs released under it); ``node_finished`` ends each."""
        history, leads = await self.history(name, spec)
        expected = self.estimates(spec, history, leads, now)
        timeline = plan(spec, expected, policy=spec.loading, branch_probability=history.probability(spec))
        loads = RequestLoads(self, spec, now,
                             ahead=frozenset(n for n, planned in timeline.items() if planned.load_at_s is not None),
                             ends_at=now + max((planned.done_at_s for planned in timeline.values()), default=0.0),
                             deadline=now + spec.timeout_s)
        loop, hints = asyncio.get_running_loop(), self.platform.hints
        for node_name, planned in timeline.items():
            function = spec.node(node_name).function
            # What it was pre-warmed for has come: the request holds it now (ready or still loading).
            if hints.take_over(function, PREWARM, loads, loads.deadline):
                self.spans.adopt(function, PREWARM, loads)
            elif expected[node_name].warm:
                hints.expect(function, loads.deadline, loads)
            elif planned.load_at_s is not None:
                loads.handles.append(loop.call_later(planned.load_at_s, self.load, function, loads.deadline, loads))
        # The controller sees expectations as of the latest flush: until the next one it would
        # still see the pre-warms' own, which end about when their request arrives.
        self.platform.flush_hints()
        return loads

    def load(self, function: str, until: float, owner: object = None) -> None:
        """Has ``function`` loaded (if it is not) and kept until ``until``, and times the load."""
        self.platform.hints.expect(function, until, owner)
        self.platform.demand(function)
        if not self.platform.warm(function):
            self.platform.spawn(self._measure_lead(function, owner))

    async def _measure_lead(self, function: str, owner: object) -> None:
        span = self.spans.begin(function, time.monotonic(), owner)
        try:
            # A load nobody wants any more when its function becomes routable was likely never
            # started: the function came through something else.
            if (await self.platform.until_routable(function, LEAD_TIMEOUT_S) and not self.spans.superseded(span)
                    and self.platform.hints.expects(function, self.clock())):
                await self._append(leads_key(function), {"s": time.monotonic() - span.began}, LEADS_KEPT)
        finally:
            if span.ended is None:
                self.spans.end(span, time.monotonic())

    async def keep_nodes(self, name: str, spec: WorkflowSpec) -> dict[str, keep.NodeKeep]:
        """After a request of a workflow loading in the slack: holds the nodes whose cold start
        would show and are worth their memory, or releases them and loads them again just before
        the next request is likely (pre-warm); marks those whose loading hides as releasable."""
        if spec.loading != "slack":
            return {}
        now = self.clock()
        history, leads = await self.history(name, spec)
        arrived = history.last_arrival
        took = max(0.0, now - arrived) if arrived is not None else 0.0
        cost, probe = history.loading_cost(spec)
        verdicts = keep.decide(spec, self.estimates(spec, history, leads, now),
                               {node.name: self.platform.memory_bytes(node.function) for node in spec.nodes},
                               history.gaps, history.probability(spec), price=self.platform.memory_price,
                               elapsed_s=took, observed_exposed=cost, probe=probe)
        await self._append(decision_key(name), {node: {"verdict": v.verdict, "exposed_s": v.exposed_s,
                                                       "reason": v.reason} for node, v in verdicts.items()}, 1)
        logger.debug("workflow %s keeps (measured cost %s, to measure %s): %s", name, cost, sorted(probe),
                     "; ".join(f"{n} {v.verdict} ({v.exposed_s:.3f} s: {v.reason})" for n, v in verdicts.items()))
        self._act(spec, verdicts, now, now + keep.release_hint_s(keep.window_s(history.gaps) or 0.0, took,
                                                                 RELEASE_HINT_MIN_S))
        return verdicts

    def _act(self, spec: WorkflowSpec, verdicts: dict[str, keep.NodeKeep], now: float, hint_until: float) -> None:
        hints = self.platform.hints
        for node in spec.nodes:
            verdict, function = verdicts[node.name], node.function
            others = [verdicts[n.name].verdict for n in spec.nodes if n.function == function]
            if verdict.verdict == "hold":
                hints.expect(function, now + verdict.hold_s, HOLD)
            elif verdict.verdict == "prewarm" and "hold" not in others:
                # Released when idle until the window ends: now, and again once its node is done
                # in the next request (the pre-warm's expectation keeps it in between).
                hints.release_when_idle(function, hint_until)
                self._prewarm_later(function, asyncio.get_running_loop().call_later(
                    verdict.prewarm_in_s, self.load, function, now + verdict.hold_s, PREWARM))
            elif verdict.verdict == "release" and all(v == "release" for v in others):
                hints.release_when_idle(function, hint_until)
        self.platform.wake_controller()   # the controller acts on releases now, not at its next pass

    def close(self) -> None:
        """Cancels the pre-warms still pending (the gateway is stopping)."""
        for handle in self._prewarms.values():
            handle.cancel()
        self._prewarms.clear()

    def _prewarm_later(self, function: str, handle: asyncio.TimerHandle) -> None:
        """One pending pre-warm per function: a newer plan replaces the older one."""
        older = self._prewarms.pop(function, None)
        if older is not None:
            older.cancel()
        self._prewarms[function] = handle

    async def _read(self, keys: list[str]) -> dict[str, list[dict[str, Any]]]:
        try:
            async with asyncio.timeout(STORE_TIMEOUT_S):
                return await self.store.histories(keys)
        except (TimeoutError, Exception) as exc:  # noqa: BLE001 - a store outage: plan from nothing, as a new workflow
            logger.warning("workflow history unavailable (%s): planning without it", type(exc).__name__)
            return {}

    async def _append(self, key: str, item: dict[str, Any], keep_items: int) -> None:
        try:
            async with asyncio.timeout(STORE_TIMEOUT_S):
                await self.store.append_history(key, item, keep_items, HISTORY_TTL_S)
        except (TimeoutError, Exception) as exc:  # noqa: BLE001 - a store outage loses this sample, not the request
            logger.warning("could not record workflow history (%s)", type(exc).__name__)
