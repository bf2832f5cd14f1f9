"""What both transports of the inference protocol (REST and gRPC) share: finding the model and
running one inference through Dilu's own invoke path.

A v2 request becomes one ordinary invocation handed to the gateway's ``Invoker`` (``{input name: nested
list}`` as JSON, or for a function that takes arrays the tensors' own bytes in a frame), so it
waits in the same cold-start queue, is batched with Dilu's own requests, counts for scaling and
shows in the same metrics. Models are functions that declare
their tensors; a model's only version is the function's current version.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from dilu import tensor_frames as frames
from dilu.messages import FunctionStatus
from dilu.spec import SpecModel, TensorSpec
from gateway.catalogue import FunctionEntry
from gateway.invocation import JSON, Invocation
from gateway.needs import Models
from gateway.v2.tensors import TensorError, from_handler, handler_body

SERVER_NAME = "dilu"
NO_SHARED_MEMORY = ("shared memory is not served: a model's instances run apart from the gateway (another "
                    "process, container or host), so a region here would save no copy, and a region named by "
                    "the caller could be another tenant's; send the tensors as binary data")
EXTENSIONS = ["binary_tensor_data", "classification", "statistics", "model_configuration"]
NOT_SERVED = {
    "repository": "model repository control is not served: a model is a function, deployed with `dilu deploy` "
                  "(or POST /v1/functions), loaded on demand and scaled by the platform",
    "trace": "tracing is not served: each answer carries x-dilu-latency-ms and x-dilu-queued-ms, and /metrics "
             "the gateway's histograms",
    "logging": "log settings are not served: `dilu logs NAME` shows a function's instance logs",
    "sequence": "sequence batching (stateful models) is not served: a function's instances keep no state between "
                "requests that the platform routes to them",
}


def not_served_reason(path: str) -> str:
    """Why a part of Triton's protocol that Dilu does not serve is refused (docs/protocols.md)."""
    for key, reason in NOT_SERVED.items():
        if f"/{key}" in path:
            return reason
    return NOT_SERVED["repository"]


@dataclass
class ProtocolError(Exception):
    """A request the protocol answers with an error: HTTP status and message."""

    status: int
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Model:
    name: str
    version: str
    status: str
    spec: SpecModel   # a text generator's carries the text tensors (gateway.v2.generation)
    text: bool = False   # a text generator without tensors of its own: text_input in, text_output out

    def input(self, name: str) -> TensorSpec:
        return self._tensor("input", self.spec.inputs, name)

    def output(self, name: str) -> TensorSpec:
        return self._tensor("output", self.spec.outputs, name)

    def _tensor(self, kind: str, declared: list[TensorSpec], name: str) -> TensorSpec:
        for tensor in declared:
            if tensor.name == name:
                return tensor
        raise ProtocolError(400, f"model {self.name!r} has no {kind} {name!r} (its {kind}s: "
                                 f"{', '.join(t.name for t in declared)})")

    @property
    def ready(self) -> bool:
        # A function scaled to zero is still ready: a request starts an instance.
        return self.status == FunctionStatus.READY

    def metadata(self) -> dict[str, Any]:
        def tensors(items: list[TensorSpec]) -> list[dict[str, Any]]:
            return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in items]

        return {"name": self.name, "versions": [self.version], "platform": SERVER_NAME,
                "inputs": tensors(self.spec.inputs), "outputs": tensors(self.spec.outputs)}


@dataclass
class Inference:
    """One request, decoded: inputs by name and the outputs asked for (None: all)."""

    inputs: dict[str, np.ndarray]
    outputs: list[str] | None = None
    id: str | None = None
    classify: dict[str, int] = field(default_factory=dict)   # output -> its top classes wanted


@dataclass
class Result:
    model: Model
    outputs: list[tuple[TensorSpec, np.ndarray]]
    id: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


# A text generator that declares no tensors has those of Triton's LLM backends (gateway.v2.generation).
TEXT_INPUTS = [TensorSpec(name="text_input", datatype="BYTES", shape=[1]),
               TensorSpec(name="stream", datatype="BOOL", shape=[1]),
               TensorSpec(name="sampling_parameters", datatype="BYTES", shape=[1]),
               TensorSpec(name="exclude_input_in_output", datatype="BOOL", shape=[1])]
TEXT_OUTPUT = TensorSpec(name="text_output", datatype="BYTES", shape=[1])


def with_text_tensors(spec: SpecModel) -> SpecModel:
    """A text generator's spec as the protocol sees it: the text tensors declared."""
    return spec.model_copy(update={"inputs": TEXT_INPUTS, "outputs": [TEXT_OUTPUT]})


async def find_model(services: Models, name: str, version: str | None = None) -> Model:
    """The model ``name`` (at ``version``, when given), or a 404 naming what is missing."""
    entry: FunctionEntry | None = services.functions.get(name)
    if entry is None:
        await services.functions.refresh(name)
        entry = services.functions.get(name)
    if entry is None:
        raise ProtocolError(404, f"Request for unknown model: {name!r} is not found")
    spec, text = entry.model, False
    if not spec.serves_v2 and spec.generates == "text":
        spec, text = with_text_tensors(spec), True
    if not spec.serves_v2:
        raise ProtocolError(404, f"function {name!r} does not declare its tensors (inputs and outputs in its "
                                 "spec), so it is not served over the inference protocol")
    if version not in (None, "", str(entry.version)):
        raise ProtocolError(404, f"Request for unknown model: {name!r} version {version} is not found (it serves "
                                 f"version {entry.version})")
    return Model(name=name, version=str(entry.version), status=entry.status, spec=spec, text=text)


def error_message(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"])
    except (ValueError, KeyError, TypeError):
        return body.decode("utf-8", errors="replace")[:500]


def _result(body: bytes, content_type: str, tensors: str | None) -> Any:
    """The handler's answer: arrays over the frame's bytes, or JSON read in C (by the standard
    parser where orjson refuses it: a NaN the output check then names)."""
    if content_type == frames.MEDIA_TYPE:
        return {tensor.name: tensor.array for tensor in frames.decode(tensors, body)}
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return json.loads(body)


def request_body(model: Model, request: Inference) -> tuple[str | None, bytes | memoryview, str]:
    """(frame header, body, content type) of the invocation a v2 request becomes."""
    declared = {t.name for t in model.spec.inputs}
    for name in request.inputs:
        model.input(name)
    missing = declared - request.inputs.keys()
    if missing:
        raise ProtocolError(400, f"model {model.name!r} needs the input(s) {', '.join(sorted(missing))}")
    ordered = [(t, request.inputs[t.name]) for t in model.spec.inputs]
    try:
        if model.spec.arrays:
            tensors, body = frames.encode(frames.Tensor(t.name, t.datatype, array) for t, array in ordered)
            return tensors, body, frames.MEDIA_TYPE
        return None, handler_body(ordered), JSON
    except TensorError as exc:
        raise ProtocolError(400, str(exc)) from None


def outputs_of(model: Model, produced: Any, wanted: list[str] | None) -> list[tuple[TensorSpec, np.ndarray]]:
    """The outputs asked for (all when None), in that order, from what the handler returned."""
    if not isinstance(produced, dict):
        raise ProtocolError(500, f"the handler of {model.name!r} returned {type(produced).__name__}, not an "
                                 "object of outputs by name")
    outputs = []
    for tensor in [model.output(name) for name in wanted] if wanted else list(model.spec.outputs):
        if tensor.name not in produced:
            raise ProtocolError(500, f"the handler of {model.name!r} returned no output {tensor.name!r}")
        try:
            outputs.append((tensor, from_handler(tensor, produced[tensor.name], finite=not model.spec.arrays)))
        except TensorError as exc:
            raise ProtocolError(500, str(exc)) from None
    return outputs


async def infer_tensors(services: Models, model: Model, request: Inference) -> Result:
    """Runs ``request`` on ``model`` through Dilu's invoke path; outputs in the order asked for."""
    if request.outputs:
        for name in request.outputs:
            model.output(name)
    tensors, body, content_type = request_body(model, request)
    # The body was bounded on the wire; its JSON form may be larger (numbers as text).
    outcome = await services.invoker.invoke(Invocation.of_body(model.name, body, max_bytes=len(body),
                                                               content_type=content_type, tensors=tensors))
    if outcome.status != 200:
        raise ProtocolError(outcome.status, error_message(outcome.body))
    try:
        produced = _result(outcome.body, outcome.content_type, outcome.tensors)
    except frames.FrameError as exc:
        raise ProtocolError(500, f"the instance's answer is malformed: {exc}") from None
    except ValueError:
        raise ProtocolError(500, "the handler's result is not JSON") from None
    return Result(model=model, outputs=outputs_of(model, produced, request.outputs), id=request.id,
                  headers=outcome.headers)
