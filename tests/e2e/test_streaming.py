"""Streaming functions through the gateway: server-sent events and JSON lines as the chunks are
made, the whole answer for a plain request, streams that outlive the request timeout, and a
caller who leaves freeing its place in the running batch."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.conftest import FIXTURE_FUNCTIONS

REPO = FIXTURE_FUNCTIONS.parents[2]


@pytest.fixture
def counter(start_platform):
    # Every silence and every plain request is bounded by 2 s here; streams are not.
    platform = start_platform(env={"DILU_REQUEST_TIMEOUT_S": "2"})
    deployed = platform.cli("deploy", str(FIXTURE_FUNCTIONS / "counter_stream" / "model.yaml"))
    assert deployed.returncode == 0, deployed.stderr
    deployed = platform.cli("deploy", str(REPO / "examples" / "echo" / "model.yaml"))
    assert deployed.returncode == 0, deployed.stderr
    return platform


def _invoke_url(platform, name: str) -> str:
    return f"{platform.url}/v1/functions/{name}/invoke"


def test_chunks_stream_as_events_or_lines_and_a_plain_request_gets_the_whole_answer(counter) -> None:
    url = _invoke_url(counter, "counter")
    with httpx.stream("POST", url, json={"to": 3}, headers={"accept": "text/event-stream"}, timeout=30) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        events = [line for line in reply.iter_lines() if line]
    assert events == ['data: {"n": 1}', 'data: {"n": 2}', 'data: {"n": 3}', "data: [DONE]"]
    with httpx.stream("POST", url, json={"to": 2}, headers={"accept": "application/x-ndjson"}, timeout=30) as reply:
        lines = [json.loads(line) for line in reply.iter_lines() if line]
    assert lines == [{"n": 1}, {"n": 2}, {"done": True, "chunks": 2}]
    plain = httpx.post(url, json={"to": 4}, timeout=30)
    assert plain.status_code == 200 and plain.json() == {"counted": [1, 2, 3, 4]}
    # Refused before its first chunk: a plain error, not a stream.
    refused = httpx.post(url, json={"to": 0}, headers={"accept": "text/event-stream"}, timeout=30)
    assert refused.status_code == 422 and "n >= 1" in refused.json()["error"]
    not_streaming = httpx.post(_invoke_url(counter, "echo"), json={"x": 1}, headers={"accept": "text/event-stream"},
                               timeout=30)
    assert not_streaming.status_code == 400 and "does not stream" in not_streaming.json()["error"]
    # The streams' timings show in the function's description.
    streams = counter.function("counter")["streams"]
    assert streams["first_chunk_p50_ms"] > 0 and streams["chunk_gap_p50_ms"] > 0
    described = counter.cli("describe", "counter")
    assert described.returncode == 0 and "streams: first chunk p50" in described.stdout, described.stdout


def test_a_stream_that_keeps_producing_outlives_the_request_timeout(counter) -> None:
    # 30 steps of 0.1 s: 3 s in all, past the 2 s bound, with no silence near it.
    with httpx.stream("POST", _invoke_url(counter, "counter"), json={"to": 30, "step_s": 0.1},
                      headers={"accept": "application/x-ndjson"}, timeout=30) as reply:
        lines = [json.loads(line) for line in reply.iter_lines() if line]
    assert [line["n"] for line in lines[:-1]] == list(range(1, 31)) and lines[-1] == {"done": True, "chunks": 30}


def test_a_caller_who_leaves_frees_the_batch_for_the_next(counter) -> None:
    url = _invoke_url(counter, "counter")
    # The batch holds one request; this one would run for 1,000 steps of 0.05 s (50 s).
    with httpx.stream("POST", url, json={"to": 1000, "step_s": 0.05}, headers={"accept": "text/event-stream"},
                      timeout=30) as reply:
        first = next(line for line in reply.iter_lines() if line)
        assert first == 'data: {"n": 1}'
    # Leaving closed the connection; the next request gets the slot at the next step, well
    # within its 2 s bound (it would otherwise wait out the 50 s generation and fail).
    after = httpx.post(url, json={"to": 2}, timeout=30)
    assert after.status_code == 200 and after.json() == {"counted": [1, 2]}


def test_a_functions_own_stream_limit_ends_its_streams(counter) -> None:
    spec_file = FIXTURE_FUNCTIONS / "counter_stream" / "model.yaml"
    text = spec_file.read_text().replace("name: counter", "name: brief") + "max_stream_s: 0.5\n"
    assert counter.deploy_file(spec_file, text).status_code == 201
    counter.wait_ready("brief")
    # 30 steps of 0.1 s: the stream is ended at 0.5 s, with an error event that says so.
    with httpx.stream("POST", _invoke_url(counter, "brief"), json={"to": 30, "step_s": 0.1},
                      headers={"accept": "text/event-stream"}, timeout=30) as reply:
        events = [line for line in reply.iter_lines() if line]
    assert 0 < len(events) < 30 and events[-2] == "event: error", events
    assert json.loads(events[-1].removeprefix("data: ")) == {
        "error": "stream cut: the stream ran past its limit of 0.5 s", "status": 504}
    refused = counter.deploy_file(spec_file, text.replace("max_stream_s: 0.5", "max_stream_s: -1"))
    assert refused.status_code == 422 and "max_stream_s" in refused.json()["error"]


def test_an_update_lets_the_old_instance_finish_its_stream(start_platform) -> None:
    """The old version's instance is stopped while it streams: it takes no new request but
    finishes the stream (its drain), well past the 1 s SIGTERM-to-SIGKILL grace."""
    from tests.waiting import eventually

    platform = start_platform(env={"DILU_STOP_GRACE_S": "1"})
    spec_file = FIXTURE_FUNCTIONS / "counter_stream" / "model.yaml"
    deployed = platform.cli("deploy", str(spec_file))
    assert deployed.returncode == 0, deployed.stderr
    (old,) = [i["id"] for i in platform.instances("counter") if i["state"] == "ready"]
    with httpx.stream("POST", _invoke_url(platform, "counter"), json={"to": 60, "step_s": 0.1},
                      headers={"accept": "application/x-ndjson"}, timeout=30) as reply:
        lines = reply.iter_lines()
        assert json.loads(next(lines)) == {"n": 1}
        updated = platform.deploy_file(spec_file, spec_file.read_text() + "env: {VERSION: '2'}\n")
        assert updated.status_code == 200, updated.text
        eventually(lambda: any(i["id"] == old and i["state"] == "stopping" for i in platform.instances("counter")),
                   timeout=30, what="the old instance stopping")
        rest = [json.loads(line) for line in lines if line]
    assert [chunk["n"] for chunk in rest[:-1]] == list(range(2, 61)) and rest[-1] == {"done": True, "chunks": 60}
    eventually(lambda: all(i["id"] != old or i["state"] == "stopped" for i in platform.instances("counter")),
               timeout=30, what="the old instance gone once its stream ended")


def test_the_gpt_example_streams_the_tokens_of_its_plain_answer(start_platform) -> None:
    platform = start_platform()
    deployed = platform.cli("deploy", str(REPO / "examples" / "gpt" / "model.yaml"))
    assert deployed.returncode == 0, deployed.stderr
    request = {"prompt": "Once upon a time", "max_new_tokens": 12}
    plain = platform.invoke("gpt", request)
    assert plain.status_code == 200, plain.text
    with httpx.stream("POST", _invoke_url(platform, "gpt"), json=request, headers={"accept": "text/event-stream"},
                      timeout=60) as reply:
        events = [line.removeprefix("data: ") for line in reply.iter_lines() if line]
    assert events[-1] == "[DONE]"
    assert [json.loads(event)["token"] for event in events[:-1]] == plain.json()["tokens"]
    too_many = platform.invoke("gpt", {"prompt": "x", "max_new_tokens": 10_000})
    assert too_many.status_code == 422 and "max_new_tokens" in too_many.json()["error"]


def _stream_over_grpc(platform, requests: list[tuple[str, list, str]]) -> tuple[dict[str, list], list[str]]:
    """Sends each (model, inputs, id) on one ModelStreamInfer call; returns each id's results up
    to its final flag, and the in-band errors (each ends one request)."""
    import queue

    import tritonclient.grpc as triton_grpc

    got: queue.Queue = queue.Queue()
    client = triton_grpc.InferenceServerClient(platform.grpc_address)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    results: dict[str, list] = {request_id: [] for _, _, request_id in requests}
    errors: list[str] = []
    try:
        for model, inputs, request_id in requests:
            client.async_stream_infer(model, inputs, request_id=request_id, enable_empty_final_response=True)
        ended = 0
        while ended < len(requests):
            result, error = got.get(timeout=60)
            if error is not None:
                errors.append(error.message())
                ended += 1
                continue
            response = result.get_response()
            if response.outputs:
                results[response.id].append(result)
            ended += response.parameters["triton_final_response"].bool_param
        return results, errors
    finally:
        client.stop_stream()
        client.close()


def _to(n: int) -> list:
    import numpy as np
    import tritonclient.grpc as triton_grpc

    tensor = triton_grpc.InferInput("to", [1], "INT64")
    tensor.set_data_from_numpy(np.array([n], dtype=np.int64))
    return [tensor]


def test_model_stream_infer_streams_a_streaming_function_through_tritonclient(counter) -> None:
    deployed = counter.cli("deploy", str(FIXTURE_FUNCTIONS / "count_tensors" / "model.yaml"))
    assert deployed.returncode == 0, deployed.stderr
    results, errors = _stream_over_grpc(counter, [("count-tensors", _to(3), "three"),
                                                  ("count-tensors", _to(2), "two")])
    assert errors == []
    assert [int(r.as_numpy("n")[0]) for r in results["three"]] == [1, 2, 3]
    assert [int(r.as_numpy("left")[0]) for r in results["three"]] == [2, 1, 0]
    assert [int(r.as_numpy("n")[0]) for r in results["two"]] == [1, 2]
    # A handler's refusal before the first chunk is that request's in-band error; the stream goes on.
    results, errors = _stream_over_grpc(counter, [("count-tensors", _to(0), "zero"),
                                                  ("count-tensors", _to(1), "one")])
    assert len(errors) == 1 and "to must be >= 1" in errors[0]
    assert [int(r.as_numpy("n")[0]) for r in results["one"]] == [1]
    results, errors = _stream_over_grpc(counter, [("no-such-model", _to(1), "x")])
    assert results["x"] == [] and "not found" in errors[0]


def test_model_stream_infer_answers_a_function_that_does_not_stream_once(start_platform) -> None:
    import numpy as np
    import tritonclient.grpc as triton_grpc

    platform = start_platform()
    deployed = platform.cli("deploy", str(REPO / "examples" / "iris" / "model.yaml"))
    assert deployed.returncode == 0, deployed.stderr
    features = triton_grpc.InferInput("features", [1, 4], "FP32")
    features.set_data_from_numpy(np.array([[5.1, 3.5, 1.4, 0.2]], dtype=np.float32))
    results, errors = _stream_over_grpc(platform, [("iris", [features], "a"), ("iris", [features], "b")])
    assert errors == [] and [len(results["a"]), len(results["b"])] == [1, 1]
    unary = triton_grpc.InferenceServerClient(platform.grpc_address).infer("iris", [features])
    assert results["a"][0].get_response().outputs == unary.get_response().outputs
