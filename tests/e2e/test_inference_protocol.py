"""The Open Inference Protocol (v2) beside Dilu's own API: tritonclient, over HTTP and gRPC,
drives a function that declares its tensors, unchanged, through the same queue and metrics."""

from __future__ import annotations

import json
import re
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

REPO = Path(__file__).resolve().parents[2]
FLOWERS = np.array([[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3], [5.9, 2.8, 4.3, 1.3]], dtype=np.float32)


def _deploy(platform, *names: str) -> None:
    for name in names:
        done = platform.cli("deploy", str(REPO / "examples" / name / "model.yaml"))
        assert done.returncode == 0, done.stderr
    for name in names:
        platform.wait_ready(name)


def _requests_counted(platform, function: str) -> float:
    text = platform.http.get("/metrics").text
    pattern = rf'^dilu_gateway_requests_total\{{code="200",function="{function}"\}} (\S+)$'
    return sum(float(m) for m in re.findall(pattern, text, flags=re.MULTILINE))


def _expected(platform) -> dict:
    """What Dilu's own API answers for the same flowers: both protocols run one handler."""
    reply = platform.invoke("iris", {"features": FLOWERS.tolist()})
    assert reply.status_code == 200, reply.text
    return reply.json()


@pytest.fixture
def iris(start_platform):
    platform = start_platform()
    _deploy(platform, "iris", "echo")
    return platform


def test_tritonclient_http(iris) -> None:
    expected = _expected(iris)
    assert expected["species"] == ["setosa", "virginica", "versicolor"]
    client = triton_http.InferenceServerClient(iris.url.removeprefix("http://"))
    assert client.is_server_live() and client.is_server_ready()
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
    assert client.is_model_ready("iris")
    version = str(iris.function("iris")["version"])
    metadata = client.get_model_metadata("iris", model_version=version)
    assert metadata["versions"] == [version]
    assert metadata["inputs"] == [{"name": "features", "datatype": "FP32", "shape": [-1, 4]}]
    assert [o["name"] for o in metadata["outputs"]] == ["probabilities", "species"]

    counted = _requests_counted(iris, "iris")
    for binary in (True, False):   # binary tensor data extension, then plain JSON, both ways
        features = triton_http.InferInput("features", list(FLOWERS.shape), "FP32")
        features.set_data_from_numpy(FLOWERS, binary_data=binary)
        outputs = [triton_http.InferRequestedOutput(name, binary_data=binary) for name in ("probabilities", "species")]
        result = client.infer("iris", [features], outputs=outputs, model_version=version, request_id="r1")
        np.testing.assert_allclose(result.as_numpy("probabilities"), expected["probabilities"], rtol=1e-6)
        # BYTES come back as bytes from binary data, as text from JSON.
        assert [s if isinstance(s, str) else s.decode() for s in result.as_numpy("species")] == expected["species"]
        assert result.get_response()["id"] == "r1" and result.get_response()["model_version"] == version
    # No outputs named: all of them, as binary (what tritonclient asks for by default).
    features = triton_http.InferInput("features", [1, 4], "FP32")
    features.set_data_from_numpy(FLOWERS[:1])
    result = client.infer("iris", [features])
    assert result.as_numpy("probabilities").shape == (1, 3) and result.as_numpy("species")[0] == b"setosa"
    # Requests of both protocols are counted as one function's requests.
    assert _requests_counted(iris, "iris") == counted + 3

    with pytest.raises(InferenceServerException, match="'iris' version 99 is not found"):
        client.get_model_metadata("iris", model_version="99")
    with pytest.raises(InferenceServerException, match="not found"):
        client.get_model_metadata("nope")
    with pytest.raises(InferenceServerException, match="does not declare its tensors"):
        client.get_model_metadata("echo")
    wrong_type = triton_http.InferInput("features", [1, 4], "FP64")
    wrong_type.set_data_from_numpy(FLOWERS[:1].astype(np.float64))
    with pytest.raises(InferenceServerException, match="datatype 'FP64' given, the function declares FP32"):
        client.infer("iris", [wrong_type])
    wrong_shape = triton_http.InferInput("features", [1, 3], "FP32")
    wrong_shape.set_data_from_numpy(FLOWERS[:1, :3])
    with pytest.raises(InferenceServerException, match=r"shape \[1, 3\] does not fit the declared shape \[-1, 4\]"):
        client.infer("iris", [wrong_shape])
    with pytest.raises(InferenceServerException, match="shared memory is not served") as refused:
        client.register_system_shared_memory("region", "/dilu-test", 64)
    assert refused.value.status() == "400"
    client.close()


def test_raw_http_errors_name_the_problem(iris) -> None:
    http = iris.http

    def infer(body: bytes, **headers: str):
        return http.post("/v2/models/iris/infer", content=body, headers=headers)

    tensor = {"name": "features", "datatype": "FP32", "shape": [1, 4]}
    cases = [
        (b"{", 400, "not valid JSON"),
        (json.dumps({"inputs": []}).encode(), 400, "non-empty list"),
        (json.dumps({"inputs": [{**tensor, "data": [1, 2, 3]}]}).encode(), 400, "3 elements given"),
        (json.dumps({"inputs": [{**tensor, "data": [1, 2, 3, "x"]}]}).encode(), 400, "FP32 elements are numbers"),
        (json.dumps({"inputs": [{**tensor, "data": [[1, 2], [3, 4]]}]}).encode(), 400, "level by level"),
        (json.dumps({"inputs": [{**tensor, "name": "other", "data": [1, 2, 3, 4]}]}).encode(), 400, "no input 'other'"),
        (json.dumps({"inputs": [{**tensor, "data": [1, 2, 3, 4]}], "outputs": [{"name": "x"}]}).encode(),
         400, "no output 'x'"),
    ]
    for body, status, message in cases:
        reply = infer(body)
        assert reply.status_code == status and message in reply.json()["error"], (body, reply.text)
    header = json.dumps({"inputs": [{**tensor, "parameters": {"binary_data_size": 16}}]}).encode()
    short = infer(header + b"\0" * 8, **{"inference-header-content-length": str(len(header))})
    assert short.status_code == 400 and "does not fit" in short.json()["error"]
    extra = infer(header + b"\0" * 20, **{"inference-header-content-length": str(len(header))})
    assert extra.status_code == 400 and "no input claims" in extra.json()["error"]
    past = infer(header, **{"inference-header-content-length": str(len(header) + 1)})
    assert past.status_code == 400 and "within the body" in past.json()["error"]
    # JSON answers by default; the same numbers as Dilu's own API.
    reply = infer(json.dumps({"inputs": [{**tensor, "data": [[5.1, 3.5, 1.4, 0.2]]}]}).encode())
    assert reply.status_code == 200 and reply.headers["content-type"] == "application/json"
    assert {o["name"]: o["data"] for o in reply.json()["outputs"]}["species"] == ["setosa"]
    assert http.get("/v2/models/iris/versions/7/ready").status_code == 404
    wrong_version = http.post("/v2/models/iris/versions/7/infer", content=b"{}")
    assert wrong_version.status_code == 404 and "version 7 is not found" in wrong_version.json()["error"]
    too_big = infer(b" " * (10 * 2**20 + 1))     # past DILU_MAX_REQUEST_BYTES (10 MiB by default)
    assert too_big.status_code == 413 and "exceeds the limit" in too_big.json()["error"]
    assert http.get("/v2/health/live").status_code == 200 and http.get("/v2/health/ready").status_code == 200


def test_tritonclient_grpc(iris) -> None:
    expected = _expected(iris)
    client = triton_grpc.InferenceServerClient(iris.grpc_address)
    assert client.is_server_live() and client.is_server_ready()
    assert "binary_tensor_data" in client.get_server_metadata().extensions
    version = str(iris.function("iris")["version"])
    assert client.is_model_ready("iris", model_version=version)
    metadata = client.get_model_metadata("iris")
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.inputs] == [("features", "FP32", [-1, 4])]

    counted = _requests_counted(iris, "iris")
    features = triton_grpc.InferInput("features", list(FLOWERS.shape), "FP32")
    features.set_data_from_numpy(FLOWERS)
    result = client.infer("iris", [features], model_version=version, request_id="g1",
                          outputs=[triton_grpc.InferRequestedOutput("species")])
    assert [s.decode() for s in result.as_numpy("species")] == expected["species"]
    assert result.as_numpy("probabilities") is None     # only what was asked for
    result = client.infer("iris", [features])
    np.testing.assert_allclose(result.as_numpy("probabilities"), expected["probabilities"], rtol=1e-6)
    assert result.get_response().id == "" and _requests_counted(iris, "iris") == counted + 2

    with pytest.raises(InferenceServerException) as missing:
        client.get_model_metadata("nope")
    assert missing.value.status() == "StatusCode.NOT_FOUND"
    wrong = triton_grpc.InferInput("features", [1, 5], "FP32")
    wrong.set_data_from_numpy(np.zeros((1, 5), dtype=np.float32))
    with pytest.raises(InferenceServerException, match="does not fit the declared shape") as bad:
        client.infer("iris", [wrong])
    assert bad.value.status() == "StatusCode.INVALID_ARGUMENT"
    with pytest.raises(InferenceServerException, match="shared memory is not served") as refused:
        client.register_system_shared_memory("region", "/dilu-test", 64)
    assert refused.value.status() == "StatusCode.UNIMPLEMENTED"
    client.close()


def test_keys_guard_both_transports(start_platform) -> None:
    admin = "admin-key-for-the-protocol-test-0123"
    platform = start_platform(env={"DILU_ADMIN_KEY": admin, "DILU_API_KEY": admin})
    platform.http.headers["authorization"] = f"Bearer {admin}"
    _deploy(platform, "iris")
    made = platform.http.post("/v1/keys", json={"name": "iris-only", "scopes": ["invoke:iris"]})
    key = made.json()["key"]

    def iris_only() -> dict[str, str]:   # a new dict per call: tritonclient.http adds its own headers to it
        return {"authorization": f"Bearer {key}"}

    http = triton_http.InferenceServerClient(platform.url.removeprefix("http://"))
    assert http.is_server_live()                     # health stays open
    with pytest.raises(InferenceServerException, match="needs an API key"):
        http.get_model_metadata("iris")
    features = triton_http.InferInput("features", [1, 4], "FP32")
    features.set_data_from_numpy(FLOWERS[:1])
    with pytest.raises(InferenceServerException, match="needs an API key"):
        http.infer("iris", [features])
    assert http.is_model_ready("iris", headers=iris_only())
    assert http.infer("iris", [features], headers=iris_only()).as_numpy("species")[0] == b"setosa"
    http.close()

    rpc = triton_grpc.InferenceServerClient(platform.grpc_address)
    assert rpc.is_server_live()
    gfeatures = triton_grpc.InferInput("features", [1, 4], "FP32")
    gfeatures.set_data_from_numpy(FLOWERS[:1])
    with pytest.raises(InferenceServerException) as refused:
        rpc.infer("iris", [gfeatures])
    assert refused.value.status() == str(grpc.StatusCode.UNAUTHENTICATED)
    assert rpc.infer("iris", [gfeatures], headers=iris_only()).as_numpy("species")[0] == b"setosa"
    rpc.close()
