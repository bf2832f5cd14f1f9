"""Workflow specs (validation names the node) and the executor on hand-checkable graphs, with a
stand-in for the invoke path (the real one is exercised end to end in tests/e2e)."""

from __future__ import annotations

import asyncio
import json

import pytest

from dilu.workflows.run import WorkflowFailed, run_workflow
from dilu.workflows.spec import WorkflowError, check_functions, make_workflow, workflow_from_dict, workflow_to_dict

pytestmark = pytest.mark.unit

AMBER = """
name: amber
nodes:
  - {name: detect, function: detector}
  - {name: faces, function: faces, after: [detect]}
  - {name: poses, function: poses, after: [detect]}
  - {name: merge, function: merger, after: [faces, poses]}
  - name: translate
    function: translator
    after: [merge]
    when: {node: detect, field: meta.language, not_equals: en}
output: [translate, merge]
"""


@pytest.mark.parametrize(("text", "message"), [
    ("name: w\nnodes: []\n", "nodes"),
    ("name: w\nnodes:\n  - {name: a, function: f, after: [b]}\n", "node 'a': after names 'b', which is not a node"),
    ("name: w\nnodes:\n  - {name: a, function: f, after: [b]}\n  - {name: b, function: f, after: [a]}\n"
     "  - {name: c, function: f}\n", "nodes 'a', 'b': they form a cycle"),
    ("name: w\nnodes:\n  - {name: a, function: f}\n  - {name: a, function: g}\n", "node 'a': the name is used twice"),
    ("name: w\nnodes:\n  - {name: a, function: f}\n  - {name: b, function: f}\noutput: a\n",
     "node 'b': it does not lead to the output"),
    ("name: w\nnodes:\n  - {name: a, function: f}\n  - {name: b, function: f, after: [a], when: {node: b, field: x, "
     "equals: 1}}\n", "node 'b': its condition reads 'b', which is not one of its ancestors"),
    ("name: w\nnodes:\n  - {name: a, function: F_bad}\n", "node 'a': function"),
    ("name: w\nnodes:\n  - {name: a, function: f, when: {node: a, field: x}}\n", "exactly one of"),
    ("name: w\nnodes:\n  - {name: a, function: f, colour: red}\n", "node 'a': colour: unknown field"),
    ("name: w\nnodes:\n  - {name: a, function: f}\noutput: z\n", "output names 'z'"),
    ("[1, 2]", "expected a mapping"),
])
def test_validation_names_the_node(text: str, message: str) -> None:
    with pytest.raises(WorkflowError, match=message.replace("(", r"\(")):
        make_workflow(text)


def test_functions_must_be_deployed_and_the_stored_form_round_trips() -> None:
    spec = make_workflow(AMBER)
    with pytest.raises(WorkflowError, match="node 'poses': function 'poses' is not deployed"):
        check_functions(spec, {"detector", "faces", "merger", "translator"})
    again = workflow_from_dict(json.loads(json.dumps(workflow_to_dict(spec))))
    assert again == spec and spec.order()[0] == "detect" and spec.order()[-1] == "translate"


def fake(outputs: dict, delays: dict | None = None, statuses: dict | None = None, seen: list | None = None):
    async def call(function: str, body: bytes) -> tuple[int, bytes]:
        if seen is not None:
            seen.append((function, json.loads(body)))
        await asyncio.sleep((delays or {}).get(function, 0))
        status = (statuses or {}).get(function, 200)
        result = outputs.get(function, {"from": function}) if status == 200 else {"error": f"{function} broke"}
        return status, json.dumps(result).encode()
    return call


async def test_fan_out_fan_in_and_a_branch() -> None:
    spec = make_workflow(AMBER)
    seen: list = []
    outputs = {"detector": {"meta": {"language": "fr"}}, "faces": {"n": 2}, "poses": {"p": 1}, "translator": "bonjour"}
    result, runs = await run_workflow(spec, {"image": 1}, fake(outputs, seen=seen))
    assert result == "bonjour" and all(r.status == "ok" for r in runs.values())
    inputs = dict(seen)
    assert inputs["detector"] == {"image": 1}                 # a root gets the request
    assert inputs["faces"] == {"meta": {"language": "fr"}}    # one parent: its output
    assert inputs["merger"] == {"faces": {"n": 2}, "poses": {"p": 1}}   # fan-in: by parent name
    # English needs no translation: the branch is skipped and merge answers.
    outputs["detector"] = {"meta": {"language": "en"}}
    result, runs = await run_workflow(spec, {}, fake(outputs))
    assert result == {"from": "merger"} and runs["translate"].status == "skipped"


async def test_a_branch_is_heard_of_as_chosen_once_its_condition_holds_before_its_parents_finish() -> None:
    spec = make_workflow(AMBER)
    merging = asyncio.Event()       # merge answers only once told to
    heard: list[tuple[str, bool]] = []

    async def call(function: str, body: bytes) -> tuple[int, bytes]:
        if function == "merger":
            await merging.wait()
        language = "fr" if json.loads(body).get("lang") == "fr" else "en"
        return 200, json.dumps({"meta": {"language": language}} if function == "detector" else {}).encode()

    def chosen(node: str) -> None:
        heard.append((node, merging.is_set()))
        merging.set()

    _, runs = await asyncio.wait_for(run_workflow(spec, {"lang": "fr"}, call, chosen=chosen), 10)
    assert heard == [("translate", False)] and runs["translate"].status == "ok"
    # Not chosen (English): never heard of, and skipped.
    heard.clear()
    merging.set()
    _, runs = await run_workflow(spec, {"lang": "en"}, call, chosen=chosen)
    assert heard == [] and runs["translate"].status == "skipped"


async def test_siblings_run_in_parallel() -> None:
    spec = make_workflow(AMBER)
    _, runs = await run_workflow(spec, {}, fake({"detector": {"meta": {"language": "en"}}},
                                                delays={"faces": 0.2, "poses": 0.2}))
    # Both started before either ended.
    assert runs["poses"].started_ms < runs["faces"].ended_ms and runs["faces"].started_ms < runs["poses"].ended_ms
    assert runs["merge"].started_ms >= max(runs["faces"].ended_ms, runs["poses"].ended_ms)


async def test_a_failing_node_is_named_and_the_rest_cancelled() -> None:
    spec = make_workflow(AMBER)
    with pytest.raises(WorkflowFailed) as failed:
        await run_workflow(spec, {}, fake({}, delays={"poses": 5}, statuses={"faces": 500}))
    assert failed.value.status == 502 and failed.value.node == "faces"
    assert "node 'faces' (faces) failed with 500: faces broke" in str(failed.value)
    assert failed.value.runs["poses"].status == "cancelled" and failed.value.runs["merge"].status == "cancelled"


async def test_node_and_workflow_timeouts() -> None:
    slow_node = workflow_from_dict({"name": "w", "nodes": [{"name": "a", "function": "f", "timeout_s": 0.05}]})
    with pytest.raises(WorkflowFailed, match="node 'a' \\(f\\) did not answer within 0.05s") as failed:
        await run_workflow(slow_node, {}, fake({}, delays={"f": 5}))
    assert failed.value.status == 504
    slow_chain = workflow_from_dict({"name": "w", "timeout_s": 0.1, "nodes": [
        {"name": "a", "function": "f"}, {"name": "b", "function": "g", "after": ["a"]}]})
    with pytest.raises(WorkflowFailed, match="did not finish within 0.1s \\(still running: b\\)"):
        await run_workflow(slow_chain, {}, fake({}, delays={"f": 0.06, "g": 0.06}))
