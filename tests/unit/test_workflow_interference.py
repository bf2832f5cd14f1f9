"""What loads beside a workflow request cost the nodes running meanwhile (pure), on the DAG of test_workflow_plan."""

from __future__ import annotations

import pytest

from dilu.workflows.interference import critical_path_s, interference_s, loading_costs, shares
from tests.unit.test_workflow_plan import SPEC

pytestmark = pytest.mark.unit

# a 1 s -> b 2 s and c 0.5 s in parallel -> d 1 s -> e 1 s (a branch)
ALONE = {"a": 1.0, "b": 2.0, "c": 0.5, "d": 1.0, "e": 1.0}


def test_critical_path_takes_the_longer_branch() -> None:
    assert critical_path_s(SPEC, ALONE) == 5.0
    assert critical_path_s(SPEC, {"a": 1.0, "c": 0.5}) == 1.5       # nodes not run take nothing


def test_a_slower_node_on_the_critical_path_counts_and_one_off_it_only_beyond_its_slack() -> None:
    assert interference_s(SPEC, ALONE, {"a": 1.3}) == pytest.approx(0.3)
    assert interference_s(SPEC, ALONE, {"c": 1.8}) == 0.0            # c had 1.5 s of slack beside b
    assert interference_s(SPEC, ALONE, {"c": 2.3}) == pytest.approx(0.3)
    assert interference_s(SPEC, ALONE, {"a": 0.9}) == 0.0            # faster beside loads: no cost


def test_unknown_until_every_node_seen_beside_loads_was_also_seen_alone() -> None:
    assert interference_s(SPEC, {"b": 2.0}, {"a": 1.3}) is None
    assert interference_s(SPEC, {}, {}) == 0.0


def test_shares_follow_how_long_each_load_overlapped_the_nodes() -> None:
    assert shares(0.3, {"b": 1.0, "c": 2.0}) == {"b": pytest.approx(0.1), "c": pytest.approx(0.2)}
    assert shares(0.3, {"b": 0.0, "c": 0.0}) == {"b": 0.15, "c": 0.15}
    assert shares(0.3, {}) == {}


def test_a_small_wait_is_noise_but_small_shares_of_a_noticeable_slowdown_count() -> None:
    # 90 ms of slowdown from three loads: 30 ms each counts; a 15 ms wait alone does not.
    costs = loading_costs({"b": 0.015, "c": 0.05}, 0.09, {"b": 1.0, "c": 1.0, "d": 1.0})
    assert costs == {"b": pytest.approx(0.03), "c": pytest.approx(0.08), "d": pytest.approx(0.03)}
    # 15 ms of slowdown is noise too.
    assert loading_costs({"b": 0.015, "c": 0.05}, 0.015, {"b": 1.0}) == {"b": 0.0, "c": 0.05}
