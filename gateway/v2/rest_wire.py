"""The REST form of an inference request and response, binary tensor data extension included (pure).

With the extension, a body is a JSON header of ``Inference-Header-Content-Length`` bytes followed
by the raw tensors, in the order of the inputs (or outputs) whose ``parameters`` carry
``binary_data_size``. Outputs are sent raw when the request asks (``binary_data`` per output, or
``binary_data_output`` for all); otherwise as JSON ``data``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from dilu.limits import LimitExceeded, check_json_depth, load_json_fast
from gateway.v2.classification import class_count
from gateway.v2.inference import Inference, Model, ProtocolError, Result
from gateway.v2.tensors import TensorError, check_header, from_binary, from_json, to_binary, to_json_data

HEADER_LENGTH = "inference-header-content-length"


@dataclass
class OutputChoice:
    """Which outputs go raw: each named one by its flag, the rest by the request's default."""

    default_binary: bool = False
    binary: dict[str, bool] = field(default_factory=dict)

    def is_binary(self, name: str) -> bool:
        return self.binary.get(name, self.default_binary)


def _split(body: bytes, header_length: str | None) -> tuple[bytes, memoryview]:
    if header_length is None:
        return body, memoryview(b"")
    if not header_length.strip().isdigit() or int(header_length) > len(body):
        raise ProtocolError(400, f"{HEADER_LENGTH} is {header_length!r}: it must be a size within the body "
                                 f"({len(body)} bytes)")
    size = int(header_length)
    return body[:size], memoryview(body)[size:]


def _object(value: Any, what: str) -> dict:
    if not isinstance(value, dict):
        raise ProtocolError(400, f"{what} must be an object")
    return value


def _flag(parameters: dict, name: str, what: str) -> bool | None:
    value = parameters.get(name)
    if value is not None and not isinstance(value, bool):
        raise ProtocolError(400, f"{what}: parameter {name!r} must be true or false")
    return value


def decode_request(model: Model, body: bytes, header_length: str | None) -> tuple[Inference, OutputChoice]:
    """The request's inputs (checked against the model) and how to send its outputs."""
    header, raw = _split(body, header_length)
    try:
        check_json_depth(header)
        document = load_json_fast(header)
    except (LimitExceeded, ValueError, RecursionError) as exc:
        raise ProtocolError(400, f"the inference request is not valid JSON: {exc}") from None
    document = _object(document, "the inference request")
    request_id = document.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise ProtocolError(400, "id must be a string")
    parameters = _object(document.get("parameters") or {}, "parameters")
    choice = OutputChoice(default_binary=bool(_flag(parameters, "binary_data_output", "parameters")))
    entries = document.get("inputs")
    if not isinstance(entries, list) or not entries:
        raise ProtocolError(400, "inputs must be a non-empty list of tensors")
    inputs, offset = {}, 0
    try:
        for position, entry in enumerate(entries):
            entry = _object(entry, f"inputs[{position}]")
            name = entry.get("name")
            if not isinstance(name, str):
                raise ProtocolError(400, f"inputs[{position}]: name must be a string")
            if name in inputs:
                raise ProtocolError(400, f"input {name!r} is given twice")
            spec = model.input(name)
            shape = check_header(spec, entry.get("datatype"), entry.get("shape"))
            size = _object(entry.get("parameters") or {}, f"input {name!r}: parameters").get("binary_data_size")
            if size is None:
                if "data" not in entry:
                    raise ProtocolError(400, f"input {name!r} has neither data nor binary_data_size")
                inputs[name] = from_json(spec, shape, entry["data"])
                continue
            if not isinstance(size, int) or isinstance(size, bool) or size < 0 or offset + size > len(raw):
                raise ProtocolError(400, f"input {name!r}: binary_data_size {size!r} does not fit the "
                                         f"{len(raw) - offset} binary bytes left in the body")
            inputs[name] = from_binary(spec, shape, raw[offset:offset + size], finite=not model.spec.arrays)
            offset += size
    except TensorError as exc:
        raise ProtocolError(400, str(exc)) from None
    if offset != len(raw):
        raise ProtocolError(400, f"the body has {len(raw) - offset} binary bytes that no input claims")
    wanted, classify = None, {}
    if document.get("outputs") is not None:
        if not isinstance(document["outputs"], list):
            raise ProtocolError(400, "outputs must be a list")
        wanted = []
        for position, entry in enumerate(document["outputs"]):
            entry = _object(entry, f"outputs[{position}]")
            name = entry.get("name")
            if not isinstance(name, str):
                raise ProtocolError(400, f"outputs[{position}]: name must be a string")
            model.output(name)
            wanted.append(name)
            parameters = _object(entry.get("parameters") or {}, f"output {name!r}: parameters")
            flag = _flag(parameters, "binary_data", f"output {name!r}")
            if flag is not None:
                choice.binary[name] = flag
            if "classification" in parameters:
                classify[name] = class_count(parameters["classification"], name)
    return Inference(inputs=inputs, outputs=wanted, id=request_id, classify=classify), choice


def encode_response(result: Result, choice: OutputChoice) -> tuple[bytes, dict[str, str], str]:
    """(body, headers, content type) of a successful inference."""
    outputs, blobs = [], []
    for spec, array in result.outputs:
        tensor: dict[str, Any] = {"name": spec.name, "datatype": spec.datatype, "shape": list(array.shape)}
        if choice.is_binary(spec.name):
            blob = to_binary(spec, array)
            tensor["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            try:
                tensor["data"] = to_json_data(spec, array)
            except TensorError as exc:
                raise ProtocolError(500, str(exc)) from None
        outputs.append(tensor)
    document: dict[str, Any] = {"model_name": result.model.name, "model_version": result.model.version,
                                "outputs": outputs}
    if result.id is not None:
        document["id"] = result.id
    try:
        header = json.dumps(document, allow_nan=False).encode()
    except ValueError:
        raise ProtocolError(500, "an output holds NaN or Infinity, which JSON cannot carry: ask for it as "
                                 "binary data (parameters.binary_data)") from None
    headers = dict(result.headers)
    if not blobs:
        return header, headers, "application/json"
    headers[HEADER_LENGTH] = str(len(header))
    return header + b"".join(blobs), headers, "application/octet-stream"
