"""What a workflow's recent requests say: folded from their records (pure), the loads in flight
they are timed against, and load times measured only for loads still wanted."""

from __future__ import annotations

import asyncio

import pytest

from dilu.state.memory import MemoryStore
from dilu.workflows.history import MEAN_WEIGHT, REMEASURE_AFTER, RequestRecord, Served, fold, lead_estimate
from dilu.workflows.loading import PREWARM, WorkflowLoader
from dilu.workflows.spans import LoadSpans
from dilu.workflows.spec import make_workflow
from tests.unit.workflow_platform import FakePlatform

pytestmark = pytest.mark.unit

SPEC = make_workflow("""
name: w
nodes:
  - {name: a, function: fa}
  - {name: b, function: fb, after: [a], when: {node: a, field: go, equals: true}}
""")
CHAIN = make_workflow("""
name: w
nodes:
  - {name: a, function: fa}
  - {name: b, function: fb, after: [a]}
  - {name: c, function: fc, after: [a]}
""")


def test_gaps_between_arrivals_in_order_of_arrival_whatever_order_records_came_in() -> None:
    history = fold([RequestRecord(13.0), RequestRecord(10.0), RequestRecord(17.5)])
    assert history.gaps == [3.0, 4.5] and history.last_arrival == 17.5
    assert fold([]).gaps == [] and fold([]).last_arrival is None


def test_branch_probability_counts_skips_and_ignores_undecided_nodes() -> None:
    history = fold([RequestRecord(1.0, {"a": True, "b": False}), RequestRecord(2.0, {"a": True, "b": True}),
                    RequestRecord(3.0, {"a": True})])           # b cancelled before it was decided
    assert history.probability(SPEC) == {"a": 1.0, "b": 0.5}


def test_lead_time_leans_long_but_ignores_the_single_longest_of_the_newest_loads() -> None:
    assert lead_estimate([]) is None
    assert lead_estimate([0.2]) == pytest.approx(0.2)
    assert lead_estimate([0.2, 0.3]) == pytest.approx(0.3)          # too few to tell an outlier
    assert lead_estimate([0.2, 0.3, 4.0]) == pytest.approx(0.3)     # one load that waited on something else
    assert lead_estimate([0.2, 0.3, 4.0, 0.25, 0.35, 0.2, 0.2]) == pytest.approx(0.35)   # newest five
    assert lead_estimate([0.2, 0.3, 4.0, 0.25, 0.35, 0.2, 0.2, 0.3]) == pytest.approx(0.3)  # 4.0 dropped out


def test_a_load_overtaken_by_a_newer_one_of_its_function_is_not_a_lead_time() -> None:
    spans = LoadSpans()
    stray = spans.begin("fb", 10.0)
    assert not spans.superseded(stray)
    newer = spans.begin("fb", 14.0)
    assert spans.superseded(stray) and not spans.superseded(newer)
    assert stray.ended == 14.0           # its span (what nodes ran beside) ends where the newer one begins
    other = spans.begin("fc", 14.1)
    assert not spans.superseded(newer) and not spans.superseded(other)


def test_a_prewarm_no_request_took_over_is_overtaken_by_the_load_of_the_node_reached_cold() -> None:
    spans = LoadSpans()
    stray = spans.begin("fb", 10.0, PREWARM)
    request = object()
    assert spans.in_flight("fb", request) is None
    spans.begin("fb", 14.0, request)
    assert spans.superseded(stray)


@pytest.mark.parametrize("still_wanted", [True, False])
async def test_a_load_counts_as_a_lead_time_only_if_it_is_still_wanted_when_routable(still_wanted: bool) -> None:
    """A load whose node was skipped before the controller acted was never started: when its
    function becomes routable (a deployment, a direct request), that time says nothing."""
    platform = FakePlatform()
    loader = WorkflowLoader(platform, MemoryStore())
    request = object()
    loader.load("fb", loader.clock() + 60, request)
    await asyncio.sleep(0)                  # the measurement is waiting for the function
    if not still_wanted:
        platform.hints.fulfilled("fb", request)
    await platform.become_routable("fb")
    _, leads = await loader.history("w", SPEC)
    assert bool(leads["fb"]) == still_wanted and platform.demanded == ["fb"]


async def test_a_prewarm_still_loading_when_its_node_is_reached_is_timed_as_the_load_the_node_waits_for() -> None:
    """A request arrives while its node's pre-warm is still loading and reaches the node before
    it is ready: the node waits for that load (it is not a new one), and the load's time, from
    when the pre-warm asked for it, counts."""
    platform = FakePlatform()
    loader = WorkflowLoader(platform, MemoryStore())
    loader.load("fb", loader.clock() + 60, PREWARM)
    await asyncio.sleep(0)                  # the pre-warm's load is in flight
    request, other = object(), object()
    assert platform.hints.take_over("fb", PREWARM, request, loader.clock() + 60)
    loader.spans.adopt("fb", PREWARM, request)
    reached = loader.spans.in_flight("fb", request)
    assert reached is not None and loader.spans.in_flight("fb", other) is None
    await platform.become_routable("fb")
    _, leads = await loader.history("w", SPEC)
    assert leads["fb"] and not loader.spans.superseded(reached)


def test_what_nodes_loaded_ahead_still_waited_is_a_running_mean() -> None:
    history = fold([RequestRecord(1.0, waits={"b": 0.3}), RequestRecord(2.0, waits={"b": 0.0}),
                    RequestRecord(3.0)])                        # b skipped: says nothing
    assert history.waits == {"b": pytest.approx(0.3 + MEAN_WEIGHT * (0.0 - 0.3))}


def test_a_node_run_counts_as_beside_loads_only_when_another_functions_load_overlaps_it() -> None:
    spans = LoadSpans()
    span = spans.begin("fb", 10.0)
    assert spans.overlaps("fb", 10.5, 10.6) == {}              # its own load ending as it runs: alone
    assert spans.overlaps("fa", 10.2, 10.5) == {"fb": pytest.approx(0.3)}
    spans.end(span, 10.4)
    assert spans.overlaps("fc", 10.45, 10.6) == {}             # after b's load ended: alone
    first = RequestRecord(0.0, waits={"b": 0.01}, served=(Served("fa", 0.3, {"fb": 0.2}), Served("fc", 0.15)))
    # a was never seen alone: what b's load costs is unknown, so b (loaded ahead) is to be probed.
    cost, probe = fold([first]).loading_cost(CHAIN)
    assert probe == {"b"} and cost == {"b": 0.0}          # 10 ms of wait: noise
    alone = RequestRecord(20.0, served=(Served("fa", 0.2),))   # a request with nothing loading: 0.2 s, not 0.3
    cost, probe = fold([first, alone]).loading_cost(CHAIN)
    assert probe == frozenset() and cost == {"b": pytest.approx(0.1)}


def test_the_slowdown_beside_loads_is_measured_again_after_a_while() -> None:
    measured = RequestRecord(0.0, waits={"b": 0.0}, served=(Served("fa", 0.4, {"fb": 0.4}), Served("fa", 0.2)))
    assert fold([measured]).loading_cost(CHAIN)[0]["b"] == pytest.approx(0.4 - 0.2)   # all of it b's
    later = [RequestRecord(float(at)) for at in range(1, REMEASURE_AFTER + 2)]
    # Stale: no slowdown counts until a request loads beside a again.
    assert fold([measured, *later]).loading_cost(CHAIN) == ({"b": 0.0}, frozenset())


def test_the_slowdown_is_blamed_on_the_loads_that_ran_beside_the_nodes_not_on_an_earlier_one() -> None:
    spans = LoadSpans()
    root = spans.begin("fa", 0.0)       # the root, cold at arrival: loaded before anything runs
    spans.end(root, 0.3)
    b, c = spans.begin("fb", 0.1), spans.begin("fc", 0.2)
    spans.end(c, 0.4)
    spans.end(b, 0.6)
    beside = spans.overlaps("fa", 0.3, 0.9)
    assert beside == {"fb": pytest.approx(0.3), "fc": pytest.approx(0.1)}
    history = fold([RequestRecord(0.0, waits={"a": 0.3, "b": 0.0, "c": 0.0}, served=(Served("fa", 0.6, beside),)),
                    RequestRecord(5.0, served=(Served("fa", 0.4),))])     # alone: 0.4 s, so 0.2 s of slowdown
    cost, probe = history.loading_cost(CHAIN)
    assert probe == frozenset()
    assert cost == {"a": 0.3, "b": pytest.approx(0.15), "c": pytest.approx(0.05)}


def test_a_record_survives_the_wire() -> None:
    record = RequestRecord(12.5, {"a": True, "b": False}, {"b": 0.25}, (Served("fa", 0.1, {"fb": 0.05}),))
    assert RequestRecord.from_wire(record.to_wire()) == record
