"""The gateway's routing table: least outstanding choice and the bounded cold-start queue."""

from __future__ import annotations

import asyncio

import pytest

from dilu.messages import Endpoint
from gateway.routing import GatewayStopping, NoInstance, QueueFull, RoutingTable, choose_least_outstanding

A, B, C = Endpoint("a", "http://a"), Endpoint("b", "http://b"), Endpoint("c", "http://c")


@pytest.mark.parametrize(("label", "endpoints", "outstanding", "exclude", "expected"), [
    ("none", [], {}, frozenset(), None),
    ("idle first wins ties", [A, B], {}, frozenset(), A),
    ("fewest outstanding", [A, B, C], {"a": 3, "b": 1, "c": 2}, frozenset(), B),
    ("excluded skipped", [A, B], {"a": 0, "b": 5}, frozenset({"a"}), B),
    ("all excluded", [A], {}, frozenset({"a"}), None),
])
def test_choose_least_outstanding(label, endpoints, outstanding, exclude, expected) -> None:
    assert choose_least_outstanding(endpoints, outstanding, exclude) == expected, label


async def test_acquire_release_spreads_load() -> None:
    table = RoutingTable(queue_size=4)
    table.set_endpoints("f", [A, B])
    first = table.pick("f")
    table.acquire("f", first.instance_id)
    second = table.pick("f")
    assert {first, second} == {A, B}
    assert table.in_flight("f") == 1
    table.release("f", first.instance_id)
    assert table.in_flight("f") == 0


async def queued_waiter(table: RoutingTable, function: str = "f") -> asyncio.Task:
    """A request waiting in ``function``'s queue (returns once it is queued)."""
    queued = asyncio.Event()

    async def on_queued() -> None:
        queued.set()

    waiter = asyncio.create_task(table.wait_for_endpoint(function, 30, on_queued=on_queued))
    await queued.wait()
    return waiter


async def test_waiter_gets_the_endpoint_that_appears() -> None:
    table = RoutingTable(queue_size=4)
    waiter = await queued_waiter(table)
    assert table.queued("f") == 1
    table.set_endpoints("f", [A])
    assert await waiter == A
    assert table.queued("f") == 0


async def test_queue_overflow_is_refused() -> None:
    table = RoutingTable(queue_size=1)
    waiter = await queued_waiter(table)
    with pytest.raises(QueueFull):
        await table.wait_for_endpoint("f", 30)
    table.set_failure("f", "boom")
    with pytest.raises(NoInstance, match="boom"):
        await waiter


async def test_deadline_gives_up() -> None:
    table = RoutingTable(queue_size=1)
    with pytest.raises(NoInstance, match="within 0.01s"):
        await table.wait_for_endpoint("f", 0.01)
    assert table.queued("f") == 0


async def test_deleted_function_releases_waiters() -> None:
    table = RoutingTable(queue_size=2)
    waiter = await queued_waiter(table)
    table.forget("f")
    with pytest.raises(NoInstance, match="deleted"):
        await waiter


async def test_a_stopping_gateway_releases_its_waiters_and_queues_no_more_but_routes_the_ready() -> None:
    table = RoutingTable(queue_size=4)
    waiter = await queued_waiter(table)
    table.set_endpoints("g", [A])
    table.stop_queueing("stopping")
    with pytest.raises(GatewayStopping, match="stopping"):
        await waiter
    with pytest.raises(GatewayStopping):
        await table.wait_for_endpoint("f", 30)
    assert await table.wait_for_endpoint("g", 30) == A     # a ready instance still serves
    assert table.queued("f") == 0


async def test_dropped_endpoint_is_not_chosen_until_refreshed() -> None:
    table = RoutingTable(queue_size=2)
    table.set_endpoints("f", [A, B])
    table.drop_endpoint("f", "a")
    assert table.pick("f") == B
    table.replace_all({"f": [A, B]})
    assert table.endpoints("f") == [A, B]


ON_W1, ALSO_W1, ON_W2 = (Endpoint("a", "http://a", "w1"), Endpoint("b", "http://b", "w1"),
                         Endpoint("c", "http://c", "w2"))


def test_an_instance_on_an_avoided_worker_is_chosen_only_when_nothing_else_is_left() -> None:
    # The idler instance is on the worker that just failed: the busier one elsewhere is chosen.
    assert choose_least_outstanding([ALSO_W1, ON_W2], {"c": 7}, frozenset({"a"}), frozenset({"w1"})) == ON_W2
    assert choose_least_outstanding([ALSO_W1], {}, frozenset({"a"}), frozenset({"w1"})) == ALSO_W1


async def test_a_suspected_worker_is_avoided_by_every_request_until_its_suspicion_ends() -> None:
    now = [100.0]
    table = RoutingTable(queue_size=4, clock=lambda: now[0])
    table.set_endpoints("f", [ON_W1, ALSO_W1, ON_W2])
    table.acquire("f", "c")
    assert table.pick("f") == ON_W1         # the least outstanding
    table.suspect("w1")
    assert table.pick("f") == ON_W2 and table.pick("f", exclude=frozenset({"c"})) == ON_W1
    assert (await table.wait_for_endpoint("f", 1.0)) == ON_W2
    now[0] += 5.0                            # SUSPECT_S later
    assert table.pick("f") == ON_W1
