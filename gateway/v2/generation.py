"""Streamed inference over the protocol: ``ModelStreamInfer``'s results, and text generators as models.

A function whose handler streams answers a stream request with one result per chunk (each
chunk is ``{output name: value}``); a function that does not stream answers it with its one
whole result, as Triton does for a model that is not decoupled.

A text generator (``generates: text``) that declares no tensors is served with the tensors of
Triton's LLM backends, so clients written for those work unchanged: inputs ``text_input``
(BYTES [1], the prompt), and optionally ``stream`` (BOOL [1]: a result per chunk; default
false, one result with the whole text) and ``sampling_parameters`` (BYTES [1], JSON:
``max_tokens``, ``temperature``, ``stop``; other keys are ignored) and
``exclude_input_in_output`` (accepted; the prompt is never repeated); output ``text_output``
(BYTES [1]).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import orjson
from pydantic import ValidationError

from dilu.instance_protocol import NOT_STREAMING_HEADER
from gateway.invocation import Invocation
from gateway.needs import StoredModels
from gateway.openai.protocol import CompletionRequest
from gateway.openai.text import RequestError, StopScanner, TextRequest
from gateway.openai.text import text_request as text_request_of
from gateway.streams import StreamError
from gateway.v2.classification import classify
from gateway.v2.inference import (
    TEXT_OUTPUT,
    Inference,
    Model,
    ProtocolError,
    Result,
    error_message,
    infer_tensors,
    outputs_of,
    request_body,
)

NDJSON = "application/x-ndjson"
SAMPLING_KEYS = ("max_tokens", "temperature", "top_p", "seed", "presence_penalty", "frequency_penalty", "stop")


def _one(array: np.ndarray, name: str) -> Any:
    if array.size != 1:
        raise ProtocolError(400, f"input {name!r} holds {array.size} elements: one per request")
    return array.reshape(-1)[0]


def _text_of(value: Any, name: str) -> str:
    try:
        return value.decode("utf-8") if isinstance(value, bytes) else str(value)
    except UnicodeDecodeError:
        raise ProtocolError(400, f"input {name!r} is not UTF-8 text") from None


def text_request(model: Model, request: Inference) -> tuple[TextRequest, bool]:
    """(what the generator receives and the platform enforces, whether a result per chunk is
    wanted) for a text request."""
    if "text_input" not in request.inputs:
        raise ProtocolError(400, "a text model needs the input 'text_input' (the prompt)")
    body: dict[str, Any] = {"model": model.name,
                            "prompt": _text_of(_one(request.inputs["text_input"], "text_input"), "text_input")}
    if "sampling_parameters" in request.inputs:
        text = _text_of(_one(request.inputs["sampling_parameters"], "sampling_parameters"), "sampling_parameters")
        try:
            sampling = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise ProtocolError(400, f"sampling_parameters is not JSON: {exc}") from None
        if not isinstance(sampling, dict):
            raise ProtocolError(400, "sampling_parameters must be a JSON object")
        body.update({key: sampling[key] for key in SAMPLING_KEYS if key in sampling})
    try:
        generation = text_request_of(CompletionRequest.model_validate(body), model.spec.handles)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ProtocolError(400, f"sampling_parameters: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    except RequestError as exc:
        raise ProtocolError(400, f"sampling_parameters: {exc}") from None
    stream = bool(_one(request.inputs["stream"], "stream")) if "stream" in request.inputs else False
    return generation, stream


def _text_result(model: Model, request: Inference, text: str) -> Result:
    array = np.empty(1, dtype=object)
    array[0] = text.encode("utf-8")
    return Result(model=model, outputs=[(TEXT_OUTPUT, array)], id=request.id)


async def _open(services: StoredModels, model: Model, body: bytes | memoryview, content_type: str = "",
                tensors: str | None = None) -> Any:
    """The relay of a stream request; None when the function does not stream."""
    kwargs = {"content_type": content_type, "tensors": tensors} if content_type else {}
    outcome = await services.invoker.invoke(Invocation.of_body(model.name, body, max_bytes=len(body),
                                                               accept=NDJSON, **kwargs))
    if outcome.relay is not None:
        return outcome.relay
    if outcome.status == 400 and outcome.headers.get(NOT_STREAMING_HEADER):
        return None
    if outcome.status == 200:
        raise ProtocolError(500, f"{model.name} answered a stream request without streaming")
    raise ProtocolError(outcome.status, error_message(outcome.body))


async def _text_chunks(services: StoredModels, model: Model, generation: TextRequest) -> AsyncIterator[str]:
    """The generated text as it comes, cut at the stop strings the platform enforces."""
    relay = await _open(services, model, orjson.dumps(generation.payload))
    if relay is None:
        raise ProtocolError(500, f"{model.name} is a text generator whose handler does not stream (start() and "
                                 "step())")
    scanner = StopScanner(generation.stop)
    try:
        async for chunk in relay.json_lines():
            text = chunk.get("text", "") if isinstance(chunk, dict) else chunk
            if piece := scanner.feed(text if isinstance(text, str) else str(text)):
                yield piece
            if scanner.stopped:
                break     # closing the relay ends the generation
        if rest := scanner.flush():
            yield rest
    except StreamError as exc:
        raise ProtocolError(exc.status, exc.message) from None
    finally:
        relay.close()


async def whole_text(services: StoredModels, model: Model, request: Inference) -> Result:
    """A text request answered once, with the whole generated text."""
    generation, _ = text_request(model, request)
    return _text_result(model, request, "".join([text async for text in _text_chunks(services, model, generation)]))


async def stream_results(services: StoredModels, model: Model, request: Inference) -> AsyncIterator[Result]:
    """The results of one stream request, as the function makes them."""
    if model.text:
        generation, stream = text_request(model, request)
        if not stream:
            yield await whole_text(services, model, request)
            return
        async for text in _text_chunks(services, model, generation):
            yield _text_result(model, request, text)
        return
    if request.outputs:
        for name in request.outputs:
            model.output(name)
    tensors, body, content_type = request_body(model, request)
    relay = await _open(services, model, body, content_type, tensors)
    if relay is None:   # not decoupled: its one whole result
        yield await infer_tensors(services, model, request)
        return
    try:
        async for chunk in relay.json_lines():
            yield Result(model=model, outputs=outputs_of(model, chunk, request.outputs), id=request.id)
    except StreamError as exc:
        raise ProtocolError(exc.status, exc.message) from None


async def infer(services: StoredModels, model: Model, request: Inference) -> Result:
    """One request answered once: a text generator's whole text, else the function's tensors."""
    if model.text:
        return await whole_text(services, model, request)
    result = await infer_tensors(services, model, request)
    return await classify(services, result, request.classify) if request.classify else result
