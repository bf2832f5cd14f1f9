"""Just-in-time loading on a DAG small enough to check by hand (pure)."""

from __future__ import annotations

import pytest

from dilu.workflows.plan import NodeEstimate, plan
from dilu.workflows.spec import make_workflow

pytestmark = pytest.mark.unit

# a (1 s) -> b (2 s) and c (0.5 s) in parallel -> d (1 s); e runs after d only when a says so.
SPEC = make_workflow("""
name: w
nodes:
  - {name: a, function: fa}
  - {name: b, function: fb, after: [a]}
  - {name: c, function: fc, after: [a]}
  - {name: d, function: fd, after: [b, c]}
  - {name: e, function: fe, after: [d], when: {node: a, field: go, equals: true}}
output: [e, d]
""")


def estimates(cold: dict[str, float], warm: set[str] = frozenset()) -> dict[str, NodeEstimate]:
    execs = {"a": 1.0, "b": 2.0, "c": 0.5, "d": 1.0, "e": 1.0}
    return {n: NodeEstimate(exec_s=execs[n], cold_s=cold.get(n, 0.0), warm=n in warm) for n in execs}


def test_loads_start_just_in_time() -> None:
    # a is warm; every other function takes 1.5 s to load.
    timeline = plan(SPEC, estimates({n: 1.5 for n in "bcde"}, warm={"a"}), margin_s=0.0,
                    branch_probability={"e": 0.9})
    # b and c are needed at 1 s: loading them from 0 still makes them ready at 1.5 s.
    assert timeline["b"].load_at_s == 0.0 and timeline["b"].done_at_s == 3.5
    assert timeline["c"].load_at_s == 0.0 and timeline["c"].done_at_s == 2.0
    # d is needed when b is done (3.5 s): it starts loading at 2.0 s, not at arrival.
    assert timeline["d"].needed_at_s == 3.5 and timeline["d"].load_at_s == 2.0 and timeline["d"].done_at_s == 4.5
    assert timeline["e"].load_at_s == 3.0 and timeline["e"].done_at_s == 5.5
    assert timeline["a"].load_at_s is None       # warm: nothing to load


def test_policies_differ_only_in_when() -> None:
    cold = {n: 1.5 for n in "abcde"}
    eager = plan(SPEC, estimates(cold), policy="eager", branch_probability={"e": 1.0})
    assert {n: p.load_at_s for n, p in eager.items()} == {n: 0.0 for n in "abcde"}
    lazy = plan(SPEC, estimates(cold), policy="on-demand")
    assert all(p.load_at_s is None for p in lazy.values())
    # On demand every cold start lands on the critical path: a 1.5+1, b 1.5+2, d 1.5+1, e 1.5+1.
    assert lazy["e"].done_at_s == pytest.approx(2.5 + 3.5 + 2.5 + 2.5)
    slack = plan(SPEC, estimates(cold), branch_probability={"e": 1.0}, margin_s=0.0)
    assert slack["e"].done_at_s == pytest.approx(1.5 + 1 + 2 + 1 + 1)    # only a's load is on the path


def test_an_unlikely_branch_is_not_loaded_ahead() -> None:
    cold = {n: 1.5 for n in "bcde"}
    rarely = plan(SPEC, estimates(cold, warm={"a"}), branch_probability={"e": 0.1})
    assert rarely["e"].load_at_s is None and rarely["d"].load_at_s is not None
    with pytest.raises(ValueError, match="unknown loading policy"):
        plan(SPEC, estimates(cold), policy="psychic")
