"""What a gateway remembers of each workflow: arrival gaps, how often nodes ran, lead times."""

from __future__ import annotations

import pytest

from dilu.workflow import make_workflow
from gateway.workflow_loading import LEAD_WEIGHT, WorkflowHistory
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


def test_lead_time_is_a_running_mean_of_measured_loads() -> None:
    history = WorkflowHistory()
    assert history.lead_s("fb") is None
    history.loaded("fb", 0.4)
    history.loaded("fb", 0.2)
    assert history.lead_s("fb") == pytest.approx(0.4 + LEAD_WEIGHT * (0.2 - 0.4))


def test_what_nodes_loaded_ahead_still_waited_is_remembered_and_warm_ones_say_nothing() -> None:
    history = WorkflowHistory()
    ran = {"a": NodeRun("ok"), "b": NodeRun("ok")}
    history.waited("w", frozenset({"b"}), ran, {"fa": 0.9, "fb": 0.3}, SPEC)   # a was warm at arrival
    history.waited("w", frozenset({"b"}), ran, {"fb": 0.0}, SPEC)              # b's load hid this time
    history.waited("w", frozenset({"b"}), {"a": NodeRun("ok"), "b": NodeRun("skipped")}, {}, SPEC)
    assert history.observed_exposure("w") == {"b": pytest.approx(0.3 + LEAD_WEIGHT * (0.0 - 0.3))}
    assert history.observed_exposure("other") == {}
