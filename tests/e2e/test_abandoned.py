"""Work whose caller left stops: a request queued for a cold start leaves the queue, one queued
at its instance leaves before its batch runs, and a generation answered as a whole stops, once
the client closes its connection (on /v1 invoke, the OpenAI routes, v2 REST) or cancels its
call (gRPC)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import httpx

from tests.conftest import FIXTURE_FUNCTIONS
from tests.waiting import eventually


def _metric(text: str, name: str, labels: str = "") -> float:
    found = re.search(rf"^{name}{re.escape(labels)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def _deploy_step(platform, tmp_path: Path, name: str, model: str, scaling: str, wait: bool = True) -> None:
    folder = shutil.copytree(FIXTURE_FUNCTIONS / "step", tmp_path / name)
    text = (folder / "model.yaml").read_text().replace("name: step", f"name: {name}")
    text = text.replace("min_instances: 0, max_instances: 1", scaling)
    (folder / "model.yaml").write_text(text + f"model: {model}\n")
    if wait:
        assert platform.cli("deploy", str(folder / "model.yaml")).returncode == 0
    else:       # the API answers at once; its first instance goes on loading
        assert platform.deploy_file(folder / "model.yaml").status_code == 201


def test_a_request_queued_for_a_cold_start_leaves_the_queue_with_its_caller(start_platform, tmp_path) -> None:
    platform = start_platform()
    _deploy_step(platform, tmp_path, "cold", "{op: add, load_s: 60}", "min_instances: 0, max_instances: 1",
                 wait=False)
    connection = platform.send_unread("/v1/functions/cold/invoke", {"x": 1})
    eventually(lambda: platform.function("cold")["queued_requests"] == 1, timeout=30, what="the request queued")
    connection.close()
    eventually(lambda: platform.function("cold")["queued_requests"] == 0, timeout=10,
               what="the request to leave the queue (it would wait out the 60 s queue timeout)")
    abandoned = 'dilu_gateway_requests_abandoned_total{function="cold",stage="queued"}'
    assert _metric(platform.http.get("/metrics").text, abandoned) == 1.0


def test_a_request_queued_at_its_instance_leaves_before_its_batch_runs(start_platform, tmp_path,
                                                                        instance_visible_dir: Path) -> None:
    platform = start_platform()
    gate = instance_visible_dir / "gate"
    _deploy_step(platform, tmp_path, "gated", f"{{op: add, gate_file: '{gate}'}}",
                 "min_instances: 1, max_instances: 1")
    (instance,) = platform.wait_ready("gated") and platform.instances("gated")

    def instance_metric(name: str) -> float:
        return _metric(httpx.get(instance["endpoint"] + "/metrics", timeout=10).text, name)

    holding = platform.send_unread("/v1/functions/gated/invoke", {"x": 1})
    eventually(lambda: (instance_visible_dir / "gate.started").exists(), timeout=30, what="the first to hold")
    leaving = platform.send_unread("/v1/functions/gated/invoke", {"x": 2})
    eventually(lambda: instance_metric("dilu_instance_queued_requests") == 1, timeout=30,
               what="the second request queued at the instance")
    leaving.close()
    eventually(lambda: instance_metric("dilu_instance_abandoned_requests") == 1, timeout=10,
               what="the instance to drop the request whose caller left")
    gate.write_text("open")
    answer = holding.makefile("rb").readline()
    assert answer.startswith(b"HTTP/1.1 200"), answer
    holding.close()
    eventually(lambda: instance_metric("dilu_instance_dropped_inputs") == 1, timeout=10,
               what="its input dropped, not computed")
    assert instance_metric("dilu_instance_batch_size_count") == 1        # only the first one ran
    abandoned = 'dilu_gateway_requests_abandoned_total{function="gated",stage="in_flight"}'
    assert _metric(platform.http.get("/metrics").text, abandoned) == 1.0


def test_a_generation_answered_whole_stops_when_its_caller_leaves(start_platform) -> None:
    # Every request is bounded by 2 s here: a next request waiting out the abandoned 50 s
    # generation in the function's one slot would fail.
    platform = start_platform(env={"DILU_REQUEST_TIMEOUT_S": "2"})
    assert platform.cli("deploy", str(FIXTURE_FUNCTIONS / "counter_stream" / "model.yaml")).returncode == 0
    platform.wait_ready("counter")
    connection = platform.send_unread("/v1/functions/counter/invoke", {"to": 1000, "step_s": 0.05})
    eventually(lambda: platform.function("counter")["in_flight_requests"] == 1, timeout=30,
               what="the long request at its instance")
    connection.close()
    after = platform.invoke("counter", {"to": 2})
    assert after.status_code == 200 and after.json() == {"counted": [1, 2]}, after.text


def _one_slot_generator(start_platform, tmp_path: Path):
    """A platform whose requests are bounded by 2 s, with a text generator of one slot (0.05 s
    a token): a next request waiting out an abandoned 1000-token generation would fail."""
    platform = start_platform(env={"DILU_REQUEST_TIMEOUT_S": "2"})
    source = shutil.copytree(FIXTURE_FUNCTIONS / "slow_stream", tmp_path / "slow")
    text = (source / "model.yaml").read_text().replace("max_batch_size: 4", "max_batch_size: 1")
    (source / "model.yaml").write_text(text.replace("max_instances: 2", "max_instances: 1") + "model: {step_s: 0.05}\n")
    assert platform.cli("deploy", str(source / "model.yaml")).returncode == 0
    return platform


def _in_flight(platform, what: str) -> None:
    eventually(lambda: platform.function("slow-stream")["in_flight_requests"] == 1, timeout=30, what=what)


def test_an_openai_completion_whose_caller_left_stops_its_generation(start_platform, tmp_path) -> None:
    platform = _one_slot_generator(start_platform, tmp_path)
    connection = platform.send_unread("/v1/completions", {"model": "slow-stream", "prompt": "x", "max_tokens": 1000})
    _in_flight(platform, "the long completion at its instance")
    connection.close()
    after = platform.http.post("/v1/completions", json={"model": "slow-stream", "prompt": "x", "max_tokens": 2})
    assert after.status_code == 200 and after.json()["choices"][0]["text"] == "xx", after.text


def _text_inputs(max_tokens: int) -> list[dict]:
    return [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["x"]},
            {"name": "sampling_parameters", "datatype": "BYTES", "shape": [1],
             "data": [json.dumps({"max_tokens": max_tokens})]}]


def test_a_stream_left_after_its_first_event_is_counted_abandoned_and_stops(start_platform, tmp_path) -> None:
    platform = _one_slot_generator(start_platform, tmp_path)
    with platform.http.stream("POST", "/v1/functions/slow-stream/invoke", json={"max_new_tokens": 1000},
                              headers={"accept": "text/event-stream"}) as stream:
        assert next(stream.iter_lines()).startswith("data: "), "the stream has begun"
    abandoned = 'dilu_gateway_requests_abandoned_total{function="slow-stream",stage="in_flight"}'
    eventually(lambda: _metric(platform.http.get("/metrics").text, abandoned) == 1.0, timeout=30,
               what="the stream its caller left counted abandoned")
    after = platform.http.post("/v1/functions/slow-stream/invoke", json={"max_new_tokens": 2})
    assert after.status_code == 200 and after.json()["text"] == "xx", after.text


def test_a_v2_inference_whose_caller_left_stops_its_generation(start_platform, tmp_path) -> None:
    platform = _one_slot_generator(start_platform, tmp_path)
    connection = platform.send_unread("/v2/models/slow-stream/infer", {"inputs": _text_inputs(1000)})
    _in_flight(platform, "the long inference at its instance")
    connection.close()
    after = platform.http.post("/v2/models/slow-stream/infer", json={"inputs": _text_inputs(2)})
    assert after.status_code == 200 and after.json()["outputs"][0]["data"] == ["xx"], after.text
    abandoned = 'dilu_gateway_requests_abandoned_total{function="slow-stream",stage="in_flight"}'
    assert _metric(platform.http.get("/metrics").text, abandoned) == 1.0


def test_a_grpc_inference_cancelled_by_its_caller_stops_its_generation(start_platform, tmp_path) -> None:
    import numpy as np
    import tritonclient.grpc as triton_grpc

    def inputs(max_tokens: int) -> list:
        made = []
        for name, value in (("text_input", b"x"), ("sampling_parameters", json.dumps({"max_tokens": max_tokens}))):
            tensor = triton_grpc.InferInput(name, [1], "BYTES")
            tensor.set_data_from_numpy(np.array([value], dtype=object))
            made.append(tensor)
        return made

    platform = _one_slot_generator(start_platform, tmp_path)
    triton = triton_grpc.InferenceServerClient(platform.grpc_address)
    try:
        call = triton.async_infer("slow-stream", inputs(1000), callback=lambda result, error: None)
        _in_flight(platform, "the long inference at its instance")
        call.cancel()
        after = triton.infer("slow-stream", inputs(2))
        assert after.as_numpy("text_output")[0] == b"xx"
    finally:
        triton.close()
    abandoned = 'dilu_gateway_requests_abandoned_total{function="slow-stream",stage="in_flight"}'
    assert _metric(platform.http.get("/metrics").text, abandoned) == 1.0
