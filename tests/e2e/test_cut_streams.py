"""A stream the instance does not finish says so on every surface: its instance is killed (kill -9)
mid-stream, and the caller gets an explicit error where it would otherwise have seen the stream
simply end (server-sent events, JSON lines, the openai client, tritonclient's ModelStreamInfer)."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import openai
import pytest

from tests.conftest import FIXTURE_FUNCTIONS
from tests.waiting import eventually

LONG = 2000     # tokens of 0.05 s: a stream that would run for 100 s


@pytest.fixture
def cut(start_platform, tmp_path: Path):
    platform = start_platform()
    source = shutil.copytree(FIXTURE_FUNCTIONS / "slow_stream", tmp_path / "cut")
    text = (source / "model.yaml").read_text().replace("name: slow-stream", "name: cut")
    text = text.replace("max_instances: 2", "max_instances: 1")
    (source / "model.yaml").write_text(text + "model: {step_s: 0.05}\n")
    assert platform.cli("deploy", str(source / "model.yaml")).returncode == 0
    platform.wait_ready("cut")
    return platform


def _kill_the_instance(platform) -> str:
    """Kills the one instance of ``cut`` (its pid comes in a chunk of a one-token stream beside
    the running one); returns its id."""
    with platform.http.stream("POST", "/v1/functions/cut/invoke", json={"max_new_tokens": 1},
                              headers={"accept": "application/x-ndjson"}) as reply:
        pid = json.loads(next(reply.iter_lines()))["pid"]
    (killed,) = [i["id"] for i in platform.instances("cut") if i["state"] == "ready"]
    os.kill(pid, signal.SIGKILL)
    return killed


def _replaced(platform, killed: str) -> None:
    eventually(lambda: any(i["state"] == "ready" and i["id"] != killed for i in platform.instances("cut")),
               timeout=60, what="a new instance in place of the killed one")


def _http_stream(platform, accept: str, after_first: Callable[[], str], tokens: int = LONG) -> tuple[list[str], str]:
    with platform.http.stream("POST", "/v1/functions/cut/invoke", json={"max_new_tokens": tokens},
                              headers={"accept": accept}) as reply:
        assert reply.status_code == 200
        lines = reply.iter_lines()
        got = [next(lines)]
        killed = after_first()
        got += [line for line in lines if line]
    return got, killed


def test_a_killed_instance_ends_its_event_and_line_streams_with_an_error(cut) -> None:
    events, killed = _http_stream(cut, "text/event-stream", lambda: _kill_the_instance(cut))
    assert events[-2] == "event: error" and "data: [DONE]" not in events, events[-3:]
    failure = json.loads(events[-1].removeprefix("data: "))
    assert failure["status"] == 502 and "stream cut: the instance failed mid-stream" in failure["error"]
    assert all(json.loads(e.removeprefix("data: "))["text"] == "x" for e in events[:-2])
    _replaced(cut, killed)

    lines, killed = _http_stream(cut, "application/x-ndjson", lambda: _kill_the_instance(cut))
    last = json.loads(lines[-1])
    assert set(last) == {"error", "status"} and last["status"] == 502 and "stream cut" in last["error"]
    assert all(json.loads(line)["text"] == "x" for line in lines[:-1])
    _replaced(cut, killed)

    # A stream that finishes ends with its terminator: [DONE], or the line that counts its chunks.
    finished, _ = _http_stream(cut, "application/x-ndjson", lambda: "", tokens=3)
    assert json.loads(finished[-1]) == {"done": True, "chunks": 3}
    metrics = cut.http.get("/metrics").text
    assert 'dilu_gateway_streams_cut_total{function="cut",reason="failed"} 2.0' in metrics


def test_a_killed_instance_is_an_error_to_the_openai_client_and_to_tritonclient(cut) -> None:
    import numpy as np
    import tritonclient.grpc as triton_grpc

    client = openai.OpenAI(base_url=f"{cut.url}/v1", api_key="none")
    stream = client.completions.create(model="cut", prompt="x", max_tokens=LONG, stream=True)
    chunks = iter(stream)
    assert next(chunks).choices[0].text == "x"
    killed = _kill_the_instance(cut)
    with pytest.raises(openai.APIError, match="stream cut: the instance failed mid-stream"):
        for _ in chunks:
            pass
    _replaced(cut, killed)

    def tensor(name: str, datatype: str, value) -> triton_grpc.InferInput:
        made = triton_grpc.InferInput(name, [1], datatype)
        made.set_data_from_numpy(np.array([value], dtype=object if datatype == "BYTES" else bool))
        return made

    got: queue.Queue = queue.Queue()
    triton = triton_grpc.InferenceServerClient(cut.grpc_address)
    try:
        triton.start_stream(callback=lambda result, error: got.put((result, error)))
        triton.async_stream_infer("cut", [tensor("text_input", "BYTES", b"x"), tensor("stream", "BOOL", True),
                                          tensor("sampling_parameters", "BYTES",
                                                 json.dumps({"max_tokens": LONG}).encode())], request_id="long")
        result, error = got.get(timeout=60)
        assert error is None and result.as_numpy("text_output")[0] == b"x"
        _kill_the_instance(cut)
        while error is None:
            result, error = got.get(timeout=60)
        assert "stream cut: the instance failed mid-stream" in error.message()
        triton.stop_stream()
    finally:
        triton.close()
