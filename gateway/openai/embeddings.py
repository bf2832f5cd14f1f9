"""Embeddings: each input text is one invocation of the encoder (``generates: embeddings``),
which answers ``{embedding: [float], tokens: int}``; the requests of one call run side by side,
so the instance batches them."""

from __future__ import annotations

import asyncio
import base64
import struct
from typing import Any

import orjson

from gateway.invocation import Invocation, Invoker
from gateway.openai.completions import OpenAIError
from gateway.openai.protocol import MAX_EMBEDDING_INPUTS, MAX_PROMPT_CHARS, EmbeddingRequest

AT_ONCE = 64     # invocations of one call in flight at once


def _texts(request: EmbeddingRequest) -> list[str]:
    texts = [request.input] if isinstance(request.input, str) else request.input
    if not texts or len(texts) > MAX_EMBEDDING_INPUTS:
        raise OpenAIError(400, f"input: from 1 to {MAX_EMBEDDING_INPUTS} texts", param="input")
    if any(len(text) > MAX_PROMPT_CHARS for text in texts):
        raise OpenAIError(400, f"input: a text is longer than {MAX_PROMPT_CHARS} characters", param="input")
    return texts


def _vector(answer: Any, model: str) -> tuple[list[float], int]:
    if not isinstance(answer, dict) or not isinstance(answer.get("embedding"), list) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in answer["embedding"]):
        raise OpenAIError(500, f"{model} answered no {{embedding: [numbers], tokens}}: not an encoder's answer")
    tokens = answer.get("tokens")
    return [float(v) for v in answer["embedding"]], tokens if isinstance(tokens, int) and tokens >= 0 else 0


async def embeddings(invoker: Invoker, request: EmbeddingRequest) -> dict[str, Any]:
    texts, slots = _texts(request), asyncio.Semaphore(AT_ONCE)

    async def one(text: str) -> tuple[list[float], int]:
        async with slots:
            outcome = await invoker.invoke(Invocation.of_body(request.model, orjson.dumps({"text": text})))
        if outcome.status != 200:
            raise OpenAIError(400 if outcome.status == 422 else outcome.status, outcome.error())
        try:
            return _vector(orjson.loads(outcome.body), request.model)
        except orjson.JSONDecodeError:
            raise OpenAIError(500, f"{request.model} answered something that is not JSON") from None

    vectors = await asyncio.gather(*(one(text) for text in texts))
    if request.dimensions is not None and any(len(vector) != request.dimensions for vector, _ in vectors):
        raise OpenAIError(400, f"dimensions: {request.model} makes embeddings of {len(vectors[0][0])} "
                               "dimensions only", param="dimensions")
    data = []
    for index, (vector, _) in enumerate(vectors):
        encoded: list[float] | str = vector
        if request.encoding_format == "base64":
            encoded = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"object": "embedding", "index": index, "embedding": encoded})
    tokens = sum(count for _, count in vectors)
    return {"object": "list", "data": data, "model": request.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
