"""Every v2 datatype through REST binary, REST JSON, both mixed in one request, and gRPC, into a
handler and back: the same bytes come out, extremes and the smallest floats included; and a
batch of concurrent requests each gets its own tensors back."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from tests.conftest import FIXTURE_FUNCTIONS

NUMERIC = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
           "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
           "FP32": np.float32, "FP64": np.float64}


def _tensors(seed: int = 0) -> dict[str, np.ndarray]:
    """One [2, n] tensor per datatype: its extremes, zero, and (``seed``) a value of its own."""
    tensors = {}
    for datatype, dtype in NUMERIC.items():
        if datatype == "BOOL":
            values = [True, False, bool(seed % 2), True]
        elif datatype.startswith("FP"):
            info = np.finfo(dtype)
            values = [info.max, -info.max, info.tiny, info.smallest_subnormal, -0.0, 0.1, 1 / 3, float(seed)]
        else:
            info = np.iinfo(dtype)
            values = [info.min, info.max, 0, seed]
        tensors[datatype] = np.array(values, dtype=dtype).reshape(2, -1)
    tensors["BYTES"] = np.array([["café", ""], [f"request {seed}", "ünï"]], dtype=object)
    return tensors


def _same(sent: np.ndarray, got: np.ndarray) -> bool:
    if sent.dtype == object:
        as_bytes = np.vectorize(lambda v: v if isinstance(v, bytes) else str(v).encode(), otypes=[object])
        return sent.shape == got.shape and (as_bytes(sent) == as_bytes(got)).all()
    return sent.shape == got.shape and sent.dtype == got.dtype and sent.tobytes() == got.tobytes()


def _over_http(client: triton_http.InferenceServerClient, name: str, tensors: dict[str, np.ndarray],
               binary: callable) -> triton_http.InferResult:
    inputs, outputs = [], []
    for number, (datatype, array) in enumerate(tensors.items()):
        given = triton_http.InferInput(datatype.lower(), list(array.shape), datatype)
        given.set_data_from_numpy(array, binary_data=binary(number))
        inputs.append(given)
        outputs.append(triton_http.InferRequestedOutput(f"{datatype.lower()}_out", binary_data=binary(number + 1)))
    return client.infer(name, inputs, outputs=outputs)


@dataclass
class Echo:
    url: str
    grpc_address: str
    name: str


@pytest.fixture(params=["tensor_echo", "tensor_echo_arrays"])
def echo(start_platform, request) -> Echo:
    """The echo handler taking nested lists, or (``arrays: numpy``) the tensors' bytes as arrays."""
    platform = start_platform()
    deployed = platform.cli("deploy", str(FIXTURE_FUNCTIONS / request.param / "model.yaml"))
    assert deployed.returncode == 0, deployed.stderr
    return Echo(platform.url, platform.grpc_address, request.param.replace("_", "-"))


@pytest.mark.parametrize(("transport", "binary"), [("binary", lambda n: True), ("JSON", lambda n: False),
                                                   ("mixed", lambda n: n % 2 == 0)])
def test_every_datatype_comes_back_byte_exact_over_rest(echo, transport: str, binary: callable) -> None:
    client = triton_http.InferenceServerClient(echo.url.removeprefix("http://"))
    sent = _tensors()
    result = _over_http(client, echo.name, sent, binary)
    for datatype, array in sent.items():
        assert _same(array, result.as_numpy(f"{datatype.lower()}_out")), (transport, datatype)


def test_every_datatype_comes_back_byte_exact_over_grpc_and_a_batch_keeps_each_requests_own(echo) -> None:
    client = triton_grpc.InferenceServerClient(echo.grpc_address)

    def ask(seed: int) -> tuple[dict[str, np.ndarray], triton_grpc.InferResult]:
        sent = _tensors(seed)
        inputs = []
        for datatype, array in sent.items():
            given = triton_grpc.InferInput(datatype.lower(), list(array.shape), datatype)
            given.set_data_from_numpy(array)
            inputs.append(given)
        return sent, client.infer(echo.name, inputs)

    with ThreadPoolExecutor(8) as pool:         # eight at once: the instance batches them
        answers = list(pool.map(ask, range(8)))
    for sent, result in answers:
        for datatype, array in sent.items():
            assert _same(array, result.as_numpy(f"{datatype.lower()}_out")), datatype


def test_nan_and_infinities_reach_a_handler_of_arrays_and_are_refused_for_one_of_json(echo) -> None:
    client = triton_grpc.InferenceServerClient(echo.grpc_address)
    sent = _tensors()
    sent["FP32"] = np.array([[np.nan, np.inf], [-np.inf, 1.0]], dtype=np.float32)
    inputs = []
    for datatype, array in sent.items():
        given = triton_grpc.InferInput(datatype.lower(), list(array.shape), datatype)
        given.set_data_from_numpy(array)
        inputs.append(given)
    if echo.name == "tensor-echo-arrays":     # raw bytes end to end: any float is a value
        result = client.infer(echo.name, inputs)
        assert _same(sent["FP32"], result.as_numpy("fp32_out"))
    else:                                     # the handler takes JSON, which has no NaN
        with pytest.raises(InferenceServerException, match="input 'fp32': element 0 is nan"):
            client.infer(echo.name, inputs)


def test_v1_json_reaches_either_handler_and_a_shape_is_checked_for_one_of_arrays(echo) -> None:
    sent = {datatype.lower(): array.tolist() for datatype, array in _tensors(5).items()
            if datatype not in ("BYTES", "FP16")}
    sent["bytes"] = [["a", "b"]]
    sent["fp16"] = [[0.5, -2.0]]
    reply = httpx.post(f"{echo.url}/v1/functions/{echo.name}/invoke", json=sent, timeout=60)
    assert reply.status_code == 200, reply.text
    assert {name.removesuffix("_out"): value for name, value in reply.json().items()} == sent
    flat = httpx.post(f"{echo.url}/v1/functions/{echo.name}/invoke", json={**sent, "int8": [1, 2]}, timeout=60)
    if echo.name == "tensor-echo-arrays":    # the instance holds the declared shapes
        assert flat.status_code == 422
        assert "input 'int8': shape [2] does not fit the declared shape [-1, -1]" in flat.json()["error"]
    else:                                    # a handler of lists checks for itself
        assert flat.status_code == 200
