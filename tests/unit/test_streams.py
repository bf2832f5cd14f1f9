"""Streaming handlers: requests join a running generation at its next step and leave it when
done or when their caller goes, and a plain request gets the whole answer."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator

import pytest

from dilu import InputError, Last
from dilu.instance_protocol import stream_ending, stream_kind
from worker.instance.batcher import BatchError
from worker.instance.streams import StreamRunner, stream_body, whole_answer


class Counter:
    """Counts from 1 to each request's ``n``; every step waits for the test to let it run."""

    def __init__(self) -> None:
        self.steps: list[list[str]] = []
        self.entered = threading.Semaphore(0)
        self.gate = threading.Semaphore(0)

    def start(self, request: dict) -> dict:
        if request["n"] < 1:
            raise InputError("n must be at least 1")
        return {"name": request["name"], "n": request["n"], "at": 0}

    def step(self, states: list[dict]) -> list:
        self.steps.append([state["name"] for state in states])
        self.entered.release()
        self.gate.acquire()
        chunks = []
        for state in states:
            state["at"] += 1
            chunks.append(Last(state["at"]) if state["at"] == state["n"] else state["at"])
        return chunks

    def finish(self, chunks: list[int]) -> dict:
        return {"counted": chunks}


async def _entered(handler: Counter) -> None:
    await asyncio.to_thread(handler.entered.acquire)


async def _collect(stream) -> list:
    return [chunk async for chunk in stream.chunks()]


@contextlib.asynccontextmanager
async def _serving(runner: StreamRunner) -> AsyncIterator[StreamRunner]:
    """The runner, running until the block ends (its thread then stops)."""
    task = asyncio.create_task(runner.run())
    try:
        yield runner
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _running(handler: Counter, max_batch_size: int) -> contextlib.AbstractAsyncContextManager[StreamRunner]:
    return _serving(StreamRunner(handler, max_batch_size=max_batch_size))


async def test_a_request_joins_the_running_generation_at_its_next_step_and_leaves_when_done() -> None:
    handler = Counter()
    async with _running(handler, 4) as runner:
        first = runner.submit({"name": "a", "n": 3})
        await _entered(handler)                 # step 1 of "a" is running
        second = runner.submit({"name": "b", "n": 3})
        for _ in range(4):                      # let steps 1 to 4 finish one by one
            handler.gate.release()
            if _ < 3:
                await _entered(handler)
        assert await _collect(first) == [1, 2, 3] and await _collect(second) == [1, 2, 3]
        # "b" joined at step 2, not after "a" finished; "a" left after its third step.
        assert handler.steps == [["a"], ["a", "b"], ["a", "b"], ["b"]]


async def test_a_caller_who_leaves_frees_its_slot_within_one_step() -> None:
    handler = Counter()
    async with _running(handler, 1) as runner:
        leaving = runner.submit({"name": "a", "n": 100})
        waiting = runner.submit({"name": "b", "n": 1})   # the batch holds one: "b" waits for the slot
        await _entered(handler)
        leaving.cancel()
        handler.gate.release()
        await _entered(handler)
        handler.gate.release()
        assert await _collect(waiting) == [1]
        assert handler.steps == [["a"], ["b"]]


async def test_a_refused_or_broken_start_fails_its_request_only() -> None:
    handler = Counter()
    async with _running(handler, 4) as runner:
        refused = runner.submit({"name": "x", "n": 0})
        with pytest.raises(BatchError, match="n must be at least 1") as caught:
            await _collect(refused)
        assert caught.value.status == 422
        broken = runner.submit({"name": "y"})          # start() raises KeyError: a 500
        with pytest.raises(BatchError) as caught:
            await _collect(broken)
        assert caught.value.status == 500


async def test_a_plain_request_gets_the_whole_answer_and_a_stream_its_events() -> None:
    handler = Counter()
    for _ in range(6):
        handler.gate.release()
    async with _running(handler, 4) as runner:
        assert await whole_answer(handler, runner.submit({"name": "a", "n": 2})) == {"counted": [1, 2]}
        events = [piece async for piece in stream_body(runner.submit({"name": "b", "n": 2}), "sse")]
        assert events == [b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"]
        lines = [piece async for piece in stream_body(runner.submit({"name": "c", "n": 2}), "ndjson")]
        assert lines == [b"1\n", b"2\n", b'{"done": true, "chunks": 2}\n']
        assert stream_ending(lines[-1]) == "done" and stream_ending(lines[0]) is None
    assert stream_kind("text/event-stream") == "sse" and stream_kind("application/x-ndjson") == "ndjson"
    assert stream_kind("application/json") is None and stream_kind(None) is None


class Endless:
    """Streams 1, 2, 3, ... for as long as it is stepped; records each step's batch size."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    def start(self, request: dict) -> dict:
        return {"at": 0}

    def step(self, states: list[dict]) -> list:
        self.batches.append(len(states))
        for state in states:
            state["at"] += 1
        return [state["at"] for state in states]


async def _until(condition) -> None:
    while not condition():
        await asyncio.sleep(0)     # the runner's turn: no time passes


async def test_an_unread_stream_leaves_the_batch_once_its_fill_waits_and_rejoins_when_read() -> None:
    from worker.instance.streams import MAX_WAITING_CHUNKS

    handler = Endless()
    async with _serving(StreamRunner(handler, max_batch_size=2)) as runner:
        unread, read = runner.submit({}), runner.submit({})
        got = []
        async for chunk in read.chunks():
            got.append(chunk)
            if len(got) == 3 * MAX_WAITING_CHUNKS:
                break
        assert unread.chunks_made == MAX_WAITING_CHUNKS, "an unread stream is stepped only until its fill waits"
        assert handler.batches[-1] == 1, "the batch went on without it"
        reader = unread.chunks()
        assert [await anext(reader) for _ in range(MAX_WAITING_CHUNKS)] == list(range(1, MAX_WAITING_CHUNKS + 1))
        await _until(lambda: unread.chunks_made > MAX_WAITING_CHUNKS)    # read, it is stepped again
        unread.cancel()
        read.cancel()


async def test_a_stream_whose_caller_reads_nothing_is_ended_and_its_chunks_dropped() -> None:
    from worker.instance.streams import MAX_WAITING_CHUNKS

    now = [100.0]
    async with _serving(StreamRunner(Endless(), max_batch_size=2, stall_s=30.0, clock=lambda: now[0])) as runner:
        stalled = runner.submit({})
        await _until(lambda: stalled.full)
        now[0] += 29.0
        runner.submit({}).cancel()          # wakes the runner: not yet stalled
        await _until(lambda: runner.queued() == 0)
        assert runner.stalled == 0 and stalled.chunks_made == MAX_WAITING_CHUNKS
        now[0] += 1.0
        runner.submit({}).cancel()
        await _until(lambda: runner.stalled == 1)
        with pytest.raises(BatchError, match="read none of its last 64 chunks for 30 s") as ended:
            await _collect(stalled)
        assert ended.value.status == 504, "what it held is dropped: the error comes first"


async def test_steps_go_on_while_the_event_loop_is_busy_and_their_chunks_arrive_in_order() -> None:
    class Signalling(Endless):
        def __init__(self) -> None:
            super().__init__()
            self.ten_steps = threading.Event()

        def step(self, states: list[dict]) -> list:
            chunks = super().step(states)
            if len(self.batches) == 10:
                self.ten_steps.set()
            return chunks

    handler = Signalling()
    async with _serving(StreamRunner(handler, max_batch_size=1)) as runner:
        stream = runner.submit({})
        await _until(lambda: stream.chunks_made >= 1)
        # The loop is held here, sending nothing: the handler's thread still steps.
        assert handler.ten_steps.wait(timeout=60), "the next step waited for the event loop"
        reader = stream.chunks()
        assert [await anext(reader) for _ in range(10)] == list(range(1, 11))
        stream.cancel()


async def test_a_caller_leaving_a_full_batch_lets_the_next_request_in_at_once() -> None:
    from worker.instance.streams import MAX_WAITING_CHUNKS

    async with _serving(StreamRunner(Endless(), max_batch_size=2, stall_s=3600.0)) as runner:
        first, second = runner.submit({}), runner.submit({})
        await _until(lambda: first.full and second.full)   # nobody reads: the runner waits
        waiting = runner.submit({})
        await _until(lambda: not runner._wake.is_set())      # the runner has seen it: no slot, so it waits
        first.cancel()
        await _until(lambda: waiting.chunks_made > 0)        # not after the hour's stall
        assert second.chunks_made == MAX_WAITING_CHUNKS
        second.cancel()
        waiting.cancel()
