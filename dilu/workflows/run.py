"""Running one workflow request: every node as soon as its parents are done, siblings in
parallel, through ``call`` (the gateway's own invoke path), under per-node and end-to-end limits.

Inputs: a root gets the workflow's request; a node with one parent gets that parent's output;
a fan-in node gets ``{parent: output}`` of the parents that ran. The first failing node ends
the request (the others are cancelled) with ``NodeFailed`` naming it and why.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from dilu.workflows.spec import WorkflowSpec

Call = Callable[[str, bytes], Awaitable[tuple[int, bytes]]]   # (function, JSON body) -> (status, body)


@dataclass
class NodeRun:
    status: str = "pending"        # ok | skipped | failed | timeout | cancelled
    started_ms: float | None = None
    ended_ms: float | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "started_ms": self.started_ms, "ended_ms": self.ended_ms,
                **({"error": self.error} if self.error else {})}


@dataclass
class WorkflowFailed(Exception):
    """The request failed: HTTP ``status``, a message naming the node, and every node's run."""

    status: int
    message: str
    node: str | None = None
    runs: dict[str, NodeRun] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.message


def _error_text(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"])
    except (ValueError, KeyError, TypeError):
        return body.decode("utf-8", errors="replace")[:300]


async def run_workflow(spec: WorkflowSpec, request: Any, call: Call,
                       finished: Callable[[str, dict[str, NodeRun]], None] | None = None,
                       chosen: Callable[[str], None] | None = None) -> tuple[Any, dict[str, NodeRun]]:
    """The output of the first output node that ran, and each node's run (times in ms from the
    request's start). ``finished(node, runs)`` hears of each node once it ran or was skipped;
    ``chosen(node)`` of each node behind a condition as soon as the node its condition reads
    answers and the condition holds, while its other ancestors may still run."""
    started = time.perf_counter()

    def now_ms() -> float:
        return round((time.perf_counter() - started) * 1000, 3)

    runs = {node.name: NodeRun() for node in spec.nodes}
    outputs: dict[str, Any] = {}
    done = {node.name: asyncio.Event() for node in spec.nodes}

    async def run(name: str) -> None:
        node = spec.node(name)
        for parent in node.after:
            await done[parent].wait()
        ran = [p for p in node.after if runs[p].status == "ok"]
        try:
            if (node.after and not ran) or (node.when is not None and not node.when.holds(outputs)):
                runs[name].status = "skipped"
                return
            payload = request if not node.after else outputs[ran[0]] if len(node.after) == 1 \
                else {p: outputs[p] for p in ran}
            limit = node.timeout_s or spec.node_timeout_s
            runs[name].started_ms = now_ms()
            try:
                async with asyncio.timeout(limit):
                    status, body = await call(node.function, json.dumps(payload).encode())
            except TimeoutError:
                runs[name].status, runs[name].ended_ms = "timeout", now_ms()
                raise WorkflowFailed(504, f"node {name!r} ({node.function}) did not answer within {limit:g}s",
                                     name) from None
            runs[name].ended_ms = now_ms()
            if status != 200:
                runs[name].status, runs[name].error = "failed", _error_text(body)
                raise WorkflowFailed(502, f"node {name!r} ({node.function}) failed with {status}: "
                                          f"{runs[name].error}", name)
            outputs[name] = json.loads(body)
            runs[name].status = "ok"
            for other in spec.nodes:
                if chosen is not None and other.when is not None and other.when.node == name \
                        and other.when.holds(outputs):
                    chosen(other.name)
        finally:
            done[name].set()
            if finished is not None and runs[name].status in ("ok", "skipped"):
                finished(name, runs)

    tasks = [asyncio.create_task(run(name)) for name in spec.order()]
    try:
        async with asyncio.timeout(spec.timeout_s):
            await _first_failure(tasks)
    except TimeoutError:
        running = [n for n, r in runs.items() if r.status == "pending" and r.started_ms is not None]
        raise WorkflowFailed(504, f"the workflow did not finish within {spec.timeout_s:g}s (still running: "
                                  f"{', '.join(running) or 'none'})", running[0] if running else None, runs) from None
    except WorkflowFailed as failure:
        failure.runs = runs
        raise
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
        for node_run in runs.values():
            if node_run.status == "pending":
                node_run.status = "cancelled"
    for name in spec.outputs:
        if runs[name].status == "ok":
            return outputs[name], runs
    raise WorkflowFailed(422, f"no output node ran ({', '.join(spec.outputs)} were skipped by their conditions)",
                         None, runs)


async def _first_failure(tasks: list[asyncio.Task]) -> None:
    """Waits for every task; the first exception ends the wait (and is raised)."""
    pending = set(tasks)
    while pending:
        finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
        for task in finished:
            if task.exception() is not None:
                raise task.exception()
