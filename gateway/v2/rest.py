"""The inference protocol's REST routes (``/v2/...``): health, server and model metadata,
readiness and inference, each model also under ``/versions/{version}``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from sqlalchemy import text

from dilu.spec import DATATYPES
from gateway.docs import AUTH_ERRORS, SECURED, errors
from gateway.errors import error_response
from gateway.limits import BodyTooLarge, read_capped
from gateway.needs import GuardedModels
from gateway.v2.generation import infer
from gateway.v2.inference import EXTENSIONS, NO_SHARED_MEMORY, SERVER_NAME, ProtocolError, find_model, not_served_reason
from gateway.v2.model_info import configuration, every_model_statistics, statistics
from gateway.v2.rest_wire import HEADER_LENGTH, decode_request, encode_response

router = APIRouter(prefix="/v2", tags=["inference protocol (v2)"])
VERSION = "0.1.0"


class ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class TensorMetadata(BaseModel):
    name: str
    datatype: Literal[DATATYPES]
    shape: list[int]


class ModelMetadata(BaseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class RequestTensor(BaseModel):
    name: str
    datatype: Literal[DATATYPES]
    shape: list[int]
    parameters: dict[str, Any] | None = Field(None, description="binary_data_size: the tensor's bytes follow "
                                                                "the JSON header (binary extension)")
    data: Any = Field(None, description="Elements, flat or nested in row-major order (absent when binary)")


class RequestedOutput(BaseModel):
    name: str
    parameters: dict[str, Any] | None = Field(None, description="binary_data: true sends it as raw bytes")


class InferenceRequest(BaseModel):
    id: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="binary_data_output: true sends every output "
                                                                "as raw bytes; others are ignored")
    inputs: list[RequestTensor]
    outputs: list[RequestedOutput] | None = None


class ResponseTensor(BaseModel):
    name: str
    datatype: Literal[DATATYPES]
    shape: list[int]
    parameters: dict[str, Any] | None = None
    data: list[Any] | None = None


class InferenceResponse(BaseModel):
    model_name: str
    model_version: str
    id: str | None = None
    outputs: list[ResponseTensor]


def _answer(exc: ProtocolError) -> JSONResponse:
    return error_response(exc.status, exc.message, {"retry-after": "1"} if exc.status == 429 else None)


@router.api_route("/systemsharedmemory{rest:path}", methods=["GET", "POST"], include_in_schema=False)
@router.api_route("/cudasharedmemory{rest:path}", methods=["GET", "POST"], include_in_schema=False)
def shared_memory(rest: str) -> JSONResponse:
    """The shared-memory extensions' routes: refused with the reason (docs/protocols.md)."""
    return error_response(400, NO_SHARED_MEMORY)


@router.get("", response_model=ServerMetadata)
def server_metadata() -> dict[str, Any]:
    """The server's name, version and protocol extensions (open, like the health routes)."""
    return {"name": SERVER_NAME, "version": VERSION, "extensions": EXTENSIONS}


@router.get("/health/live", response_class=Response,
            responses={200: {"description": "The gateway is serving (empty body)"}})
def live() -> Response:
    return Response(status_code=200)


@router.get("/health/ready", response_class=Response,
            responses={200: {"description": "The gateway serves and its database answers"},
                                        **errors(503)})
async def ready(request: Request) -> Response:
    def query() -> None:
        with request.app.state.services.sessions() as session:
            session.execute(text("SELECT 1"))

    try:
        await asyncio.to_thread(query)
    except Exception as exc:  # noqa: BLE001 - any failure means not ready
        return error_response(503, f"the database does not answer: {type(exc).__name__}")
    return Response(status_code=200)


_MODEL_ERRORS = {**errors(404), **AUTH_ERRORS}
_READY_ERRORS = {400: {**errors(400)[400], "description": "The model is not ready (deploying, profiling or failed)"},
                 **_MODEL_ERRORS}


@router.api_route("/repository{rest:path}", methods=["GET", "POST"], include_in_schema=False)
@router.api_route("/trace{rest:path}", methods=["GET", "POST"], include_in_schema=False)
@router.api_route("/logging", methods=["GET", "POST"], include_in_schema=False)
def not_served(request: Request, rest: str = "") -> JSONResponse:
    """Model repository control, tracing and log settings: refused with the reason (docs/protocols.md)."""
    return error_response(400, not_served_reason(request.url.path))


@router.get("/models/stats", dependencies=SECURED, responses=AUTH_ERRORS)
async def all_statistics(request: Request) -> Any:
    """Statistics of every model this gateway serves, in Triton's shape (this gateway's own)."""
    return {"model_stats": await every_model_statistics(request.app.state.services)}


@router.get("/models/{name}/stats", dependencies=SECURED, responses=_MODEL_ERRORS)
@router.get("/models/{name}/versions/{version}/stats", dependencies=SECURED, responses=_MODEL_ERRORS)
async def model_statistics(name: str, request: Request, version: str | None = None) -> Any:
    """A model's statistics in Triton's shape: counts and durations of what this gateway answered
    (success, fail, queue, compute input/infer/output, by batch size)."""
    services = request.app.state.services
    try:
        model = await find_model(services, name, version)
    except ProtocolError as exc:
        return _answer(exc)
    return {"model_stats": statistics(model, services.invoker.stats.of(model.name), version)}


@router.get("/models/{name}/config", dependencies=SECURED, responses=_MODEL_ERRORS)
@router.get("/models/{name}/versions/{version}/config", dependencies=SECURED, responses=_MODEL_ERRORS)
async def model_config(name: str, request: Request, version: str | None = None) -> Any:
    """A model's configuration in Triton's shape, derived from its spec."""
    try:
        model = await find_model(request.app.state.services, name, version)
    except ProtocolError as exc:
        return _answer(exc)
    return configuration(model)


@router.get("/models/{name}", response_model=ModelMetadata, dependencies=SECURED, responses=_MODEL_ERRORS)
@router.get("/models/{name}/versions/{version}", response_model=ModelMetadata, dependencies=SECURED,
            responses=_MODEL_ERRORS)
async def model_metadata(name: str, request: Request, version: str | None = None) -> Any:
    """A function that declares its tensors, as a model: its version and tensors."""
    try:
        model = await find_model(request.app.state.services, name, version)
    except ProtocolError as exc:
        return _answer(exc)
    return model.metadata()


@router.get("/models/{name}/ready", response_class=Response, dependencies=SECURED,
            responses={200: {"description": "Ready: requests are served (a scaled-to-zero model starts an "
                                            "instance)"}, **_READY_ERRORS})
@router.get("/models/{name}/versions/{version}/ready", response_class=Response, dependencies=SECURED,
            responses={200: {"description": "Ready"}, **_READY_ERRORS})
async def model_ready(name: str, request: Request, version: str | None = None) -> Response:
    try:
        model = await find_model(request.app.state.services, name, version)
    except ProtocolError as exc:
        return _answer(exc)
    if not model.ready:
        return error_response(400, f"model {name!r} is not ready (status {model.status})")
    return Response(status_code=200)


@dataclass
class Answer:
    """A finished response of the infer route."""

    status: int
    body: bytes
    headers: dict[str, str]
    media_type: str


def _error_answer(exc: ProtocolError) -> Answer:
    return Answer(exc.status, orjson.dumps({"error": exc.message}),
                  {"retry-after": "1"} if exc.status == 429 else {}, "application/json")


async def answer_infer(services: GuardedModels, name: str, version: str | None,
                       read_body: Callable[[int], Awaitable[bytes]], header_length: str | None) -> Answer:
    """One inference request, start to end: what both the documented route and the gateway's
    fast path (``gateway.fast_path``) answer. ``read_body(limit)`` raises ``BodyTooLarge``."""
    try:
        model = await find_model(services, name, version)
        limit = services.settings.max_request_bytes
        try:
            body = await read_body(limit)
        except BodyTooLarge:
            raise ProtocolError(413, f"request body exceeds the limit of {limit} bytes "
                                     "(DILU_MAX_REQUEST_BYTES)") from None
        inference, choice = decode_request(model, body, header_length)
        result = await infer(services, model, inference)
        content, headers, media_type = encode_response(result, choice)
    except ProtocolError as exc:
        return _error_answer(exc)
    return Answer(200, content, headers, media_type)


_INFER_DOC = {
    "requestBody": {"required": True, "description": "An inference request: JSON, or with the binary tensor "
                    "data extension a JSON header of Inference-Header-Content-Length bytes and the raw tensors",
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/InferenceRequest"}},
                                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}}
_INFER_RESPONSES = {
    200: {"description": "The outputs: JSON, or (when any output is asked for as binary) a JSON header of "
                         "Inference-Header-Content-Length bytes and the raw outputs",
          "content": {"application/json": {"schema": {"$ref": "#/components/schemas/InferenceResponse"}},
                      "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
    **errors(400, 404, 413, 429, 502, 503, 504), **AUTH_ERRORS,
    422: {**errors(422)[422], "description": "The handler refused the input (dilu.InputError)"},
    500: {**errors(422)[422], "description": "The handler failed, or its outputs do not match the spec"}}


@router.post("/models/{name}/infer", dependencies=SECURED, responses=_INFER_RESPONSES, openapi_extra=_INFER_DOC)
@router.post("/models/{name}/versions/{version}/infer", dependencies=SECURED, responses=_INFER_RESPONSES,
             openapi_extra=_INFER_DOC)
async def model_infer(name: str, request: Request, version: str | None = None) -> Response:
    """One inference through Dilu's queue, batching and scaling, like ``/v1/functions/{name}/invoke``.

    (Served by gateway.fast_path in the running gateway; this route documents it and backs it up.)
    """
    answer = await answer_infer(
        request.app.state.services, name, version,
        lambda limit: read_capped(request.stream(), request.headers.get("content-length"), limit),
        request.headers.get(HEADER_LENGTH))
    return Response(answer.body, status_code=answer.status, headers=answer.headers, media_type=answer.media_type)


def add_schemas(openapi: dict[str, Any]) -> None:
    """Puts the request and response documents the infer routes refer to into the components."""
    components = openapi.setdefault("components", {}).setdefault("schemas", {})
    for model in (InferenceRequest, InferenceResponse):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for name, definition in schema.pop("$defs", {}).items():
            components.setdefault(name, definition)
        components.setdefault(model.__name__, schema)
