"""A stream's chunks sent by the runner's thread straight to the caller's socket
(``worker.instance.direct_writes``), under the instance's own server (``create_app`` under
``_uvicorn_config``, a real uvicorn on a Unix socket, a real ``StreamRunner``): whatever path
each chunk takes, the caller gets every one, in order, then the stream's end."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from dilu import Last
from dilu.instance_protocol import InstanceConfig
from tests.raw_http import read_answer, serving_on_unix_socket
from tests.waiting import async_eventually
from worker.instance import direct_writes
from worker.instance.server import RuntimeState, _uvicorn_config, create_app
from worker.instance.streams import StreamRunner

PREFIX = "/i/stream-key"


class Numbers:
    """Streams {"n": 1} .. {"n": to} (or on, ``forever``), each padded with ``pad`` bytes, {"n": NaN}
    at ``bad_at``; ``made`` counts the chunks made."""

    def __init__(self) -> None:
        self.made = 0

    def start(self, request: dict) -> dict:
        return {"to": request["to"], "at": 0, "pad": "x" * request.get("pad", 0), "bad_at": request.get("bad_at"),
                "forever": request.get("forever", False)}

    def step(self, states: list[dict]) -> list:
        chunks = []
        for state in states:
            state["at"] += 1
            self.made += 1
            chunk = {"n": state["at"] if state["at"] != state["bad_at"] else float("nan"), "pad": state["pad"]}
            chunks.append(Last(chunk) if state["at"] == state["to"] and not state["forever"] else chunk)
        return chunks


@pytest.fixture
async def instance(tmp_path: Path) -> AsyncIterator[tuple[str, Numbers]]:
    config = InstanceConfig(instance_id="inst-1", function="numbers", handler="handler:Numbers", source_dir="",
                            options={}, max_batch_size=1, max_wait_ms=0)
    state = RuntimeState(config)
    handler = Numbers()

    @asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        state.handler = handler
        state.streams = StreamRunner(handler, max_batch_size=1, executor=ThreadPoolExecutor(1))
        steps = asyncio.create_task(state.streams.run())
        state.ready.set()
        yield
        steps.cancel()

    path = str(tmp_path / "instance.sock")
    async with serving_on_unix_socket(_uvicorn_config(create_app(state, lifespan, PREFIX), PREFIX), path):
        yield path, handler


@pytest.fixture
def direct_sends(monkeypatch) -> list[int]:
    """How many chunks went through a DirectSink, counted as they go."""
    sent = [0]
    send = direct_writes.DirectSink.send

    def counted(self: direct_writes.DirectSink, chunk: Any) -> bool:
        taken = send(self, chunk)
        sent[0] += taken
        return taken
    monkeypatch.setattr(direct_writes.DirectSink, "send", counted)
    return sent


async def _open_stream(path: str, request: dict, accept: str = "text/event-stream"
                       ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    body = json.dumps(request).encode()
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(b"POST %s/infer HTTP/1.1\r\nhost: instance\r\naccept: %s\r\ncontent-type: application/json\r\n"
                 b"content-length: %d\r\n\r\n%s" % (PREFIX.encode(), accept.encode(), len(body), body))
    await writer.drain()
    return reader, writer


async def _until(condition: Callable[[], bool], what: str) -> None:
    async def holds() -> bool:
        return condition()
    await async_eventually(holds, timeout=30, interval=0.01, what=what)


def _events(body: bytes) -> list[bytes]:
    return [event for event in body.split(b"\n\n") if event]


async def test_every_chunk_arrives_in_order_and_most_go_from_the_runners_thread(instance, direct_sends) -> None:
    path, _ = instance
    reader, writer = await _open_stream(path, {"to": 300})
    status, headers, body = await read_answer(reader)
    writer.close()
    events = _events(body)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert [json.loads(event.removeprefix(b"data: "))["n"] for event in events[:-1]] == list(range(1, 301))
    assert events[-1] == b"data: [DONE]", "the stream's end comes after its last chunk"
    assert direct_sends[0] > 200, "past the first few, chunks are sent by the runner's thread"


async def test_json_lines_count_the_chunks_sent_either_way(instance, direct_sends) -> None:
    path, _ = instance
    reader, writer = await _open_stream(path, {"to": 50}, accept="application/x-ndjson")
    _, _, body = await read_answer(reader)
    writer.close()
    lines = [json.loads(line) for line in body.splitlines()]
    assert [line["n"] for line in lines[:-1]] == list(range(1, 51))
    assert lines[-1] == {"done": True, "chunks": 50} and direct_sends[0] > 0


async def test_a_caller_that_does_not_read_gets_every_chunk_when_it_does(instance, direct_sends) -> None:
    path, handler = instance
    reader, writer = await _open_stream(path, {"to": 120, "pad": 64 << 10})   # 7.5 MiB: the socket fills
    await _until(lambda: handler.made >= 60, "the generation to run ahead of its unread caller")
    _, _, body = await read_answer(reader)
    writer.close()
    events = _events(body)
    assert [json.loads(event.removeprefix(b"data: "))["n"] for event in events[:-1]] == list(range(1, 121))
    assert all(len(json.loads(event.removeprefix(b"data: "))["pad"]) == 64 << 10 for event in events[:-1])
    assert events[-1] == b"data: [DONE]"


async def test_a_chunk_that_is_not_json_ends_the_stream_with_an_error_after_the_earlier_ones(instance) -> None:
    path, _ = instance
    reader, writer = await _open_stream(path, {"to": 10, "bad_at": 6})
    _, _, body = await read_answer(reader)
    writer.close()
    events = _events(body)
    assert [json.loads(event.removeprefix(b"data: "))["n"] for event in events[:5]] == [1, 2, 3, 4, 5]
    assert events[5].startswith(b"event: error") and b"not JSON-serialisable" in events[5]
    assert len(events) == 6


async def test_a_caller_who_leaves_mid_stream_frees_its_place_for_the_next(instance, direct_sends) -> None:
    path, _ = instance
    reader, writer = await _open_stream(path, {"to": 1, "forever": True})
    await reader.readuntil(b"\r\n\r\n")
    await _until(lambda: direct_sends[0] >= 5, "chunks sent by the runner's thread")
    writer.close()
    reader, writer = await _open_stream(path, {"to": 3})    # the batch holds one: it waits for the place
    async with asyncio.timeout(30):
        _, _, body = await read_answer(reader)
    writer.close()
    assert [json.loads(event.removeprefix(b"data: "))["n"] for event in _events(body)[:-1]] == [1, 2, 3]
