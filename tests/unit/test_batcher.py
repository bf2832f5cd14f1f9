"""Dynamic batching inside the instance runtime."""

from __future__ import annotations

import asyncio
import threading

import pytest

from dilu import InputError
from worker.instance.batcher import Batcher, BatchError


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


async def test_a_queue_is_served_in_batches_up_to_the_bound_not_the_profiled_batch() -> None:
    """The profile chose batch 1 of up to 16: light load is served one by one, but 20 requests
    queued behind a running batch leave in batches of the spec's bound."""
    model = GatedModel()
    batcher = Batcher(model.predict, max_batch_size=16, preferred_batch_size=1, max_wait_s=30.0)
    runner = asyncio.create_task(batcher.run())
    first = asyncio.create_task(batcher.submit(0))
    await asyncio.to_thread(model.entered.wait, 10)
    queued = [asyncio.create_task(batcher.submit(i)) for i in range(1, 21)]
    while batcher.queued() < 20:
        await asyncio.sleep(0)
    model.gate.set()
    results = await asyncio.gather(first, *queued)
    runner.cancel()
    assert model.sizes == [1, 16, 4]
    assert [r.output for r in results] == [2 * i for i in range(21)]


async def test_past_the_profiled_batch_a_batch_waits_for_nothing() -> None:
    """With the preferred batch reached, no request waits out ``max_wait_s`` for company (an hour
    here: the answer comes at once or the test times out)."""
    model = GatedModel()
    model.gate.set()
    batcher = Batcher(model.predict, max_batch_size=16, preferred_batch_size=1, max_wait_s=3600.0)
    runner = asyncio.create_task(batcher.run())
    result = await asyncio.wait_for(batcher.submit(5), 30)
    runner.cancel()
    assert (result.output, result.batch_size, model.sizes) == (10, 1, [1])


async def test_below_the_profiled_batch_a_batch_still_waits_to_fill() -> None:
    model = GatedModel()
    model.gate.set()
    batcher = Batcher(model.predict, max_batch_size=16, preferred_batch_size=3, max_wait_s=30.0)
    runner = asyncio.create_task(batcher.run())
    results = await asyncio.gather(*(batcher.submit(i) for i in range(3)))
    runner.cancel()
    assert model.sizes == [3] and {r.batch_size for r in results} == {3}


@pytest.mark.parametrize(("label", "predict", "message"), [
    ("handler raises", lambda xs: 1 / 0, "ZeroDivisionError"),
    ("wrong length", lambda xs: xs[:-1], "must return a list of 2 results, one per input of its batch; got 1"),
    ("not a list", lambda xs: "nope", "got str"),
])
async def test_errors_every_input_hits_reach_every_caller(label, predict, message) -> None:
    batcher = Batcher(predict, max_batch_size=2, max_wait_s=30.0)
    runner = asyncio.create_task(batcher.run())
    results = await asyncio.gather(batcher.submit(1), batcher.submit(2), return_exceptions=True)
    runner.cancel()
    assert all(isinstance(r, BatchError) and message in str(r) for r in results), (label, results)


async def test_a_batch_answered_with_too_few_results_fails_whole_and_is_logged(caplog) -> None:
    # Its first result for every batch: bisection would end at batches of one, each answered.
    batcher = Batcher(lambda xs: xs[:1], max_batch_size=4, max_wait_s=30.0)
    runner = asyncio.create_task(batcher.run())
    results = await asyncio.gather(*(batcher.submit(x) for x in range(4)), return_exceptions=True)
    runner.cancel()
    assert all(isinstance(r, BatchError) and r.status == 500 and "list of 4 results" in str(r) and "got 1" in str(r)
               for r in results), results
    assert [r.getMessage() for r in caplog.records].count(
        "handler broke its contract: predict() must return a list of 4 results, one per input of its batch; got 1") == 1


def picky(inputs: list) -> list:
    """Fails the whole batch when any input is negative (as a tensor op would); 'bad' is rejected."""
    if any(x == "bad" for x in inputs):
        raise InputError("'bad' is not a number")
    if any(x < 0 for x in inputs):
        raise RuntimeError("negative input")
    return [x * 10 for x in inputs]


async def test_one_bad_input_does_not_fail_its_batch_mates() -> None:
    batcher = Batcher(picky, max_batch_size=8, max_wait_s=30.0)
    runner = asyncio.create_task(batcher.run())
    inputs = [1, 2, "bad", 3, -1, 4, 5, 6]
    results = await asyncio.gather(*(batcher.submit(x) for x in inputs), return_exceptions=True)
    runner.cancel()
    assert [r.output for r in results if not isinstance(r, Exception)] == [10, 20, 30, 40, 50, 60]
    rejected, failed = results[2], results[4]
    assert isinstance(rejected, BatchError) and rejected.status == 422 and "not a number" in str(rejected)
    assert isinstance(failed, BatchError) and failed.status == 500 and "negative input" in str(failed)


async def test_a_returned_input_error_rejects_only_that_input() -> None:
    batcher = Batcher(lambda xs: [InputError("odd") if x % 2 else x for x in xs], max_batch_size=4, max_wait_s=30.0)
    runner = asyncio.create_task(batcher.run())
    results = await asyncio.gather(*(batcher.submit(x) for x in range(4)), return_exceptions=True)
    runner.cancel()
    assert [r.output for r in results[::2]] == [0, 2]
    assert all(isinstance(r, BatchError) and r.status == 422 for r in results[1::2])
    assert results[0].batch_size == 4, "the good inputs were served in one batch, not re-run"


async def test_an_input_whose_caller_left_is_dropped_before_its_batch_runs() -> None:
    model = GatedModel()
    batcher = Batcher(model.predict, max_batch_size=4, max_wait_s=0.0)
    runner = asyncio.create_task(batcher.run())
    first = asyncio.create_task(batcher.submit(1))
    await asyncio.to_thread(model.entered.wait, 10)
    left, stays = asyncio.create_task(batcher.submit(2)), asyncio.create_task(batcher.submit(3))
    await asyncio.sleep(0)  # let the submissions enqueue
    left.cancel()
    model.gate.set()
    assert (await first).output == 2 and (await stays).output == 6
    runner.cancel()
    assert model.sizes == [1, 1] and batcher.abandoned == 1


async def test_a_handler_failure_is_logged_with_its_traceback_once(caplog) -> None:
    def fails(inputs: list) -> list:
        if inputs == ["bad"]:
            raise InputError("'bad' is the caller's to fix")
        return [{"x": 1}[item] for item in inputs]      # KeyError for anything but "x"

    batcher = Batcher(fails, max_batch_size=1, max_wait_s=0.0)
    runner = asyncio.create_task(batcher.run())
    for item in ("a", "b", "c"):
        with pytest.raises(BatchError, match="KeyError"):
            await batcher.submit(item)
    with pytest.raises(BatchError, match="caller's to fix"):
        await batcher.submit("bad")
    runner.cancel()
    logged = [r.getMessage() for r in caplog.records if r.name == "dilu.handler"]
    assert len(logged) == 1 and "predict() failed" in logged[0] and "Traceback" in logged[0]
    assert "KeyError: 'a'" in logged[0] and "in fails" in logged[0]
