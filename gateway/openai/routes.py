"""The OpenAI-compatible routes, thin: check the key (before the body is read: a bad key is a 401
whatever the body), read and check the request against its model, find the function, hand over
to the serving object. Every answer, errors included, is in OpenAI's shape, so the official
clients work with ``base_url="http://<gateway>/v1"`` and a Dilu API key as their key."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from dilu.keys import Need, allows
from dilu.limits import LimitExceeded, check_json_depth
from gateway.catalogue import FunctionEntry
from gateway.limits import BodyTooLarge, read_capped
from gateway.needs import GuardedModels
from gateway.openai import protocol
from gateway.openai.completions import Completion, OpenAIError
from gateway.openai.embeddings import embeddings
from gateway.openai.text import RequestError, text_request

router = APIRouter(prefix="/v1", tags=["OpenAI-compatible"])
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "invalid_request_error", 422: "invalid_request_error",
               429: "rate_limit_error"}
GENERATES = {"completions": "text", "embeddings": "embeddings"}


def error_document(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _answer(exc: OpenAIError) -> JSONResponse:
    return JSONResponse(error_document(exc.status, exc.message, exc.param, exc.code), status_code=exc.status)


async def _scopes(services: GuardedModels, request: Request, model: str | None = None) -> tuple[str, ...]:
    """The key's scopes once it is known valid (401 otherwise), and allowed to invoke ``model``
    when one is named (403 otherwise)."""
    header = request.headers.get("authorization")
    denied = await services.auth.check(header, Need.INVOKE if model else Need.MODEL, model)
    if denied is not None and (model is not None or denied.status == 401):
        raise OpenAIError(denied.status, denied.message, code="invalid_api_key" if denied.status == 401 else None)
    return await services.auth.scopes(header)


async def _read(request: Request, model: type[BaseModel], limit: int) -> Any:
    try:
        body = await read_capped(request.stream(), request.headers.get("content-length"), limit)
        check_json_depth(body)
        document = orjson.loads(body)
    except BodyTooLarge:
        raise OpenAIError(413, f"the request body is over the limit of {limit} bytes (DILU_MAX_REQUEST_BYTES)") \
            from None
    except LimitExceeded as exc:
        raise OpenAIError(400, f"the request body: {exc}") from None
    except (orjson.JSONDecodeError, ValueError, RecursionError) as exc:
        raise OpenAIError(400, f"the request body is not valid JSON: {exc}") from None
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise OpenAIError(400, f"{where or 'body'}: {first['msg']}", param=str(first["loc"][0]) if first["loc"]
                          else None) from None


async def _function(services: GuardedModels, name: str, generates: str) -> FunctionEntry:
    entry = services.functions.get(name)
    if entry is None:
        await services.functions.refresh(name)
        entry = services.functions.get(name)
    if entry is None or entry.model.generates != generates:
        kind = "a text generator (generates: text" if generates == "text" else "an encoder (generates: embeddings"
        raise OpenAIError(404, f"the model {name!r} does not exist or is not {kind} in its spec)", param="model",
                          code="model_not_found")
    return entry


def _doc(request_model: str, response_model: str, stream: bool = False) -> dict[str, Any]:
    """The OpenAPI entry of a route whose body is read by hand (so its errors keep OpenAI's shape)."""
    ok: dict[str, Any] = {"application/json": {"schema": {"$ref": f"#/components/schemas/{response_model}"}}}
    if stream:
        ok["text/event-stream"] = {"schema": {"type": "string"}}
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
    return {"openapi_extra": {"requestBody": {"required": True, "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{request_model}"}}}}},
            "responses": {200: {"description": "The answer (server-sent events when the request streams)",
                                "content": ok},
                          **{status: {"description": description, "content": error} for status, description in (
                              (400, "The request is malformed, or asks for what is not served"),
                              (401, "No valid API key"), (403, "The key may not use the model"),
                              (404, "No such model"), (413, "The body is over its limit"),
                              (429, "The model's queue is full"), (500, "The function failed"),
                              (502, "The instance failed"), (503, "The model cannot start, or the gateway stops"),
                              (504, "No instance in time"))}}}


@router.get("/models", response_model=protocol.ModelList,
            responses={401: {"description": "No valid API key", "model": protocol.ErrorResponse}})
async def list_models(request: Request) -> Response:
    """The text generators and encoders the key may use."""
    services: GuardedModels = request.app.state.services
    try:
        scopes = await _scopes(services, request)
    except OpenAIError as exc:
        return _answer(exc)
    data = []
    for name in sorted(services.functions.names()):
        entry = services.functions.get(name)
        if entry is not None and entry.model.generates and allows(scopes, Need.INVOKE, name):
            data.append({"id": name, "object": "model", "created": 0, "owned_by": "dilu"})
    return JSONResponse({"object": "list", "data": data})


async def _complete(request: Request, model: type[protocol.CompletionRequest | protocol.ChatCompletionRequest]
                    ) -> Response:
    services: GuardedModels = request.app.state.services
    try:
        await _scopes(services, request)
        body = await _read(request, model, services.settings.max_request_bytes)
        await _scopes(services, request, body.model)
        entry = await _function(services, body.model, "text")
        try:
            text = text_request(body, entry.model.handles)
        except RequestError as exc:
            raise OpenAIError(400, str(exc), param=exc.param) from None
        completion = await Completion.start(services.invoker, body, text)
    except OpenAIError as exc:
        return _answer(exc)
    if body.stream:
        return StreamingResponse(completion.events(), media_type="text/event-stream",
                                 headers={"cache-control": "no-cache"})
    try:
        return JSONResponse(await completion.document())
    except OpenAIError as exc:
        return _answer(exc)


@router.post("/completions", **_doc("CompletionRequest", "CompletionResponse", stream=True))
async def completions(request: Request) -> Response:
    """Completes a prompt with a text generator (``generates: text``)."""
    return await _complete(request, protocol.CompletionRequest)


@router.post("/chat/completions", **_doc("ChatCompletionRequest", "ChatCompletionResponse", stream=True))
async def chat_completions(request: Request) -> Response:
    """Answers a conversation with a text generator (``generates: text``)."""
    return await _complete(request, protocol.ChatCompletionRequest)


@router.post("/embeddings", **_doc("EmbeddingRequest", "EmbeddingResponse"))
async def create_embeddings(request: Request) -> Response:
    """Embeds texts with an encoder (``generates: embeddings``)."""
    services: GuardedModels = request.app.state.services
    try:
        await _scopes(services, request)
        body = await _read(request, protocol.EmbeddingRequest, services.settings.max_request_bytes)
        await _scopes(services, request, body.model)
        await _function(services, body.model, "embeddings")
        return JSONResponse(await embeddings(services.invoker, body))
    except OpenAIError as exc:
        return _answer(exc)


def add_schemas(openapi: dict[str, Any]) -> None:
    """Puts the request and response documents of these routes into the OpenAPI components."""
    components = openapi.setdefault("components", {}).setdefault("schemas", {})
    for model in (protocol.CompletionRequest, protocol.ChatCompletionRequest, protocol.EmbeddingRequest,
                  protocol.CompletionResponse, protocol.ChatCompletionResponse, protocol.EmbeddingResponse,
                  protocol.ErrorResponse):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for name, definition in schema.pop("$defs", {}).items():
            components.setdefault(name, definition)
        components.setdefault(model.__name__, schema)
