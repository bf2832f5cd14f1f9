"""ModelInfer's messages read and written with their raw tensors left as bytes on the wire.

protobuf's parser copies every ``bytes`` field it reads into a message of its own, and reading a
repeated bytes field copies again into Python objects: for an [8, 150528] FP32 tensor that is
two 4.8 MB copies, each a fresh allocation the size of the tensor. Here the received message is
scanned once at its top level; the ``raw_input_contents`` records become views of the received
bytes, and only the rest (names, shapes, parameters: a few hundred bytes) goes to protobuf. A
response is serialized without its ``raw_output_contents``, which are then written behind it
as the field's records (protobuf reads fields in any order), so its tensors are copied once.

Every other method keeps protobuf's own (de)serializers: ``method_handlers`` builds the whole
service from its descriptor, with these two for ``ModelInfer`` and ``ModelStreamInfer``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

SERVICE = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
RAW_INPUTS = service_pb2.ModelInferRequest.DESCRIPTOR.fields_by_name["raw_input_contents"].number
RAW_OUTPUTS = service_pb2.ModelInferResponse.DESCRIPTOR.fields_by_name["raw_output_contents"].number
_LENGTH_DELIMITED = 2
# The scan runs in Python on the event loop: a bound on its work, far above what a request
# holds (each input, output, parameter and raw tensor is one top-level field).
MAX_FIELDS = 4096


@dataclass
class InferRequest:
    """A ModelInferRequest: ``message`` holds every field but the raw tensors, ``raw`` those, in
    order, as views of the bytes received; ``error`` says why the bytes are not a request."""

    message: Any
    raw: list[memoryview] = field(default_factory=list)
    error: str | None = None


@dataclass
class InferResponse:
    """A ModelInferResponse to send: ``message`` without its raw outputs, ``raw`` those in order."""

    message: Any
    raw: list[bytes | memoryview] = field(default_factory=list)


def _varint(data: bytes, position: int) -> tuple[int, int]:
    """(value, position after it) of the varint at ``position``; IndexError past the end."""
    value = shift = 0
    while shift < 70:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7
    raise ValueError("a varint longer than 10 bytes")


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _split(data: bytes) -> tuple[bytes, list[memoryview]]:
    """(the message's bytes without its raw input records, those records' contents as views)."""
    view = memoryview(data)
    kept: list[memoryview] = []
    raw: list[memoryview] = []
    position = start = 0
    end = len(data)
    fields = 0
    while position < end:
        fields += 1
        if fields > MAX_FIELDS:
            raise ValueError(f"more than {MAX_FIELDS} fields at its top level")
        tag_at = position
        tag, position = _varint(data, position)
        kind = tag & 7
        if kind == 0:
            _, position = _varint(data, position)
        elif kind == 1:
            position += 8
        elif kind == 5:
            position += 4
        elif kind == _LENGTH_DELIMITED:
            length, position = _varint(data, position)
            if tag >> 3 == RAW_INPUTS:
                if position + length > end:
                    raise ValueError("a raw_input_contents record runs past the message's end")
                kept.append(view[start:tag_at])
                raw.append(view[position:position + length])
                start = position + length
            position += length
        else:
            raise ValueError(f"wire type {kind} is not used by this message")
    if position != end:
        raise ValueError("the last field runs past the message's end")
    kept.append(view[start:end])
    return b"".join(kept), raw


def read_request(data: bytes) -> InferRequest:
    """The request in ``data``; never raises, so a malformed message is answered with a status
    naming what is wrong rather than gRPC's own "Exception deserializing request"."""
    try:
        rest, raw = _split(data)
        return InferRequest(service_pb2.ModelInferRequest.FromString(rest), raw)
    except IndexError:
        why = "the message ends inside a field"
    except (ValueError, DecodeError) as exc:
        why = str(exc)
    return InferRequest(service_pb2.ModelInferRequest(), error=f"not a ModelInferRequest: {why}")


def write_response(response: InferResponse) -> bytes:
    """The response's bytes: its message, then one record per raw output."""
    tag = _encode_varint(RAW_OUTPUTS << 3 | _LENGTH_DELIMITED)
    parts: list[bytes | memoryview] = [response.message.SerializeToString()]
    for blob in response.raw:
        parts += [tag, _encode_varint(blob.nbytes if isinstance(blob, memoryview) else len(blob)), blob]
    return b"".join(parts)


_READERS: dict[str, Callable[[bytes], Any]] = {"ModelInfer": read_request, "ModelStreamInfer": read_request}
_WRITERS: dict[str, Callable[[Any], bytes]] = {"ModelInfer": write_response}
_KINDS = {(False, False): grpc.unary_unary_rpc_method_handler, (False, True): grpc.unary_stream_rpc_method_handler,
          (True, False): grpc.stream_unary_rpc_method_handler, (True, True): grpc.stream_stream_rpc_method_handler}


def method_handlers(servicer: object) -> dict[str, grpc.RpcMethodHandler]:
    """Every method of the service, by name, served by ``servicer``'s method of that name."""
    handlers = {}
    for method in SERVICE.methods:
        request_type = getattr(service_pb2, method.input_type.name)
        response_type = getattr(service_pb2, method.output_type.name)
        handlers[method.name] = _KINDS[method.client_streaming, method.server_streaming](
            getattr(servicer, method.name),
            request_deserializer=_READERS.get(method.name, request_type.FromString),
            response_serializer=_WRITERS.get(method.name, response_type.SerializeToString))
    return handlers


def add_to_server(servicer: object, server: grpc.aio.Server) -> None:
    """Registers the service on ``server``, as the generated ``add_..._to_server`` does."""
    handlers = method_handlers(servicer)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE.full_name, handlers),))
    server.add_registered_method_handlers(SERVICE.full_name, handlers)
