"""OpenAI-compatible routes for text generators (functions with ``generates: text``).

``GET /v1/models``, ``POST /v1/completions`` and ``POST /v1/chat/completions`` (with or without
``stream``), so the official clients work with ``base_url="http://<gateway>/v1"`` and a Dilu
API key as their key. A request becomes one streamed invocation of the function named by
``model``, with ``{prompt, messages, max_new_tokens, temperature, stop}`` (chat messages are
also rendered into ``prompt``, ``role: content`` per line, for handlers without a template of
their own); each chunk's ``text`` is the next piece of the completion. Errors come in OpenAI's
shape (``{"error": {"message", "type", "param", "code"}}``).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from dilu.keys import Need, allows
from gateway.invocation import Invocation, Outcome
from gateway.services import GatewayServices
from gateway.streams import StreamError
from gateway.text_input import TextInputError, generation_input

router = APIRouter(prefix="/v1", tags=["OpenAI-compatible"])
NDJSON = "application/x-ndjson"
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 422: "invalid_request_error", 429: "rate_limit_error"}


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def response(self) -> JSONResponse:
        kind = ERROR_TYPES.get(self.status, "api_error" if self.status >= 500 else "invalid_request_error")
        return JSONResponse({"error": {"message": self.message, "type": kind, "param": self.param,
                                       "code": self.code}}, status_code=self.status)


def _generators(services: GatewayServices) -> list[str]:
    names = []
    for name in services.functions.names():
        entry = services.functions.get(name)
        if entry is not None and entry.spec.get("generates") == "text":
            names.append(name)
    return sorted(names)


async def _check_key(services: GatewayServices, request: Request, model: str | None) -> tuple[str, ...]:
    """The key's scopes, after checking it may invoke ``model`` (any valid key for None)."""
    header = request.headers.get("authorization")
    if model is not None:
        denied = await services.auth.check(header, Need.INVOKE, model)
    else:
        denied = await services.auth.check(header, Need.MODEL, None)
        if denied is not None and denied.status == 403:
            denied = None     # any valid key may list the models it can use
    if denied is not None:
        raise OpenAIError(denied.status, denied.message, code="invalid_api_key" if denied.status == 401 else None)
    return await services.auth.scopes(header)


@router.get("/models", include_in_schema=False)
async def list_models(request: Request) -> Response:
    services: GatewayServices = request.app.state.services
    try:
        scopes = await _check_key(services, request, None)
    except OpenAIError as exc:
        return exc.response()
    data = [{"id": name, "object": "model", "created": 0, "owned_by": "dilu"}
            for name in _generators(services) if allows(scopes, Need.INVOKE, name)]
    return JSONResponse({"object": "list", "data": data})


def _function_input(body: dict, chat: bool) -> dict[str, Any]:
    try:
        return generation_input(body, chat)
    except TextInputError as exc:
        raise OpenAIError(400, str(exc), param=exc.param) from None


async def _chunks(outcome: Outcome) -> AsyncIterator[dict[str, Any]]:
    """The function's chunks, read from its JSON-lines stream; an error line raises."""
    assert outcome.relay is not None
    try:
        async for chunk in outcome.relay.json_lines():
            yield chunk if isinstance(chunk, dict) else {"text": str(chunk)}
    except StreamError as exc:
        raise OpenAIError(exc.status, exc.message) from None


def _text(chunk: dict[str, Any]) -> str:
    text = chunk.get("text", "")
    return text if isinstance(text, str) else str(text)


async def _generate(request: Request, chat: bool) -> Response:
    services: GatewayServices = request.app.state.services
    try:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            raise OpenAIError(400, f"the request body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise OpenAIError(400, "the request body must be a JSON object")
        model = body.get("model")
        if not isinstance(model, str):
            raise OpenAIError(400, "model is required", param="model")
        await _check_key(services, request, model)
        if model not in _generators(services):
            await services.functions.refresh(model)
            if model not in _generators(services):
                raise OpenAIError(404, f"the model {model!r} does not exist or is not a text generator "
                                       "(generates: text in its spec)", param="model", code="model_not_found")
        payload = _function_input(body, chat)
        outcome = await services.invoker.invoke(Invocation.of_body(model, orjson.dumps(payload), accept=NDJSON))
        if outcome.relay is None:
            message = outcome.body.decode("utf-8", "replace")
            try:
                message = str(json.loads(message)["error"])
            except (ValueError, KeyError, TypeError):
                pass
            if outcome.status == 200:
                raise OpenAIError(500, f"{model} answered without streaming: a text generator streams its "
                                       "chunks (start() and step() in its handler)")
            raise OpenAIError(400 if outcome.status == 422 else outcome.status, message)
    except OpenAIError as exc:
        return exc.response()
    stream = body.get("stream") is True
    reply = _Reply(model, chat, payload["max_new_tokens"])
    if stream:
        return StreamingResponse(reply.events(_chunks(outcome)), media_type="text/event-stream",
                                 headers={"cache-control": "no-cache"})
    try:
        return JSONResponse(await reply.whole(_chunks(outcome)))
    except OpenAIError as exc:
        return exc.response()


class _Reply:
    """OpenAI's documents for one completion, from the function's chunks."""

    def __init__(self, model: str, chat: bool, max_tokens: int) -> None:
        self.model, self.chat, self.max_tokens = model, chat, max_tokens
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _document(self, choice: dict[str, Any], final: bool = False) -> dict[str, Any]:
        kind = ("chat.completion" if final else "chat.completion.chunk") if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": [choice]}

    def _finish(self, count: int) -> str:
        return "length" if count >= self.max_tokens else "stop"

    async def events(self, chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
        count = 0
        try:
            if self.chat:
                yield self._event(self._document({"index": 0, "delta": {"role": "assistant", "content": ""},
                                                  "finish_reason": None}))
            async for chunk in chunks:
                count += 1
                text = _text(chunk)
                choice = ({"index": 0, "delta": {"content": text}, "finish_reason": None} if self.chat else
                          {"index": 0, "text": text, "logprobs": None, "finish_reason": None})
                yield self._event(self._document(choice))
            last = ({"index": 0, "delta": {}, "finish_reason": self._finish(count)} if self.chat else
                    {"index": 0, "text": "", "logprobs": None, "finish_reason": self._finish(count)})
            yield self._event(self._document(last))
        except OpenAIError as exc:
            yield self._event({"error": {"message": exc.message, "type": ERROR_TYPES.get(exc.status, "api_error"),
                                         "param": None, "code": None}})
        yield b"data: [DONE]\n\n"

    @staticmethod
    def _event(document: dict[str, Any]) -> bytes:
        return b"data: " + orjson.dumps(document) + b"\n\n"

    async def whole(self, chunks: AsyncIterator[dict[str, Any]]) -> dict[str, Any]:
        texts = [_text(chunk) async for chunk in chunks]
        text, finish = "".join(texts), self._finish(len(texts))
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
                  if self.chat else {"index": 0, "text": text, "logprobs": None, "finish_reason": finish})
        document = self._document(choice, final=True)
        document["usage"] = {"prompt_tokens": 0, "completion_tokens": len(texts), "total_tokens": len(texts)}
        return document


@router.post("/completions", include_in_schema=False)
async def completions(request: Request) -> Response:
    return await _generate(request, chat=False)


@router.post("/chat/completions", include_in_schema=False)
async def chat_completions(request: Request) -> Response:
    return await _generate(request, chat=True)
