"""Dynamic batching inside the instance runtime."""

from __future__ import annotations

import asyncio
import threading

import pytest

from worker.runtime.batcher import Batcher, BatchError


class GatedModel:
    """predict() blocks on a gate so tests decide when a batch finishes; it records batch sizes."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.gate = threading.Event()
        self.entered = threading.Event()

    def predict(self, inputs: list) -> list:
        self.sizes.append(len(inputs))
        self.entered.set()
        self.gate.wait(10)
        return [x * 2 for x in inputs]


async def test_requests_arriving_during_a_batch_form_the_next_one() -> None:
    model = GatedModel()
    batcher = Batcher(model.predict, max_batch_size=4, max_wait_s=0.0)
    runner = asyncio.create_task(batcher.run())
    first = asyncio.create_task(batcher.submit(1))
    await asyncio.to_thread(model.entered.wait, 10)
    rest = [asyncio.create_task(batcher.submit(i)) for i in range(2, 8)]
    await asyncio.sleep(0)  # let the submissions enqueue
    model.gate.set()
    results = await asyncio.gather(first, *rest)
    runner.cancel()
    assert [r.output for r in results] == [2, 4, 6, 8, 10, 12, 14]
    assert model.sizes[0] == 1
    assert max(model.sizes[1:]) <= 4 and sum(model.sizes) == 7
    assert results[1].batch_size == model.sizes[1]


async def test_max_wait_collects_a_full_batch() -> None:
    model = GatedModel()
    model.gate.set()
    batcher = Batcher(model.predict, max_batch_size=3, max_wait_s=30.0)
    runner = asyncio.create_task(batcher.run())
    results = await asyncio.gather(*(batcher.submit(i) for i in range(3)))
    runner.cancel()
    assert model.sizes == [3]
    assert all(r.batch_size == 3 for r in results)


@pytest.mark.parametrize(("label", "predict", "message"), [
    ("handler raises", lambda xs: 1 / 0, "ZeroDivisionError"),
    ("wrong length", lambda xs: xs[:-1], "must return a list of 2 results"),
    ("not a list", lambda xs: "nope", "got str"),
])
async def test_handler_errors_reach_every_caller(label, predict, message) -> None:  # noqa: ANN001
    batcher = Batcher(predict, max_batch_size=2, max_wait_s=30.0)
    runner = asyncio.create_task(batcher.run())
    results = await asyncio.gather(batcher.submit(1), batcher.submit(2), return_exceptions=True)
    runner.cancel()
    assert all(isinstance(r, BatchError) and message in str(r) for r in results), (label, results)
