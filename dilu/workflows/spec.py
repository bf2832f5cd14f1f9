"""Workflows (``workflow.yaml``): a DAG of deployed functions, parsed and validated (pure).

The smallest shape that covers chains, fan-out, fan-in and conditional branches:

    name: amber-alert
    timeout_s: 30                    # end to end
    nodes:
      - {name: detect, function: detector}                      # a root: gets the request
      - {name: faces, function: face-recognizer, after: [detect]}   # one parent: gets its output
      - {name: poses, function: pose-recognizer, after: [detect]}
      - {name: merge, function: merger, after: [faces, poses]}       # fan-in: {faces: ..., poses: ...}
      - name: translate
        function: translator
        after: [merge]
        when: {node: detect, field: language, not_equals: en}       # a conditional branch
    output: [translate, merge]       # the first of these that ran is the answer

A node runs once every parent has finished or been skipped, when at least one parent ran (or it
is a root) and its ``when`` holds; otherwise it is skipped, and so are the nodes that depend on
it alone. ``when`` reads a field of an ancestor's output (a dotted path into its JSON object).
Errors name the node and the problem.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dilu.limits import LimitExceeded, check_yaml
from dilu.spec import NAME_PATTERN

NODE_PATTERN = r"^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$"
MAX_NODES = 64


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Condition(_Strict):
    """Run the node only if ``node``'s output has ``field`` equal (or not equal, or in) a value."""

    node: str = Field(..., pattern=NODE_PATTERN)
    field: str = Field(..., min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*$")
    equals: Any = None
    not_equals: Any = None
    one_of: list[Any] | None = Field(None, max_length=100)

    @model_validator(mode="after")
    def _one_test(self) -> Condition:
        given = [k for k in ("equals", "not_equals", "one_of") if k in self.model_fields_set]
        if len(given) != 1:
            raise ValueError("give exactly one of equals, not_equals, one_of")
        return self

    def holds(self, outputs: dict[str, Any]) -> bool:
        value: Any = outputs.get(self.node)
        for part in self.field.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if "equals" in self.model_fields_set:
            return value == self.equals
        if "not_equals" in self.model_fields_set:
            return value != self.not_equals
        return value in (self.one_of or [])


class Node(_Strict):
    name: str = Field(..., pattern=NODE_PATTERN, description="Unique within the workflow")
    function: str = Field(..., pattern=NAME_PATTERN, description="A deployed function")
    after: list[str] = Field(default_factory=list, max_length=MAX_NODES, description="Parent nodes")
    when: Condition | None = None
    timeout_s: float | None = Field(None, gt=0, le=3600, description="This node's limit (default: the workflow's)")


class WorkflowSpec(_Strict):
    name: str = Field(..., pattern=NAME_PATTERN)
    nodes: list[Node] = Field(..., min_length=1, max_length=MAX_NODES)
    output: list[str] | str | None = Field(None, description="The node (or first of these that ran) that answers; "
                                                             "default: the only node nothing depends on")
    timeout_s: float = Field(60.0, gt=0, le=3600, description="End-to-end limit")
    node_timeout_s: float = Field(30.0, gt=0, le=3600, description="Default limit of one node")
    loading: Literal["slack", "eager", "on-demand"] = Field(
        "slack", description="When cold nodes start loading: just in time for when they are needed (slack), all "
                             "at the request's arrival (eager), or when reached (on-demand)")

    @property
    def outputs(self) -> list[str]:
        if self.output is None:
            parents = {p for n in self.nodes for p in n.after}
            return [n.name for n in self.nodes if n.name not in parents]
        return [self.output] if isinstance(self.output, str) else list(self.output)

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def order(self) -> list[str]:
        """The nodes in an order where every parent comes before its children."""
        return _topological(self.nodes)


@dataclass
class WorkflowError(Exception):
    problems: list[str]

    def __str__(self) -> str:
        return "; ".join(self.problems)


def _topological(nodes: list[Node]) -> list[str]:
    children: dict[str, list[str]] = {n.name: [] for n in nodes}
    pending = {n.name: len(n.after) for n in nodes}
    for node in nodes:
        for parent in node.after:
            children[parent].append(node.name)
    ready = [n.name for n in nodes if not n.after]
    order = []
    while ready:
        name = ready.pop(0)
        order.append(name)
        for child in children[name]:
            pending[child] -= 1
            if pending[child] == 0:
                ready.append(child)
    return order


def _ancestors(spec: WorkflowSpec, name: str) -> set[str]:
    seen, stack = set(), list(spec.node(name).after)
    while stack:
        parent = stack.pop()
        if parent not in seen:
            seen.add(parent)
            stack.extend(spec.node(parent).after)
    return seen


def _check_graph(spec: WorkflowSpec) -> list[str]:
    names = [n.name for n in spec.nodes]
    problems = [f"node {n!r}: the name is used twice" for n in sorted({n for n in names if names.count(n) > 1})]
    if problems:
        return problems
    known = set(names)
    for node in spec.nodes:
        for parent in node.after:
            if parent not in known:
                problems.append(f"node {node.name!r}: after names {parent!r}, which is not a node")
            elif parent == node.name:
                problems.append(f"node {node.name!r}: it cannot come after itself")
        if len(set(node.after)) != len(node.after):
            problems.append(f"node {node.name!r}: a parent is named twice in after")
    if problems:
        return problems
    order = _topological(spec.nodes)
    if len(order) != len(spec.nodes):
        cycle = sorted(known - set(order))
        return [f"nodes {', '.join(repr(n) for n in cycle)}: they form a cycle (or depend on one)"]
    for name in spec.outputs:
        if name not in known:
            problems.append(f"output names {name!r}, which is not a node")
    if problems:
        return problems
    feeding = set(spec.outputs).union(*(_ancestors(spec, o) for o in spec.outputs))
    for node in spec.nodes:
        if node.name not in feeding:
            problems.append(f"node {node.name!r}: it does not lead to the output ({', '.join(spec.outputs)})")
        if node.when is not None and node.when.node not in _ancestors(spec, node.name):
            problems.append(f"node {node.name!r}: its condition reads {node.when.node!r}, which is not one of its "
                            "ancestors")
    return problems


def make_workflow(text: str) -> WorkflowSpec:
    """Parses and validates ``workflow.yaml`` text (graph checks included, functions not)."""
    try:
        check_yaml(text)
        document = yaml.safe_load(text)
    except LimitExceeded as exc:
        raise WorkflowError([f"workflow: {exc}"]) from None
    except yaml.YAMLError as exc:
        raise WorkflowError([f"malformed YAML: {getattr(exc, 'problem', None) or exc}"]) from None
    return workflow_from_dict(document)


def workflow_from_dict(document: Any) -> WorkflowSpec:
    if not isinstance(document, dict):
        raise WorkflowError(["workflow: expected a mapping with name and nodes"])
    try:
        spec = WorkflowSpec.model_validate(document)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            loc = error["loc"]
            where = ".".join(str(p) for p in loc)
            if len(loc) >= 2 and loc[0] == "nodes" and isinstance(loc[1], int) and isinstance(document.get("nodes"),
                                                                                              list) \
                    and loc[1] < len(document["nodes"]) and isinstance(document["nodes"][loc[1]], dict):
                where = f"node {document['nodes'][loc[1]].get('name', loc[1])!r}: " + ".".join(str(p) for p in loc[2:])
            message = "unknown field" if error["type"] == "extra_forbidden" else \
                "required field is missing" if error["type"] == "missing" else error["msg"]
            problems.append(f"{where}: {message}")
        raise WorkflowError(problems) from None
    problems = _check_graph(spec)
    if problems:
        raise WorkflowError(problems)
    return spec


def check_functions(spec: WorkflowSpec, deployed: set[str]) -> None:
    """Every node's function must be deployed; WorkflowError naming the nodes that are not."""
    missing = [f"node {n.name!r}: function {n.function!r} is not deployed" for n in spec.nodes
               if n.function not in deployed]
    if missing:
        raise WorkflowError(missing)


def workflow_to_dict(spec: WorkflowSpec) -> dict[str, Any]:
    """The stored form: only what was written (so a condition keeps which test it names)."""
    return spec.model_dump(mode="json", exclude_unset=True)
