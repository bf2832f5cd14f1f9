"""Two gateways serving one workflow decide what to keep loaded as one gateway would: every
request's record and every load time goes to the state store, and decisions are made from it."""

from __future__ import annotations

import asyncio

import pytest

from dilu.state.memory import MemoryStore
from dilu.workflows.history import RequestRecord, Served
from dilu.workflows.loading import WorkflowLoader
from dilu.workflows.spec import make_workflow
from tests.unit.workflow_platform import FakePlatform

pytestmark = pytest.mark.integration

GiB = 2**30
SPEC = make_workflow("""
name: pipeline
nodes:
  - {name: detect, function: detector}
  - {name: describe, function: describer, after: [detect]}
""")
# Regular traffic, every 4 s: the root's cold start shows, so it is pre-warmed before the next one.
RECORDS = [RequestRecord(1000.0 + 4 * i, {"detect": True, "describe": True},
                         served=(Served("detector", 0.2), Served("describer", 0.3))) for i in range(8)]
DECIDED_AT = RECORDS[-1].arrived_at + 0.6


def _loader(store: object) -> WorkflowLoader:
    platform = FakePlatform(cold_s={"detector": 0.8, "describer": 0.5}, memory={"detector": GiB, "describer": GiB})
    return WorkflowLoader(platform, store, clock=lambda: DECIDED_AT)


async def _measure_load(loader: WorkflowLoader, function: str) -> None:
    owner = object()
    loader.load(function, DECIDED_AT + 60, owner)
    await asyncio.sleep(0)
    await loader.platform.become_routable(function)


async def test_two_gateways_make_the_same_keep_decisions_as_one(store) -> None:
    alone = _loader(MemoryStore())
    for record in RECORDS:
        await alone.record("pipeline", record)
    await _measure_load(alone, "detector")
    one = await alone.keep_nodes("pipeline", SPEC)

    first, second = _loader(store), _loader(store)
    for index, record in enumerate(RECORDS):          # the requests alternate between the gateways
        await (first if index % 2 == 0 else second).record("pipeline", record)
    await _measure_load(second, "detector")           # a load only the second gateway timed
    two = [await first.keep_nodes("pipeline", SPEC), await second.keep_nodes("pipeline", SPEC)]

    assert one["detect"].verdict == "prewarm"         # the scenario decides something worth comparing
    assert two == [one, one]
    assert await first.decisions("pipeline") == await second.decisions("pipeline") == await alone.decisions("pipeline")
    history, leads = await first.history("pipeline", SPEC)
    assert history.gaps == [4.0] * 7 and len(leads["detector"]) == 1
    for loader in (alone, first, second):
        loader.close()


async def test_a_gateway_that_saw_half_the_requests_alone_would_decide_otherwise() -> None:
    """What the shared history prevents: each gateway of two, seeing every other request, would
    take the gaps for twice as long and pre-warm later than the traffic needs."""
    whole, half = _loader(MemoryStore()), _loader(MemoryStore())
    for index, record in enumerate(RECORDS):
        await whole.record("pipeline", record)
        if index % 2 == 1:
            await half.record("pipeline", record)
    assert await whole.keep_nodes("pipeline", SPEC) != await half.keep_nodes("pipeline", SPEC)
    whole.close()
    half.close()
