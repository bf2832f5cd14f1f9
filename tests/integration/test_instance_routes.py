"""The instance's routes as its server serves them (``create_app`` under ``_uvicorn_config``, a
real uvicorn on a Unix socket, a real batcher): ``POST /infer`` goes straight to its endpoint,
everything else through the Starlette app, with the same answers either way."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from dilu.instance_protocol import InstanceConfig
from tests.raw_http import serving_on_unix_socket
from worker.instance.batcher import Batcher
from worker.instance.server import RuntimeState, _uvicorn_config, create_app

PREFIX = "/i/route-key"


def _doubled(inputs: list[Any]) -> list[Any]:
    return [{"doubled": item["x"] * 2} for item in inputs]


@pytest.fixture
async def instance(tmp_path: Path) -> AsyncIterator[tuple[str, RuntimeState]]:
    config = InstanceConfig(instance_id="inst-1", function="double", handler="handler:Double", source_dir="",
                            options={}, max_batch_size=4, max_wait_ms=0)
    state = RuntimeState(config)

    @asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        state.batcher = Batcher(_doubled, max_batch_size=4, max_wait_s=0)
        batches = asyncio.create_task(state.batcher.run())
        yield
        batches.cancel()

    path = str(tmp_path / "instance.sock")
    async with serving_on_unix_socket(_uvicorn_config(create_app(state, lifespan, PREFIX), PREFIX), path):
        yield path, state


async def _ask(path: str, method: str, route: str, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(b"%s %s HTTP/1.1\r\nhost: instance\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                 % (method.encode(), route.encode(), len(body)) + body)
    await writer.drain()
    head = (await reader.readuntil(b"\r\n\r\n")).decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in head[1:] if line)
    answer = await reader.readexactly(int(headers["content-length"]))
    writer.close()
    return int(head[0].split()[1]), headers, answer


async def test_an_inference_is_answered_by_its_handler_with_the_batch_headers(instance) -> None:
    path, state = instance
    status, _, body = await _ask(path, "POST", f"{PREFIX}/infer", b'{"x": 21}')
    assert status == 503 and json.loads(body)["loading"] is True, "not ready yet: loading"
    state.ready.set()
    status, headers, body = await _ask(path, "POST", f"{PREFIX}/infer", b'{"x": 21}')
    assert (status, json.loads(body)) == (200, {"doubled": 42})
    assert headers["x-dilu-batch-size"] == "1" and headers["x-dilu-instance"] == "inst-1"


async def test_a_body_that_is_not_json_is_refused_by_name(instance) -> None:
    path, state = instance
    state.ready.set()
    status, _, body = await _ask(path, "POST", f"{PREFIX}/infer", b'{"x": ')
    assert status == 400 and "request body is not valid JSON" in json.loads(body)["error"]


async def test_other_routes_and_methods_keep_the_apps_answers(instance) -> None:
    path, state = instance
    state.ready.set()
    status, _, body = await _ask(path, "GET", f"{PREFIX}/health")
    assert (status, json.loads(body)["status"]) == (200, "ready")
    assert (await _ask(path, "GET", f"{PREFIX}/infer"))[0] == 405, "infer takes POST only"
    assert (await _ask(path, "POST", f"{PREFIX}/nothing-here"))[0] == 404
    assert (await _ask(path, "POST", "/i/another-key/infer"))[0] == 404, "only the instance's own key route"
