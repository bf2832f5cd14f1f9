"""What a gateway remembers of each workflow: arrival gaps, how often nodes ran, lead times."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from dilu.messages import Endpoint
from dilu.workflow import make_workflow
from gateway.routing import RoutingTable
from gateway.services import ActivityRecorder
from gateway.workflow_loading import MEAN_WEIGHT, PREWARM, REMEASURE_AFTER, WorkflowHistory, _measure_lead
from gateway.workflow_run import NodeRun

pytestmark = pytest.mark.unit

SPEC = make_workflow("""
name: w
nodes:
  - {name: a, function: fa}
  - {name: b, function: fb, after: [a], when: {node: a, field: go, equals: true}}
""")


def test_gaps_between_arrivals() -> None:
    history = WorkflowHistory()
    for at in (10.0, 13.0, 17.5):
        history.arrived("w", at)
    assert history.gaps("w") == [3.0, 4.5] and history.gaps("other") == []


def test_branch_probability_counts_skips_and_ignores_unfinished_nodes() -> None:
    history = WorkflowHistory()
    history.record("w", {"a": NodeRun("ok"), "b": NodeRun("skipped")})
    history.record("w", {"a": NodeRun("ok"), "b": NodeRun("ok")})
    history.record("w", {"a": NodeRun("ok"), "b": NodeRun("pending")})     # cancelled before it was decided
    assert history.probability("w", SPEC) == {"a": 1.0, "b": 0.5}


def test_lead_time_leans_long_but_ignores_the_single_longest_of_the_newest_loads() -> None:
    history = WorkflowHistory()
    assert history.lead_s("fb") is None
    history.loaded("fb", 0.2)
    assert history.lead_s("fb") == pytest.approx(0.2)
    history.loaded("fb", 0.3)
    assert history.lead_s("fb") == pytest.approx(0.3)      # too few to tell an outlier: the longest
    history.loaded("fb", 4.0)                               # one load that waited on something else
    assert history.lead_s("fb") == pytest.approx(0.3)
    for seconds in (0.25, 0.35, 0.2, 0.2):
        history.loaded("fb", seconds)
    assert history.lead_s("fb") == pytest.approx(0.35)     # the newest five: 4.0 is the longest
    history.loaded("fb", 0.3)                               # ... and now drops out
    assert history.lead_s("fb") == pytest.approx(0.3)


def test_a_load_overtaken_by_a_newer_one_of_its_function_is_not_a_lead_time() -> None:
    """A load asked for and then no longer needed is never started: it becomes routable only
    through the next request's load, seconds later, which is no measure of loading."""
    history = WorkflowHistory()
    stray = history.load_began("fb", 10.0)
    assert not history.superseded(stray)
    newer = history.load_began("fb", 14.0)
    assert history.superseded(stray) and not history.superseded(newer)
    assert stray[2] == 14.0           # its span (what nodes ran beside) ends where the newer one begins
    other = history.load_began("fc", 14.1)
    assert not history.superseded(newer) and not history.superseded(other)


@pytest.mark.parametrize("still_wanted", [True, False])
async def test_a_load_counts_as_a_lead_time_only_if_it_is_still_wanted_when_routable(still_wanted: bool) -> None:
    """A load whose node was skipped before the controller acted was never started: when its
    function becomes routable (a deployment, a direct request), that time says nothing."""
    routing = RoutingTable(queue_size=10)
    services = SimpleNamespace(routing=routing, workflows=WorkflowHistory(), activity=ActivityRecorder(routing))
    request = object()
    services.activity.expect("fb", time.time() + 60, request)
    measuring = asyncio.create_task(_measure_lead(services, "fb", request))
    await asyncio.sleep(0)                  # the measurement is waiting for the function
    if not still_wanted:
        services.activity.fulfilled("fb", request)
    routing.set_endpoints("fb", [Endpoint("fb-1", "http://127.0.0.1:9")])
    await measuring
    assert (services.workflows.lead_s("fb") is not None) == still_wanted


async def test_a_prewarm_still_loading_when_its_node_is_reached_is_timed_as_the_load_the_node_waits_for() -> None:
    """A request arrives while its node's pre-warm is still loading and reaches the node before
    it is ready: the node waits for that load (it is not a new one), and the load's time, from
    when the pre-warm asked for it, counts. Were only the pre-warms on time counted, the
    estimate would keep the ones that were late starting too late."""
    routing = RoutingTable(queue_size=10)
    services = SimpleNamespace(routing=routing, workflows=WorkflowHistory(), activity=ActivityRecorder(routing))
    services.activity.expect("fb", time.time() + 60, PREWARM)
    measuring = asyncio.create_task(_measure_lead(services, "fb", PREWARM))
    await asyncio.sleep(0)                  # the pre-warm's load is in flight
    request, other = object(), object()
    assert services.activity.take_over("fb", PREWARM, request, time.time() + 60)
    services.workflows.adopt("fb", PREWARM, request)
    reached = services.workflows.in_flight("fb", request)
    assert reached is not None and services.workflows.in_flight("fb", other) is None
    routing.set_endpoints("fb", [Endpoint("fb-1", "http://127.0.0.1:9")])
    await measuring
    assert services.workflows.lead_s("fb") is not None and not services.workflows.superseded(reached)


def test_a_prewarm_no_request_took_over_is_overtaken_by_the_load_of_the_node_reached_cold() -> None:
    history = WorkflowHistory()
    stray = history.load_began("fb", 10.0, PREWARM)    # its request came after its expectation ended
    request = object()
    assert history.in_flight("fb", request) is None
    history.load_began("fb", 14.0, request)
    assert history.superseded(stray)


def test_what_nodes_loaded_ahead_still_waited_is_remembered_and_warm_ones_say_nothing() -> None:
    history = WorkflowHistory()
    ran = {"a": NodeRun("ok"), "b": NodeRun("ok")}
    history.waited("w", frozenset({"b"}), ran, {"fa": 0.9, "fb": 0.3}, SPEC)   # a was warm at arrival
    history.waited("w", frozenset({"b"}), ran, {"fb": 0.0}, SPEC)              # b's load hid this time
    history.waited("w", frozenset({"b"}), {"a": NodeRun("ok"), "b": NodeRun("skipped")}, {}, SPEC)
    assert history.observed_exposure("w") == {"b": pytest.approx(0.3 + MEAN_WEIGHT * (0.0 - 0.3))}
    assert history.observed_exposure("other") == {}


CHAIN = make_workflow("""
name: w
nodes:
  - {name: a, function: fa}
  - {name: b, function: fb, after: [a]}
  - {name: c, function: fc, after: [a]}
""")


def test_a_node_run_counts_as_beside_loads_only_when_another_functions_load_overlaps_it() -> None:
    history = WorkflowHistory()
    history.arrived("w", 0.0)
    span = history.load_began("fb", 10.0)
    history.served("w", "fb", 10.5, 10.6)      # its own load ending as it runs: alone
    history.served("w", "fa", 10.2, 10.5)      # b loading meanwhile: beside
    history.load_ended(span, 10.4)
    history.served("w", "fc", 10.45, 10.6)     # after b's load ended: alone
    history.waited("w", frozenset({"b"}), {"b": NodeRun("ok")}, {"fb": 0.01}, CHAIN)
    # a was never seen alone: what b's load costs is unknown, so b (loaded ahead) is to be probed.
    cost, probe = history.loading_cost("w", CHAIN)
    assert probe == {"b"} and cost == {"b": 0.0}          # 10 ms of wait: noise
    history.served("w", "fa", 20.0, 20.2)      # a request with nothing loading: a took 0.2 s, not 0.3
    cost, probe = history.loading_cost("w", CHAIN)
    assert probe == frozenset() and cost == {"b": pytest.approx(0.1)}


def test_the_slowdown_beside_loads_is_measured_again_after_a_while() -> None:
    history = WorkflowHistory()
    history.arrived("w", 0.0)
    span = history.load_began("fb", 1.0)
    history.served("w", "fa", 1.0, 1.4)
    history.load_ended(span, 1.5)
    history.served("w", "fa", 5.0, 5.2)
    history.waited("w", frozenset({"b"}), {"b": NodeRun("ok")}, {"fb": 0.0}, CHAIN)
    assert history.loading_cost("w", CHAIN)[0]["b"] == pytest.approx(0.4 - 0.2)   # all of it b's
    for at in range(1, REMEASURE_AFTER + 2):
        history.arrived("w", float(at))
    # Stale: no slowdown counts until a request loads beside a again (the next one will).
    assert history.loading_cost("w", CHAIN) == ({"b": 0.0}, frozenset())


def test_the_slowdown_is_blamed_on_the_loads_that_ran_beside_the_nodes_not_on_an_earlier_one() -> None:
    history = WorkflowHistory()
    history.arrived("w", 0.0)
    root = history.load_began("fa", 0.0)      # the root, cold at arrival: loaded before anything runs
    history.load_ended(root, 0.3)
    b, c = history.load_began("fb", 0.1), history.load_began("fc", 0.2)
    history.load_ended(c, 0.4)
    history.load_ended(b, 0.6)
    history.served("w", "fa", 0.3, 0.9)       # beside b's load for 0.3 s, beside c's for 0.1 s
    history.served("w", "fa", 5.0, 5.4)       # alone: 0.4 s, so 0.2 s of slowdown
    history.waited("w", frozenset({"a", "b", "c"}), {n: NodeRun("ok") for n in "abc"}, {"fa": 0.3}, CHAIN)
    cost, probe = history.loading_cost("w", CHAIN)
    assert probe == frozenset()
    assert cost == {"a": 0.3, "b": pytest.approx(0.15), "c": pytest.approx(0.05)}
