"""The state store contract, against the in-process store and the real Redis."""

from __future__ import annotations

import time

import pytest

from dilu.messages import Endpoint
from dilu.state.base import Channel
from tests.builders import make_worker
from tests.waiting import async_eventually


async def test_heartbeats_expire(store) -> None:
    await store.heartbeat(make_worker("short"), ttl_s=0.2)
    await store.heartbeat(make_worker("long"), ttl_s=30)
    assert {w.id for w in await store.live_workers()} == {"short", "long"}
    live = await store.live_workers()
    assert next(w for w in live if w.id == "long").device.memory_bytes == make_worker().device.memory_bytes

    async def only_long() -> bool:
        return {w.id for w in await store.live_workers()} == {"long"}

    await async_eventually(only_long, timeout=5, what="short heartbeat to expire")


async def test_routes_replace_and_clear(store) -> None:
    await store.set_routes("f", [Endpoint("a", "http://a"), Endpoint("b", "http://b")])
    await store.set_routes("g", [Endpoint("c", "http://c")])
    await store.set_routes("f", [Endpoint("b", "http://b")])
    assert await store.get_routes() == {"f": [Endpoint("b", "http://b")], "g": [Endpoint("c", "http://c")]}
    await store.set_routes("g", [])
    assert set(await store.get_routes()) == {"f"}


async def test_activity_sums_gateways_and_counts_requests(store) -> None:
    second = int(time.time())
    await store.report_activity("gw1", {"f": {"in_flight": 2, "queued": 1, "last_request_at": 5.0}},
                                {"f": {second: 3}}, ttl_s=30)
    await store.report_activity("gw2", {"f": {"in_flight": 1, "queued": 0, "last_request_at": 7.0}},
                                {"f": {second: 2}}, ttl_s=30)
    activity = (await store.function_activity())["f"]
    assert (activity.in_flight, activity.queued, activity.last_request_at) == (3, 1, 7.0)
    assert activity.requests == {second: 5}


async def test_publish_reaches_subscribers_of_that_channel_only(store) -> None:
    demand = await store.subscribe(Channel.DEMAND)
    routes = await store.subscribe(Channel.ROUTES)
    await store.publish(Channel.DEMAND, {"function": "f"})
    assert await demand.get(timeout=5) == {"function": "f"}
    assert await routes.get(timeout=0.2) is None
    await demand.aclose()
    await routes.aclose()


async def test_histories_keep_the_newest_items_of_each_key(store) -> None:
    for i in range(5):
        await store.append_history("w", {"i": i}, keep=3, ttl_s=30)
    await store.append_history("v", {"i": "v"}, keep=3, ttl_s=30)
    assert await store.histories(["w", "v", "never"]) == {"w": [{"i": 2}, {"i": 3}, {"i": 4}],
                                                          "v": [{"i": "v"}], "never": []}


async def test_routes_from_an_older_controller_term_are_refused(store) -> None:
    from dilu.fencing import Deposed

    await store.set_routes("f", [Endpoint("new", "http://new")], term=7)
    with pytest.raises(Deposed, match="term 6"):
        await store.set_routes("f", [Endpoint("late", "http://late")], term=6)
    await store.set_routes("g", [Endpoint("c", "http://c")], term=7)
    assert await store.get_routes() == {"f": [Endpoint("new", "http://new")], "g": [Endpoint("c", "http://c")]}
