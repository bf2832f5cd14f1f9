"""The per-node keep-alive rule of workflows (pure), on the hand-checkable DAG of test_workflow_plan."""

from __future__ import annotations

import pytest

from dilu.workflows.hints import WorkflowHint
from dilu.workflows.keep import (
    decide,
    decided_ahead_s,
    exposed_cold_s,
    idle_loaded_s,
    release_hint_s,
    release_mid_request,
    window_s,
)
from dilu.workflows.plan import NodeEstimate
from dilu.workflows.spec import make_workflow
from tests.unit.test_workflow_plan import SPEC, estimates

pytestmark = pytest.mark.unit

MiB = 2**20


def test_exposed_cold_start_is_what_the_slack_does_not_hide() -> None:
    # a is a root: all 0.4 s show. b and c are needed at 1 s (after a): 1.5 s loads show 0.5 s.
    # d is needed at 3 s (after b): a 1.5 s load hides; e is needed at 4 s.
    exposed = exposed_cold_s(SPEC, estimates({"a": 0.4, "b": 1.5, "c": 1.5, "d": 1.5, "e": 5.0}))
    assert exposed == {"a": 0.4, "b": 0.5, "c": 0.5, "d": 0.0, "e": 1.0}


def test_a_node_loaded_ahead_sits_idle_for_its_slack_less_its_cold_start() -> None:
    # b and c are needed at 1 s, d at 3 s, e at 4 s (after a, b, d).
    idle = idle_loaded_s(SPEC, estimates({"a": 0.4, "b": 1.5, "c": 0.25, "d": 0.5, "e": 0.5}))
    assert idle == {"a": 0.0, "b": 0.0, "c": 0.75, "d": 2.5, "e": 3.5}


def test_a_deep_node_with_a_small_cost_is_not_prewarmed_to_wait_loaded_through_its_slack() -> None:
    # Requests every 4 s. Loading d in the slack was measured to cost 0.02 s a request; pre-warmed,
    # 1 GiB of it would wait loaded 2.5 s in each request before it is needed (0.025 s at the
    # price) besides the 1.1 s before it: loaded in the slack. a (a root) is still pre-warmed.
    verdicts = decide(SPEC, estimates({"a": 0.4, "d": 0.5}), {"a": 1024 * MiB, "d": 1024 * MiB},
                      gaps=[4.0] * 5, ran_probability={n: 1.0 for n in "abcde"}, elapsed_s=0.5,
                      observed_exposed={"d": 0.02})
    assert verdicts["a"].verdict == "prewarm"
    assert verdicts["d"].verdict == "release" and "worth more" in verdicts["d"].reason
    # Needed at once (no slack to wait through), the same cost is worth pre-warming.
    shallow = decide(SPEC, estimates({"a": 0.4, "b": 0.5}), {"a": 1024 * MiB, "b": 1024 * MiB},
                     gaps=[4.0] * 5, ran_probability={n: 1.0 for n in "abcde"}, elapsed_s=0.5,
                     observed_exposed={"b": 0.02})
    assert shallow["b"].verdict == "prewarm"


def test_nodes_that_hide_are_released_and_exposed_ones_held_for_the_window() -> None:
    verdicts = decide(SPEC, estimates({"a": 0.4, "b": 1.5, "c": 1.5, "d": 1.5, "e": 0.2}),
                      {n: 256 * MiB for n in "abcde"}, gaps=[0.5, 2.5, 3.0, 2.0],   # irregular: no pre-warm
                      ran_probability={n: 1.0 for n in "abcde"})
    assert {n: v.verdict for n, v in verdicts.items()} == {"a": "hold", "b": "hold", "c": "hold",
                                                            "d": "release", "e": "release"}
    assert verdicts["a"].hold_s == 3.0          # the gap within which 90 % of the requests came


def test_memory_outweighs_a_small_saving() -> None:
    # 0.4 s saved per request against 64 GiB held for 3 s (price 0.01 s per GiB-s: 1.92 s).
    verdicts = decide(SPEC, estimates({"a": 0.4}), {"a": 64 * 1024 * MiB}, gaps=[0.6, 3.0, 3.0],
                      ran_probability={"a": 1.0})
    assert verdicts["a"].verdict == "release" and "worth more" in verdicts["a"].reason
    # The same node at a tenth of the memory is held.
    cheaper = decide(SPEC, estimates({"a": 0.4}), {"a": 6 * 1024 * MiB}, gaps=[0.6, 3.0, 3.0],
                     ran_probability={"a": 1.0})
    assert cheaper["a"].verdict == "hold"


def test_a_rarely_taken_branch_is_not_held() -> None:
    # Taken 1 time in 50, e is not loaded ahead: it starts loading once a (whose output its
    # condition reads) answers, at 1 s, and is needed at 4 s: 2 s of its 5 s load show. The
    # saving (0.02 x 2 = 0.04 s a request) is below 4 GiB held for 3 s (0.12 s).
    verdicts = decide(SPEC, estimates({"e": 5.0}), {"e": 4096 * MiB}, gaps=[0.5, 3.0],
                      ran_probability={"e": 0.02})
    assert verdicts["e"].verdict == "release" and verdicts["e"].exposed_s == 2.0
    # Taken half the time, it loads in the slack (1 s of it shows): 0.5 s saved, worth holding.
    taken = decide(SPEC, estimates({"e": 5.0}), {"e": 4096 * MiB}, gaps=[0.5, 3.0], ran_probability={"e": 0.5})
    assert taken["e"].verdict == "hold" and taken["e"].exposed_s == 1.0


def test_a_rare_branch_shows_what_its_load_takes_beyond_the_time_after_its_condition_is_decided() -> None:
    # e, taken 1 time in 5, is not loaded ahead: it loads once a has answered and its condition
    # holds (at 1 s); it is needed at 4 s, after b and d. A 3.5 s load shows 0.5 s, though in
    # the slack from the request's arrival it would hide (0.1 s a request, against 1 GiB held
    # for 3 s and loaded 0.5 s before it is needed: 0.035 s), so it is held. d is released.
    verdicts = decide(SPEC, estimates({"d": 0.5, "e": 3.5}), {"d": 1024 * MiB, "e": 1024 * MiB}, gaps=[0.5, 3.0],
                      ran_probability={"d": 1.0, "e": 0.2})
    assert verdicts["d"].verdict == "release" and verdicts["d"].exposed_s == 0.0
    assert verdicts["e"].verdict == "hold" and verdicts["e"].exposed_s == 0.5
    # A 0.5 s load hides in the 3 s after the decision: released.
    hidden = decide(SPEC, estimates({"e": 0.5}), {"e": 1024 * MiB}, gaps=[0.5, 3.0], ran_probability={"e": 0.2})
    assert hidden["e"].verdict == "release" and hidden["e"].exposed_s == 0.0


def test_below_a_rare_branch_a_node_without_its_own_condition_shows_its_whole_load() -> None:
    spec = make_workflow("""
name: deep
nodes:
  - {name: a, function: fa}
  - {name: b, function: fb, after: [a]}
  - {name: c, function: fc, after: [b], when: {node: a, field: go, equals: true}}
  - {name: d, function: fd, after: [c]}
""")
    cold = {n: NodeEstimate(exec_s=1.0, cold_s=2.5, warm=False) for n in "abcd"}
    # c's condition is decided at 1 s and c is needed at 2 s; d loads only when reached.
    assert decided_ahead_s(spec, cold) == {"c": 1.0}
    verdicts = decide(spec, cold, {n: 256 * MiB for n in "abcd"}, gaps=[0.5, 3.0], ran_probability={"c": 0.1, "d": 0.1})
    assert verdicts["c"].exposed_s == 1.5 and verdicts["d"].exposed_s == 2.5


def test_regular_traffic_prewarms_a_root_just_before_the_next_request_instead_of_holding_it() -> None:
    # Requests every 4 s, decided 0.5 s after one arrived: a (a root, 0.4 s cold) is unloaded
    # for 4 - 0.5 - 0.4 - 0.2 = 2.9 s, then loaded again to be ready 0.2 s before the next request
    # (a root: nothing hides its lateness; deeper nodes take 0.05 s, see d below).
    regular = decide(SPEC, estimates({"a": 0.4}), {n: 256 * MiB for n in "abcde"}, gaps=[4.0] * 5,
                     ran_probability={n: 1.0 for n in "abcde"}, elapsed_s=0.5)
    assert regular["a"].verdict == "prewarm"
    assert regular["a"].prewarm_in_s == pytest.approx(2.9) and regular["a"].hold_s == 4.0
    # The same mean gap at random: the next request may come any moment, so a is held.
    random = decide(SPEC, estimates({"a": 0.4}), {n: 256 * MiB for n in "abcde"}, gaps=[0.2, 1.0, 4.0, 8.0, 2.0],
                    ran_probability={n: 1.0 for n in "abcde"}, elapsed_s=0.5)
    assert random["a"].verdict == "hold" and random["a"].hold_s == 4.0


def test_no_prewarm_when_it_would_unload_only_briefly_or_requests_often_come_early() -> None:
    brief = decide(SPEC, estimates({"a": 0.4}), {"a": 256 * MiB}, gaps=[1.2] * 5, ran_probability={"a": 1.0})
    assert brief["a"].verdict == "hold"          # unloaded 0.6 s: churn
    # One request in twenty comes 2.5 s early, before a pre-warmed a would be back: that costs
    # 0.05 x 0.4 s of latency per request, more than holding 256 MiB through the gap (0.01 s).
    early = decide(SPEC, estimates({"a": 0.4}), {"a": 256 * MiB}, gaps=[4.0] * 19 + [1.5],
                   ran_probability={"a": 1.0})
    assert early["a"].verdict == "hold"
    # Without that one, pre-warming wins.
    steady = decide(SPEC, estimates({"a": 0.4}), {"a": 256 * MiB}, gaps=[4.0] * 20, ran_probability={"a": 1.0})
    assert steady["a"].verdict == "prewarm"


def test_a_node_that_was_seen_waiting_counts_as_exposed_though_its_estimate_hides() -> None:
    # d's 1.5 s load fits in its 2 s of slack on paper; loaded beside b and c it still waited 0.3 s.
    cold = estimates({"a": 0.4, "b": 1.5, "c": 1.5, "d": 1.5})
    memory, ran, gaps = {n: 256 * MiB for n in "abcde"}, {n: 1.0 for n in "abcde"}, [0.5, 2.5, 3.0, 2.0]
    assert decide(SPEC, cold, memory, gaps, ran)["d"].verdict == "release"
    seen = decide(SPEC, cold, memory, gaps, ran, observed_exposed={"d": 0.3})
    assert seen["d"].verdict == "hold" and seen["d"].exposed_s == 0.3
    # 50 ms a request is worth more than 256 MiB held 3 s (0.0075 s); nothing measured, nothing shown.
    assert decide(SPEC, cold, memory, gaps, ran, observed_exposed={"d": 0.05})["d"].verdict == "hold"
    assert decide(SPEC, cold, memory, gaps, ran, observed_exposed={"d": 0.0})["d"].verdict == "release"
    # A few ms (a small share of a slowdown): released, not left to the function's keep-alive.
    rare = decide(SPEC, cold, memory, gaps, {**ran, "d": 0.3}, observed_exposed={"d": 0.006})
    assert rare["d"].verdict == "release"


def test_a_prewarmed_node_is_loaded_again_in_full_before_the_next_request() -> None:
    # d's 1.5 s load hides on paper; its load was measured to cost requests 0.05 s (it slows the
    # nodes beside it). Requests every 4 s, decided 0.5 s after one: d is reloaded its whole cold
    # start ahead (4 - 0.5 - 1.5 - 0.05 = 1.95 s from now), not only its exposure.
    cold = estimates({"a": 0.4, "b": 1.5, "c": 1.5, "d": 1.5})
    verdicts = decide(SPEC, cold, {n: 256 * MiB for n in "abcde"}, [4.0] * 5, {n: 1.0 for n in "abcde"},
                      elapsed_s=0.5, observed_exposed={"d": 0.05})
    assert verdicts["d"].verdict == "prewarm" and verdicts["d"].prewarm_in_s == pytest.approx(1.95)


def test_nodes_whose_cost_is_unmeasured_are_prewarmed_once_where_possible() -> None:
    cold = estimates({"a": 0.4, "b": 1.5, "c": 1.5, "d": 1.5})
    memory, ran = {n: 256 * MiB for n in "abcde"}, {n: 1.0 for n in "abcde"}
    probing = decide(SPEC, cold, memory, [4.0] * 5, ran, elapsed_s=0.5, probe=frozenset({"c", "d"}))
    assert probing["d"].verdict == "prewarm" and "measure" in probing["d"].reason
    assert probing["c"].verdict == "prewarm"
    assert probing["b"].verdict == "prewarm" and "measure" not in probing["b"].reason   # b: exposed 0.5 s
    assert probing["e"].verdict == "release"       # not probed, hides
    # At random gaps a pre-warm is not possible: the probe waits, d's loading still hides.
    random = decide(SPEC, cold, memory, [0.2, 1.0, 4.0, 8.0, 2.0], ran, elapsed_s=0.5, probe=frozenset({"d"}))
    assert random["d"].verdict == "release"


def test_too_little_history_leaves_the_functions_keep_alive() -> None:
    verdicts = decide(SPEC, estimates({"a": 0.4}), {"a": MiB}, gaps=[3.0], ran_probability={"a": 1.0})
    assert verdicts["a"].verdict == "default" and verdicts["b"].verdict == "release"


def test_window_is_a_quantile_of_the_gaps_and_bounded() -> None:
    assert window_s([]) is None and window_s([1.0]) is None
    assert window_s([1.0] * 9 + [100.0]) == 1.0            # one long pause in ten does not stretch it
    assert window_s([1.0] * 5 + [100.0] * 5) == 100.0
    assert window_s([5000.0, 6000.0]) == 600.0


@pytest.mark.parametrize(("release_until", "direct_at", "expected"), [
    (110.0, None, True),          # a gateway's hint, no direct traffic
    (110.0, 30.0, True),          # the last direct request was 70 s ago
    (110.0, 50.0, False),         # ... 50 s ago: it also serves users directly
    (90.0, None, False),          # the hint expired
    (None, None, False),
])
def test_only_workflow_only_functions_are_released(release_until: float | None, direct_at: float | None,
                                                   expected: bool) -> None:
    assert WorkflowHint(None, release_until, direct_at).releasable(now=100.0) is expected


@pytest.mark.parametrize("late_s", [0.0, 0.2, 0.39])
def test_a_release_hint_lasts_until_the_node_is_done_in_the_next_request(late_s: float) -> None:
    """Requests every 4 s, each taking 0.4 s, one arriving up to 0.4 s late: the node, done at the
    end of the next request, is still covered by the hint given at this one's end (t = 0.4)."""
    arrived, took, window = 0.0, 0.4, 4.0
    now = arrived + took
    next_done = arrived + window + late_s + took
    assert WorkflowHint(None, now + release_hint_s(window, took)).releasable(now=next_done)
    assert not WorkflowHint(None, now + release_hint_s(window, took)).releasable(now=next_done + took + 0.01)


@pytest.mark.parametrize(("gib", "remaining_s", "price", "now"), [
    (0.3125, 0.2, 0.01, False),    # a fan-in feature node (320 MiB) 0.2 s before its request ends
    (0.125, 2.0, 0.01, False),     # 128 MiB before a 2 s tail: 0.0025 s of memory against a 0.04 s stop
    (0.125, 2.0, 0.5, True),       # the same at a price of 0.5: 0.125 s
    (8.0, 1.0, 0.01, True),        # 8 GiB before a 1 s tail: 0.08 s
    (8.0, -0.5, 0.01, False),      # the request runs late: nothing is left to save by the plan
])
def test_a_node_done_mid_request_leaves_only_when_its_memory_outweighs_the_stop(
        gib: float, remaining_s: float, price: float, now: bool) -> None:
    assert release_mid_request(gib, remaining_s, price=price) is now
