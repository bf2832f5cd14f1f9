"""`dilu up` runs the gateway and the controller on two event loops of one process: the
in-process state store and the in-process worker client carry what crosses between them."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from dilu.state.base import Channel
from dilu.state.memory import MemoryStore
from dilu.worker_client import InProcessWorkerClient
from tests.builders import make_worker

pytestmark = pytest.mark.integration


class _OtherLoop:
    """An event loop on a thread of its own, as the control thread runs one."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    async def run(self, coroutine):   # runs there, awaited here
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, self.loop))

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture
def other():
    loop = _OtherLoop()
    yield loop
    loop.close()


async def test_a_message_reaches_a_subscriber_on_another_loop_and_back(other: _OtherLoop) -> None:
    store = MemoryStore()
    there = await other.run(store.subscribe(Channel.FUNCTIONS))
    here = await store.subscribe(Channel.DEMAND)
    await store.publish(Channel.FUNCTIONS, {"function": "f"})           # from this loop to the other
    assert await other.run(there.get(timeout=10)) == {"function": "f"}
    await other.run(store.publish(Channel.DEMAND, {"function": "g"}))   # and back
    assert await here.get(timeout=10) == {"function": "g"}
    await other.run(there.aclose())
    await store.publish(Channel.FUNCTIONS, {"function": "gone"})        # no subscriber left: nothing queued
    assert await here.get(timeout=0.01) is None


async def test_a_subscriber_whose_loop_closed_is_dropped_not_an_error() -> None:
    store = MemoryStore()
    gone = _OtherLoop()
    await gone.run(store.subscribe(Channel.ROUTES))
    gone.close()
    await store.publish(Channel.ROUTES, {"function": "f"})
    await store.publish(Channel.ROUTES, {"function": "f"})
    assert store._subscribers[Channel.ROUTES.value] == {}


async def test_writes_from_two_loops_at_once_are_all_kept(other: _OtherLoop) -> None:
    store = MemoryStore()
    second = int(time.time())

    async def reports(prefix: str) -> None:
        for index in range(500):
            await store.heartbeat(make_worker(f"{prefix}-{index}"), ttl_s=60)
            await store.report_activity(prefix, {}, {"f": {second: 1}}, ttl_s=60)

    await asyncio.gather(reports("here"), other.run(reports("there")))
    assert len(await store.live_workers()) == 1000
    assert (await store.function_activity())["f"].requests == {second: 1000}


class _Agent:
    """Answers as a worker agent does, noting the loop each call ran on."""

    def __init__(self) -> None:
        self.loops: list[asyncio.AbstractEventLoop] = []
        self.stopped: list[str] = []

    async def list_instances(self) -> list:
        self.loops.append(asyncio.get_running_loop())
        return []

    async def stop_instance(self, instance_id: str) -> None:
        self.loops.append(asyncio.get_running_loop())
        await asyncio.sleep(0)
        self.stopped.append(instance_id)

    def describe(self) -> dict:
        self.loops.append(asyncio.get_running_loop())
        return {"id": "w1"}


async def test_a_worker_on_another_loop_is_called_on_its_own_loop(other: _OtherLoop) -> None:
    agent = _Agent()
    client = InProcessWorkerClient(agent, other.loop)    # type: ignore[arg-type]
    assert await client.list_instances() == []
    await client.stop_instance("i-1")
    assert await client.info() == {"id": "w1"} and agent.stopped == ["i-1"]
    assert agent.loops == [other.loop] * 3                # never on the caller's loop
    await other.run(client.list_instances())              # a caller on the agent's loop calls it directly
    assert agent.loops[-1] is other.loop
