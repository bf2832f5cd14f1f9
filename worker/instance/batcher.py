"""Dynamic batching: concurrent requests are grouped up to a size or a wait, one batch at a time."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from dilu.handler import InputError
from worker.instance.failures import HandlerFailures

log = logging.getLogger(__name__)
LOGGED_KEPT = 100     # distinct handler contract errors logged, at most (each once)


@dataclass(frozen=True)
class BatchResult:
    output: Any
    batch_size: int
    queued_s: float
    compute_s: float


class BatchError(Exception):
    """The handler failed on this request; ``status`` is 422 when it rejected the input as the
    caller's fault (``dilu.InputError``), 500 otherwise."""

    def __init__(self, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.status = status


class ContractError(BatchError):
    """The handler answered a batch in a shape it must not (a wrong number of results): the whole
    batch's failure, named with both counts, never bisected away."""


class HandedOver(BatchError):
    """The instance is stopping and this request had not started: it goes to another instance
    (answered as "still loading, try another", which the gateway retries elsewhere)."""

    def __init__(self) -> None:
        super().__init__("the instance is stopping; the request had not started", 503)


def as_error(exc: BaseException) -> BatchError:
    """``exc`` as the request's answer: 422 for ``InputError``, 500 for anything else."""
    if isinstance(exc, BatchError):
        return exc
    if isinstance(exc, InputError):
        return BatchError(str(exc), 422)
    return BatchError(f"{type(exc).__name__}: {exc}")


class Batcher:
    """Collects submitted inputs and calls ``predict(list) -> list`` on an executor.

    A batch waits up to ``max_wait_s`` after its first input for ``preferred_batch_size`` inputs
    (the profile's batch; the bound when not given), then takes whatever else is already waiting,
    up to ``max_batch_size`` (the spec's bound): light load keeps the profiled batch and its
    latency, while a queue is served in batches as large as the user allows. Batches run one at a
    time (models are rarely thread-safe), so requests that arrive during a batch form the next one.

    One bad input does not fail its batch-mates: when ``predict`` raises for a batch of several,
    the batch is halved and each half run again, recursively, so only the inputs that fail on
    their own get an error (k bad inputs cost about k x log2(batch) extra calls). A
    handler may also return an ``InputError`` in place of one result to reject that input.
    """

    def __init__(self, predict: Callable[[list[Any]], list[Any]], *, max_batch_size: int,
                 max_wait_s: float, executor: Executor | None = None,
                 preferred_batch_size: int | None = None) -> None:
        self._predict = predict
        self._max = max_batch_size
        self._preferred = min(preferred_batch_size or max_batch_size, max_batch_size)
        self._wait = max_wait_s
        self._executor = executor
        self._queue: asyncio.Queue[tuple[Any, asyncio.Future, float]] = asyncio.Queue()
        self._logged: set[str] = set()
        self.failures = HandlerFailures()
        self.abandoned = 0      # inputs dropped before their batch ran: their callers had left

    def queued(self) -> int:
        """Inputs waiting for a batch (not counting the one running)."""
        return self._queue.qsize()

    def hand_over(self) -> int:
        """Answers every input still waiting for a batch with ``HandedOver`` (the instance is
        stopping); the batch running, and one being gathered, finish. Returns how many."""
        count = 0
        while not self._queue.empty():
            _, future, _ = self._queue.get_nowait()
            if not future.done():
                future.set_exception(HandedOver())
                count += 1
        return count

    async def submit(self, item: Any) -> BatchResult:
        future = asyncio.get_running_loop().create_future()
        await self._queue.put((item, future, time.perf_counter()))
        return await future

    async def run(self) -> None:
        """Serves batches until cancelled. An input whose caller left (its ``submit`` was
        cancelled) before its batch ran is dropped, not computed."""
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            deadline = loop.time() + self._wait
            while len(batch) < self._max:
                if not self._queue.empty():
                    batch.append(self._queue.get_nowait())
                    continue
                if len(batch) >= self._preferred:
                    break   # past the profiled batch only what already waits joins: no extra latency
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    async with asyncio.timeout(left):
                        batch.append(await self._queue.get())
                except TimeoutError:
                    break
            live = [entry for entry in batch if not entry[1].done()]
            self.abandoned += len(batch) - len(live)
            if live:
                await self._run_batch(loop, live)

    async def _run_batch(self, loop: asyncio.AbstractEventLoop,
                         batch: list[tuple[Any, asyncio.Future, float]]) -> None:
        inputs = [item for item, _, _ in batch]
        started = time.perf_counter()
        try:
            outputs = await self._call(loop, inputs)
        except ContractError as exc:
            # Not an input's fault, so no halving: halves would hide it down to batches of one.
            self._log_once(str(exc))
            for _, future, _ in batch:
                self._settle(future, exc)
            return
        except Exception as exc:  # noqa: BLE001 - the handler's failure, whatever it is, is the request's answer
            if len(batch) == 1:
                self.failures.failed(exc, "predict")
                self._settle(batch[0][1], exc)
                return
            # Isolate the failing input(s) by halving: halves that succeed are served as a batch,
            # a failing half is split again, down to the inputs that fail on their own.
            half = len(batch) // 2
            await self._run_batch(loop, batch[:half])
            await self._run_batch(loop, batch[half:])
            return
        compute = time.perf_counter() - started
        for (_, future, submitted), output in zip(batch, outputs, strict=True):
            if isinstance(output, InputError):
                self._settle(future, output)
            elif not future.done():
                future.set_result(BatchResult(output, len(batch), started - submitted, compute))

    async def _call(self, loop: asyncio.AbstractEventLoop, inputs: list[Any]) -> list[Any]:
        outputs = await loop.run_in_executor(self._executor, self._predict, inputs)
        if not isinstance(outputs, (list, tuple)) or len(outputs) != len(inputs):
            got = str(len(outputs)) if isinstance(outputs, (list, tuple)) else type(outputs).__name__
            raise ContractError(f"predict() must return a list of {len(inputs)} results, one per input of its "
                                f"batch; got {got}")
        return list(outputs)

    def _log_once(self, message: str) -> None:
        if message not in self._logged and len(self._logged) < LOGGED_KEPT:
            self._logged.add(message)
            log.error("handler broke its contract: %s", message)

    @staticmethod
    def _settle(future: asyncio.Future, exc: BaseException) -> None:
        if not future.done():
            future.set_exception(as_error(exc))
