"""ModelInfer's messages read and written past protobuf's copies mean what protobuf says they mean."""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from gateway.v2.grpc_wire import MAX_FIELDS, SERVICE, InferResponse, method_handlers, read_request, write_response


def _request(*tensors: bytes) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="rowsums", model_version="1", id="req-7")
    request.parameters["priority"].int64_param = 3
    for position, _ in enumerate(tensors):
        request.inputs.add(name=f"x{position}", datatype="UINT8", shape=[1, 2])
    request.outputs.add(name="sums")
    request.raw_input_contents.extend(tensors)
    return request


def test_raw_inputs_are_views_of_the_received_bytes_and_the_rest_is_protobufs() -> None:
    big = np.arange(300_000, dtype=np.uint8).tobytes()   # a length that takes a 3-byte varint
    data = _request(b"\x01\x02", big, b"").SerializeToString()
    request = read_request(data)
    assert request.error is None
    assert [bytes(raw) for raw in request.raw] == [b"\x01\x02", big, b""]
    assert all(raw.obj is data for raw in request.raw)    # not copied
    message = request.message
    assert (message.model_name, message.model_version, message.id) == ("rowsums", "1", "req-7")
    assert message.parameters["priority"].int64_param == 3 and [t.name for t in message.inputs] == ["x0", "x1", "x2"]
    assert message.outputs[0].name == "sums" and len(message.raw_input_contents) == 0


def test_raw_inputs_are_found_wherever_they_lie_in_the_message() -> None:
    # protobuf may meet fields in any order: raw records before and between the others
    first = service_pb2.ModelInferRequest(raw_input_contents=[b"ab"]).SerializeToString()
    middle = service_pb2.ModelInferRequest(model_name="m").SerializeToString()
    last = service_pb2.ModelInferRequest(raw_input_contents=[b"cd"], id="i").SerializeToString()
    request = read_request(first + middle + last)
    assert [bytes(raw) for raw in request.raw] == [b"ab", b"cd"]
    assert (request.message.model_name, request.message.id) == ("m", "i")


@pytest.mark.parametrize("data, why", [
    (b"\x3a\x05ab", "runs past the message's end"),                 # raw record longer than the message
    (b"\x0a\x09ab", "runs past the message's end"),                 # a name longer than the message
    (b"\x0b", "wire type 3"),                                        # a group: not in this protocol
    (b"\x08" + b"\xff" * 11, "varint longer than 10 bytes"),
    (b"\x08\xff", "ends inside a field"),                              # a varint cut off
    (b"\x12\x02\xff\xfe", "not a ModelInferRequest"),                # model_version not UTF-8
])
def test_a_malformed_request_is_an_error_not_an_exception(data: bytes, why: str) -> None:
    request = read_request(data)
    assert request.error is not None and why in request.error and request.raw == []


def test_a_request_of_too_many_fields_is_refused_before_it_is_scanned_through() -> None:
    crowded = service_pb2.ModelInferRequest(outputs=[{"name": "y"}] * MAX_FIELDS).SerializeToString()
    assert read_request(crowded).error is None
    request = read_request(crowded + b"\x1a\x00" * 1_000_000)      # a million empty ids
    assert request.error == f"not a ModelInferRequest: more than {MAX_FIELDS} fields at its top level"


def test_a_response_reads_back_as_protobuf_wrote_it_with_its_raw_outputs() -> None:
    message = service_pb2.ModelInferResponse(model_name="rowsums", model_version="1", id="req-7")
    message.outputs.add(name="sums", datatype="FP32", shape=[2])
    message.outputs.add(name="big", datatype="UINT8", shape=[200_000])
    sums = np.array([1.5, 2.5], dtype="<f4")
    big = bytes(range(256)) * 782
    data = write_response(InferResponse(message, [memoryview(sums).cast("B"), big]))
    back = service_pb2.ModelInferResponse.FromString(data)
    assert back.model_name == "rowsums" and [o.name for o in back.outputs] == ["sums", "big"]
    assert list(back.raw_output_contents) == [sums.tobytes(), big]


def test_every_method_of_the_service_has_a_handler_of_its_kind() -> None:
    class Servicer:
        def __getattr__(self, name: str) -> object:
            return lambda request, context: None

    handlers = method_handlers(Servicer())
    assert set(handlers) == {method.name for method in SERVICE.methods}
    assert handlers["ModelStreamInfer"].request_streaming and handlers["ModelStreamInfer"].response_streaming
    assert not handlers["ModelInfer"].request_streaming and handlers["ModelInfer"].request_deserializer is read_request
    assert handlers["ServerLive"].request_deserializer == service_pb2.ServerLiveRequest.FromString
