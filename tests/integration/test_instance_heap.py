"""Instance processes keep the memory a request frees for the next request (``worker.backends.heap``):
a model's repeated forward passes stop taking page faults once the first has run, in a fresh
process and in one taken from the runtime pool alike."""

from __future__ import annotations

import statistics
from pathlib import Path

import httpx
import pytest

from dilu.messages import DeviceInfo, WorkerInfo
from dilu.state.memory import MemoryStore
from tests.builders import make_start
from tests.conftest import FIXTURE_FUNCTIONS
from tests.waiting import async_eventually
from worker.agent import WorkerAgent
from worker.backends.process import ProcessBackend

CHURN = str(FIXTURE_FUNCTIONS / "heap_churn")
SNOOP = str(FIXTURE_FUNCTIONS / "snoop")


def _agent(backend: ProcessBackend, tmp_path: Path) -> WorkerAgent:
    info = WorkerInfo(id="w-heap", host="test", url=None,
                      device=DeviceInfo(kind="cpu", uuid=None, name="cpu", memory_bytes=2**33))
    return WorkerAgent(info=info, backend=backend, store=MemoryStore(), logs_dir=tmp_path / "logs",
                       health_poll_s=0.05, stop_grace_s=5)


async def _ready(agent: WorkerAgent, instance_id: str) -> None:
    async def ready() -> bool:
        await agent.check_instances()
        state = next(s for s in await agent.list_instances() if s.instance_id == instance_id).state
        assert state != "failed", await agent.read_logs(instance_id)
        return state == "ready"

    await async_eventually(ready, timeout=90, what=f"{instance_id} to be ready")


@pytest.mark.parametrize("spares", [0, 1], ids=["fresh-process", "from-the-pool"])
async def test_repeated_forward_passes_reuse_the_memory_the_first_one_faulted_in(tmp_path: Path,
                                                                                 spares: int) -> None:
    backend = ProcessBackend(state_dir=tmp_path, spares=spares, spares_max=spares)
    agent = _agent(backend, tmp_path)
    try:
        spare_pid = backend.pool().spares[0].process.pid if spares else None
        status = await agent.start_instance(make_start("i-churn", CHURN, handler="handler:Churn"))
        assert (status.pid == spare_pid) == bool(spares)
        await _ready(agent, "i-churn")
        async with httpx.AsyncClient(base_url=status.endpoint, timeout=60) as client:
            faults = [(await client.post("/infer", json={})).json()["faults"] for _ in range(7)]
    finally:
        await agent.shutdown()
    # glibc's defaults hand the call's buffers back and fault them in again on every call (about
    # as many faults as the first call took); kept in the heap, later calls take next to none.
    assert statistics.median(faults[2:]) * 4 < faults[0], faults


async def test_a_functions_own_malloc_setting_reaches_its_instance_instead_of_ours(tmp_path: Path) -> None:
    backend = ProcessBackend(state_dir=tmp_path, spares=1, spares_max=1)
    agent = _agent(backend, tmp_path)
    try:
        spare_pid = backend.pool().spares[0].process.pid
        status = await agent.start_instance(make_start("i-own", SNOOP, handler="handler:Snoop",
                                                       env={"MALLOC_ARENA_MAX": "2"}))
        assert status.pid != spare_pid, "malloc reads its setting at start-up: a spare cannot take it"
        await _ready(agent, "i-own")
        async with httpx.AsyncClient(base_url=status.endpoint, timeout=30) as client:
            seen = (await client.post("/infer", json={"env": ["MALLOC_ARENA_MAX", "GLIBC_TUNABLES"]})).json()
    finally:
        await agent.shutdown()
    assert seen["env"] == {"MALLOC_ARENA_MAX": "2", "GLIBC_TUNABLES": None}
