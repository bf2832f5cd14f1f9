"""Triton's own clients against Dilu functions that behave like Triton's example models
(examples/triton): tritonclient makes the calls Triton's example programs make (statistics,
model configuration, classification, names with "_", compressed bodies, decoupled streams) and
gets what they check for; what Dilu does not serve is refused with its reason."""

from __future__ import annotations

import gzip
import io
import json
import queue
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.platform import Platform

TRITON = Path(__file__).resolve().parents[2] / "examples" / "triton"
FIRST = np.arange(16, dtype=np.int32).reshape(1, 16)
SECOND = np.ones((1, 16), dtype=np.int32)


@pytest.fixture(scope="module")
def triton(tmp_path_factory):
    platform = Platform(tmp_path_factory.mktemp("triton") / "home")
    try:
        for spec in ("simple/model.yaml", "simple_string/model.yaml", "densenet_onnx/model.yaml",
                     "densenet_onnx/files.yaml", "repeat_int32/model.yaml"):
            done = platform.cli("deploy", str(TRITON / spec))
            assert done.returncode == 0, done.stderr
        yield platform
    finally:
        platform.close()


def _http(platform) -> triton_http.InferenceServerClient:
    return triton_http.InferenceServerClient(platform.url.removeprefix("http://"))


def _simple_inputs(module) -> list:
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(FIRST)
    inputs[1].set_data_from_numpy(SECOND)
    return inputs


def _red_image() -> np.ndarray:
    """A red picture as image clients send it: FP32, 3 x 224 x 224, scaled to -1..1."""
    image = np.full((3, 224, 224), -1.0, dtype=np.float32)
    image[0] = 0.9
    return image


def test_statistics_count_what_was_answered_over_both_transports(triton) -> None:
    http, rpc = _http(triton), triton_grpc.InferenceServerClient(triton.grpc_address)
    before = http.get_inference_statistics("simple")["model_stats"][0]["inference_stats"]["success"]["count"]
    for _ in range(3):
        result = http.infer("simple", _simple_inputs(triton_http))
        assert (result.as_numpy("OUTPUT0") == FIRST + SECOND).all()
    rpc.infer("simple", _simple_inputs(triton_grpc))

    (stats,) = http.get_inference_statistics("simple")["model_stats"]
    assert stats["name"] == "simple" and stats["version"] == "1"
    assert stats["inference_stats"]["success"]["count"] == before + 4
    assert stats["inference_count"] == before + 4 and stats["last_inference"] > 0
    assert stats["inference_stats"]["compute_infer"]["count"] == before + 4
    assert stats["inference_stats"]["compute_infer"]["ns"] > 0
    assert sum(batch["compute_infer"]["count"] for batch in stats["batch_stats"]) == before + 4

    (over_grpc,) = rpc.get_inference_statistics("simple", as_json=True)["model_stats"]
    assert int(over_grpc["inference_stats"]["success"]["count"]) == before + 4
    every = {entry["name"] for entry in http.get_inference_statistics()["model_stats"]}
    assert {"simple", "simple_string", "densenet_onnx"} <= every
    assert {entry.name for entry in rpc.get_inference_statistics().model_stats} == every

    with pytest.raises(InferenceServerException, match="Request for unknown model"):
        http.get_inference_statistics("no_such_model")


def test_the_model_configuration_is_derived_from_the_spec(triton) -> None:
    config = _http(triton).get_model_config("simple")
    assert config["name"] == "simple" and config["max_batch_size"] == 8
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == \
        [("INPUT0", "TYPE_INT32", [16]), ("INPUT1", "TYPE_INT32", [16])]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 1000

    image = triton_grpc.InferenceServerClient(triton.grpc_address).get_model_config("densenet_onnx").config
    assert image.max_batch_size == 0 and list(image.input[0].dims) == [3, 224, 224]
    assert image.input[0].format == image.input[0].FORMAT_NCHW
    assert image.output[0].label_filename == "labels.txt"
    assert _http(triton).get_model_config("simple_string")["input"][0]["data_type"] == "TYPE_STRING"


def test_classification_answers_the_top_classes_with_their_labels(triton) -> None:
    for module, client in ((triton_http, _http(triton)),
                           (triton_grpc, triton_grpc.InferenceServerClient(triton.grpc_address))):
        picture = module.InferInput("data_0", [3, 224, 224], "FP32")
        picture.set_data_from_numpy(_red_image())
        result = client.infer("densenet_onnx", [picture], outputs=[module.InferRequestedOutput("fc6_1", class_count=3)])
        top = [item.decode().split(":") for item in result.as_numpy("fc6_1")]
        assert len(top) == 3 and top[0][1:] == ["0", "RED"]
        assert float(top[0][0]) >= float(top[1][0]) >= float(top[2][0])

    # Image files, batched, as Triton's ensemble example sends them (binary data over HTTP).
    from PIL import Image

    files = []
    for colour in ((0, 0, 230), (240, 240, 10)):
        encoded = io.BytesIO()
        Image.new("RGB", (40, 30), colour).save(encoded, format="PNG")
        files.append([encoded.getvalue()])
    batch = triton_http.InferInput("INPUT", [2, 1], "BYTES")
    batch.set_data_from_numpy(np.array(files, dtype=object), binary_data=True)
    wanted = triton_http.InferRequestedOutput("OUTPUT", binary_data=True, class_count=1)
    result = _http(triton).infer("classify_files", [batch], outputs=[wanted]).as_numpy("OUTPUT")
    assert result.shape == (2, 1)
    assert [row[0].decode().split(":")[2] for row in result] == ["BLUE", "YELLOW"]


def test_a_count_of_classes_out_of_range_is_refused(triton) -> None:
    picture = {"name": "data_0", "datatype": "FP32", "shape": [3, 224, 224], "data": _red_image().ravel().tolist()}
    for count in (0, 10_001, "3", True):
        refused = triton.http.post("/v2/models/densenet_onnx/infer", json={
            "inputs": [picture], "outputs": [{"name": "fc6_1", "parameters": {"classification": count}}]})
        assert refused.status_code == 400, refused.text
        assert "classification must be a count of classes from 1 to 10000" in refused.json()["error"]


def test_names_with_underscores_and_bytes_tensors(triton) -> None:
    inputs = [triton_grpc.InferInput("INPUT0", [1, 16], "BYTES"), triton_grpc.InferInput("INPUT1", [1, 16], "BYTES")]
    inputs[0].set_data_from_numpy(np.array([[str(v).encode() for v in FIRST[0]]], dtype=object))
    inputs[1].set_data_from_numpy(np.array([[b"1"] * 16], dtype=object))
    result = triton_grpc.InferenceServerClient(triton.grpc_address).infer("simple_string", inputs)
    assert [int(v) for v in result.as_numpy("OUTPUT0")[0]] == list(range(1, 17))


def test_unknown_models_and_versions_use_tritons_words(triton) -> None:
    rpc = triton_grpc.InferenceServerClient(triton.grpc_address)
    for call in (lambda: _http(triton).get_model_metadata("wrong_model_name"),
                 lambda: rpc.get_model_metadata("wrong_model_name"),
                 lambda: rpc.get_model_config("simple", model_version="7"),
                 lambda: _http(triton).infer("simple", _simple_inputs(triton_http), model_version="7")):
        with pytest.raises(InferenceServerException) as refused:
            call()
        assert "Request for unknown model: " in refused.value.message(), refused.value.message()


def test_raw_and_typed_contents_are_not_mixed_in_one_request(triton) -> None:
    request = service_pb2.ModelInferRequest(model_name="simple")
    for name, values in (("INPUT0", FIRST), ("INPUT1", SECOND)):
        tensor = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        if name == "INPUT0":
            request.raw_input_contents.append(values.tobytes())
        else:
            tensor.contents.int_contents.extend(values.reshape(-1).tolist())
    request.raw_input_contents.append(SECOND.tobytes())
    with grpc.insecure_channel(triton.grpc_address) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "contents must not be specified for input 'INPUT1'" in refused.value.details()


def test_bytes_that_are_not_a_request_are_refused_by_name_on_both_methods(triton) -> None:
    cut = service_pb2.ModelInferRequest(model_name="simple", raw_input_contents=[FIRST.tobytes()]).SerializeToString()
    with grpc.insecure_channel(triton.grpc_address) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")   # bytes as they are
        with pytest.raises(grpc.RpcError) as refused:
            infer(cut[:-1], timeout=60)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details() == "not a ModelInferRequest: a raw_input_contents record runs past the " \
                                          "message's end"
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        (answer,) = list(stream(iter([cut[:-1]]), timeout=60))
    reply = service_pb2.ModelStreamInferResponse.FromString(answer)
    assert reply.error_message.startswith("not a ModelInferRequest") and not reply.infer_response.outputs


def test_compressed_bodies_are_decoded_or_refused(triton) -> None:
    client = _http(triton)
    for algorithm in ("gzip", "deflate"):
        result = client.infer("simple", _simple_inputs(triton_http), request_compression_algorithm=algorithm)
        assert (result.as_numpy("OUTPUT1") == FIRST - SECOND).all()
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": FIRST.tolist()},
                                  {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": SECOND.tolist()}]})
    brotli = triton.http.post("/v2/models/simple/infer", content=body, headers={"content-encoding": "br"})
    assert brotli.status_code == 415 and "'br' is not supported" in brotli.json()["error"]
    broken = triton.http.post("/v2/models/simple/infer", content=gzip.compress(body.encode())[:-12],
                              headers={"content-encoding": "gzip"})
    assert broken.status_code == 400 and "gzip" in broken.json()["error"], broken.text
    # A small body that inflates past the request limit is stopped at the limit, not inflated.
    bomb = gzip.compress(b'{"inputs": [' + b" " * (64 * 2**20))
    inflated = triton.http.post("/v2/models/simple/infer", content=bomb, headers={"content-encoding": "gzip"})
    assert inflated.status_code == 413 and "DILU_MAX_REQUEST_BYTES" in inflated.json()["error"]
    # /v1 invocations take compressed bodies too.
    plain = triton.http.post("/v1/functions/simple/invoke", content=gzip.compress(json.dumps(
        {"INPUT0": FIRST.tolist(), "INPUT1": SECOND.tolist()}).encode()), headers={"content-encoding": "gzip",
                                                                               "content-type": "application/json"})
    assert plain.status_code == 200 and plain.json()["OUTPUT0"] == (FIRST + SECOND).tolist(), plain.text


def test_a_decoupled_model_streams_one_response_per_element(triton) -> None:
    values = np.arange(100, 105, dtype=np.int32)
    inputs = [triton_grpc.InferInput("IN", [5], "INT32"), triton_grpc.InferInput("DELAY", [5], "UINT32"),
              triton_grpc.InferInput("WAIT", [1], "UINT32")]
    inputs[0].set_data_from_numpy(values)
    inputs[1].set_data_from_numpy(np.full(5, 10, dtype=np.uint32))
    inputs[2].set_data_from_numpy(np.array([10], dtype=np.uint32))
    got: queue.Queue = queue.Queue()
    with triton_grpc.InferenceServerClient(triton.grpc_address) as client:
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        client.async_stream_infer("repeat_int32", inputs, outputs=[triton_grpc.InferRequestedOutput("OUT")])
        answers = [got.get(timeout=60) for _ in range(5)]
        client.stop_stream()
    assert all(error is None for _, error in answers)
    assert [int(result.as_numpy("OUT")[0]) for result, _ in answers] == values.tolist()


def test_what_is_not_served_is_refused_with_its_reason(triton) -> None:
    rpc = triton_grpc.InferenceServerClient(triton.grpc_address)
    for call, words in ((lambda: rpc.get_model_repository_index(), "model repository control is not served"),
                        (lambda: rpc.load_model("simple"), "model repository control is not served"),
                        (lambda: rpc.get_trace_settings(), "tracing is not served"),
                        (lambda: rpc.get_log_settings(), "log settings are not served")):
        with pytest.raises(InferenceServerException, match=words) as refused:
            call()
        assert refused.value.status() == "StatusCode.UNIMPLEMENTED"
    with pytest.raises(InferenceServerException, match="model repository control is not served"):
        _http(triton).load_model("simple")
    assert "Traceback" not in triton.role.log()
