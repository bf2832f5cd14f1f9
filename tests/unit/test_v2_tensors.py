"""The inference protocol's tensor conversions and request decoding (pure)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tritonclient.grpc import service_pb2
from tritonclient.utils import serialize_byte_tensor

from dilu.spec import SpecModel, TensorSpec
from gateway.v2.grpc_service import decode
from gateway.v2.grpc_wire import read_request
from gateway.v2.inference import Model, ProtocolError, Result
from gateway.v2.rest_wire import OutputChoice, decode_request, encode_response
from gateway.v2.tensors import TensorError, check_header, from_binary, from_handler, from_json, to_binary, to_handler

pytestmark = pytest.mark.unit
WORDS = TensorSpec(name="words", datatype="BYTES", shape=[-1])
COUNTS = TensorSpec(name="counts", datatype="INT32", shape=[2, -1])
MODEL = Model(name="m", version="3", status="ready", spec=SpecModel(
    name="m", handler="h:H", inputs=[WORDS, COUNTS], outputs=[TensorSpec(name="y", datatype="FP16", shape=[-1])]))


def test_bytes_travel_length_prefixed_and_reach_the_handler_as_text() -> None:
    raw = serialize_byte_tensor(np.array([b"caf\xc3\xa9", b""], dtype=object)).item()
    array = from_binary(WORDS, [2], raw)
    assert to_handler(WORDS, array) == ["café", ""]
    assert to_binary(WORDS, from_handler(WORDS, ["café", ""])) == raw
    with pytest.raises(TensorError, match="cut short"):
        from_binary(WORDS, [2], raw[:3])
    with pytest.raises(TensorError, match="not UTF-8"):
        to_handler(WORDS, from_binary(WORDS, [1], b"\x01\0\0\0\xff"))


def test_numbers_are_checked_against_their_type() -> None:
    assert from_json(COUNTS, [2, 2], [[1, 2], [3, 4]]).dtype == np.int32
    for data, message in (([1, 2, 3], "3 elements given"), ([1, 2, 3, 2**40], "does not fit INT32"),
                          ([1, 2, 3, 4.5], "whole numbers"), ([1, 2, 3, True], "are numbers")):
        with pytest.raises(TensorError, match=message):
            from_json(COUNTS, [2, 2], data)
    with pytest.raises(TensorError, match="takes 16"):
        from_binary(COUNTS, [2, 2], b"\0" * 12)
    with pytest.raises(TensorError, match=r"returned shape \[3\], the spec declares \[2, -1\]"):
        from_handler(COUNTS, [1, 2, 3])


@pytest.mark.parametrize(("datatype", "data", "message"), [
    ("FP32", [[1.5, True]], "are numbers"),                 # numpy alone would take True as 1.0
    ("FP16", [[1.0, 1e6]], "does not fit FP16"),
    ("FP32", [[1.0, 1e300]], "does not fit FP32"),
    ("UINT8", [[1, 256]], "does not fit UINT8"),
    ("UINT8", [[1, -1]], "does not fit UINT8"),
    ("INT64", [[1, 2**64]], "does not fit INT64"),
    ("FP32", [[1.0], [2.0, 3.0]], "3 elements given"),      # ragged
    ("FP32", [["1.0", 2.0]], "are numbers"),
    ("BOOL", [[True, 1]], "true or false"),
])
def test_json_numbers_read_by_numpy_are_refused_as_the_element_wise_reading_would(
        datatype: str, data: list, message: str) -> None:
    spec = TensorSpec(name="t", datatype=datatype, shape=[-1, -1])
    with pytest.raises(TensorError, match=message):
        from_json(spec, [1, 2], data)


def test_json_numbers_of_each_kind_become_the_declared_type() -> None:
    floats = from_json(TensorSpec(name="t", datatype="FP16", shape=[-1]), [3], [1, 2.5, -0.0])
    assert floats.dtype == np.float16 and floats.tolist() == [1.0, 2.5, -0.0]
    assert from_json(TensorSpec(name="t", datatype="UINT64", shape=[-1]), [1], [2**64 - 1]).tolist() == [2**64 - 1]
    assert from_json(TensorSpec(name="t", datatype="INT8", shape=[-1]), [2], [2.0, -128]).tolist() == [2, -128]
    assert from_json(TensorSpec(name="t", datatype="BOOL", shape=[-1, 1]), [2, 1], [True, False]).shape == (2, 1)


def test_rest_request_mixes_json_and_binary_inputs_and_answers_as_asked() -> None:
    counts = np.array([[1, 2], [3, 4]], dtype="<i4")
    header = json.dumps({"id": "a", "inputs": [
        {"name": "words", "datatype": "BYTES", "shape": [1], "data": ["hi"]},
        {"name": "counts", "datatype": "INT32", "shape": [2, 2], "parameters": {"binary_data_size": 16}}],
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}).encode()
    inference, choice = decode_request(MODEL, header + counts.tobytes(), str(len(header)))
    assert inference.id == "a" and inference.outputs == ["y"] and choice.is_binary("y")
    np.testing.assert_array_equal(inference.inputs["counts"], counts)
    assert to_handler(WORDS, inference.inputs["words"]) == ["hi"]

    y = from_handler(MODEL.spec.outputs[0], [0.5, 1.5])
    body, headers, media = encode_response(Result(model=MODEL, outputs=[(MODEL.spec.outputs[0], y)], id="a"), choice)
    size = int(headers["inference-header-content-length"])
    document = json.loads(body[:size])
    assert media == "application/octet-stream" and document["outputs"][0]["parameters"]["binary_data_size"] == 4
    np.testing.assert_array_equal(np.frombuffer(body[size:], dtype="<f2"), [0.5, 1.5])
    body, headers, media = encode_response(Result(model=MODEL, outputs=[(MODEL.spec.outputs[0], y)]), OutputChoice())
    assert media == "application/json" and json.loads(body)["outputs"][0]["data"] == [0.5, 1.5]


def test_grpc_typed_contents_are_accepted_like_raw_ones() -> None:
    request = service_pb2.ModelInferRequest(model_name="m")
    words = request.inputs.add(name="words", datatype="BYTES", shape=[2])
    words.contents.bytes_contents.extend([b"a", b"b"])
    counts = request.inputs.add(name="counts", datatype="INT32", shape=[2, 1])
    counts.contents.int_contents.extend([7, 8])
    inference = decode(MODEL, read_request(request.SerializeToString()))
    assert to_handler(WORDS, inference.inputs["words"]) == ["a", "b"]
    assert inference.inputs["counts"].tolist() == [[7], [8]] and inference.outputs is None
    request.raw_input_contents.append(b"\0")
    with pytest.raises(ProtocolError, match="raw_input_contents holds 1 tensors for 2 inputs"):
        decode(MODEL, read_request(request.SerializeToString()))


FLOATS = TensorSpec(name="x", datatype="FP32", shape=[-1, -1])


@pytest.mark.parametrize("raw", [np.array([1.0, np.nan], dtype="<f4").tobytes(),
                                 np.array([np.inf, 1.0], dtype="<f4").tobytes()])
def test_non_finite_binary_floats_are_refused_naming_the_input(raw: bytes) -> None:
    with pytest.raises(TensorError, match=r"input 'x': element \d is (nan|inf) \(finite numbers only\)"):
        from_binary(FLOATS, [1, 2], raw)


def test_non_finite_json_floats_and_outputs_are_refused() -> None:
    with pytest.raises(TensorError, match="input 'x': element 1 is inf"):
        from_json(FLOATS, [1, 2], [1.0, float("inf")])       # what a gRPC fp32_contents may carry
    with pytest.raises(TensorError, match="output 'x': element 0 is nan"):
        from_handler(FLOATS, [[float("nan")]])


@pytest.mark.parametrize("shape", [[0, 2**62], [2**31, 2], [0, 2**31 - 1, 2**31 - 1]])
def test_shapes_past_what_a_request_can_hold_are_refused(shape: list[int]) -> None:
    spec = TensorSpec(name="x", datatype="FP32", shape=[-1] * len(shape))
    with pytest.raises(TensorError, match="holds more than 2147483647 elements"):
        check_header(spec, "FP32", shape)
    body = json.dumps({"inputs": [{"name": "counts", "datatype": "INT32", "shape": [0, 2**62], "data": []}]})
    with pytest.raises(ProtocolError, match="holds more than"):
        decode_request(MODEL, body.encode(), None)


@pytest.mark.parametrize("datatype", ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
                                      "INT64", "FP16", "FP32", "FP64"])
def test_a_tensor_reaches_the_handler_and_comes_back_byte_exact(datatype: str) -> None:
    """Written for the handler straight from the array, read as the instance reads it, returned
    and checked as an output: the same bytes, extremes and the smallest floats included."""
    from dilu.spec import TensorSpec
    from gateway.v2.tensors import NUMPY_TYPES, handler_body

    dtype = NUMPY_TYPES[datatype]
    if dtype.kind == "f":
        info = np.finfo(dtype)
        values = [0.0, -0.0, 0.1, info.max, -info.max, info.tiny, info.smallest_subnormal, 1 / 3]
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        values = [info.min, info.max, 0, 1]
    else:
        values = [True, False]
    array = np.array(values, dtype=dtype).reshape(1, -1)
    spec = TensorSpec(name="x", datatype=datatype, shape=[-1, -1])
    received = json.loads(handler_body([(spec, array)]))["x"]
    assert from_handler(spec, received).tobytes() == array.tobytes()


@pytest.mark.parametrize("data", [[[1, [2]], [3, 4]], [[1, 2, 3, 4]], [[1], [2], [3], [4]], [[1, 2], [3], [4]],
                                  [[[1, 2]], [[3, 4]]]])
def test_nested_data_follows_the_shape_level_by_level(data: list) -> None:
    with pytest.raises(TensorError, match="does not follow shape"):
        from_json(COUNTS, [2, 2], data)


@pytest.mark.parametrize("spec", [COUNTS, TensorSpec(name="words", datatype="BYTES", shape=[2, -1])])
def test_flat_data_and_data_nested_as_the_shape_are_both_taken(spec: TensorSpec) -> None:
    element = "a" if spec.datatype == "BYTES" else 1
    nested, flat = [[element, element], [element, element]], [element] * 4
    assert from_json(spec, [2, 2], nested).shape == from_json(spec, [2, 2], flat).shape == (2, 2)
    with pytest.raises(TensorError, match="does not follow shape"):
        from_json(spec, [2, 2], [[element, [element]], [element, element]])
