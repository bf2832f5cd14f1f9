"""Completions and chat completions: each of the request's ``n`` choices is one streamed
invocation of the text generator, read chunk by chunk (``{text, usage?, finish_reason?}``).

Usage is the handler's: the last ``usage`` (``{prompt_tokens, completion_tokens}``) its chunks
carried; a handler that reports none has its chunks counted as completion tokens and 0 prompt
tokens. The platform cuts the text at the request's stop strings (unless the handler handles
them) and ends the generation there; ``finish_reason`` is ``stop`` then, or the handler's, or
``length`` when the request's ``max_tokens`` was reached.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson

from gateway.invocation import Invocation, Invoker
from gateway.openai.protocol import ChatCompletionRequest, CompletionRequest
from gateway.openai.text import StopScanner, TextRequest
from gateway.streams import Relay, StreamError

NDJSON = "application/x-ndjson"


class OpenAIError(Exception):
    """An answer in OpenAI's error shape: status, message, and the ``param`` at fault."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


class _Choice:
    """One generation: its text as it comes, cut at a stop string, with its usage."""

    def __init__(self, index: int, relay: Relay, stops: list[str], max_tokens: int | None) -> None:
        self.index, self._relay, self._max_tokens = index, relay, max_tokens
        self._scanner = StopScanner(stops)
        self.chunks, self.usage, self._finish = 0, None, None

    async def pieces(self) -> AsyncIterator[str]:
        try:
            async for chunk in self._relay.json_lines():
                chunk = chunk if isinstance(chunk, dict) else {"text": chunk}
                self.chunks += 1
                if isinstance(chunk.get("usage"), dict):
                    self.usage = chunk["usage"]
                if chunk.get("finish_reason") in ("stop", "length"):
                    self._finish = chunk["finish_reason"]
                text = chunk.get("text", "")
                piece = self._scanner.feed(text if isinstance(text, str) else str(text))
                if piece:
                    yield piece
                if self._scanner.stopped:
                    break      # the rest is not wanted: closing the relay ends the generation
            if rest := self._scanner.flush():
                yield rest
        except StreamError as exc:
            raise OpenAIError(exc.status, exc.message) from None
        finally:
            self._relay.close()

    def close(self) -> None:
        self._relay.close()

    def completion_tokens(self) -> int:
        reported = (self.usage or {}).get("completion_tokens")
        return reported if isinstance(reported, int) and reported >= 0 else self.chunks

    def prompt_tokens(self) -> int:
        reported = (self.usage or {}).get("prompt_tokens")
        return reported if isinstance(reported, int) and reported >= 0 else 0

    def finish_reason(self) -> str:
        if self._scanner.stopped:
            return "stop"
        if self._finish is not None:
            return self._finish
        limit = self._max_tokens
        return "length" if limit is not None and self.completion_tokens() >= limit else "stop"


async def _open(invoker: Invoker, model: str, text: TextRequest, count: int) -> list[_Choice]:
    """The ``count`` generations, all started (none left open when one cannot start)."""
    body = orjson.dumps(text.payload)
    outcomes = await asyncio.gather(*(invoker.invoke(Invocation.of_body(model, body, accept=NDJSON))
                                      for _ in range(count)))
    failed = next((outcome for outcome in outcomes if outcome.relay is None), None)
    if failed is not None:
        for outcome in outcomes:
            if outcome.relay is not None:
                outcome.relay.close()
        if failed.status == 200:
            raise OpenAIError(500, f"{model} answered without streaming: a text generator streams its chunks "
                                   "(start() and step() in its handler)")
        raise OpenAIError(400 if failed.status == 422 else failed.status, failed.error())
    return [_Choice(i, outcome.relay, text.stop, text.max_tokens) for i, outcome in enumerate(outcomes)
            if outcome.relay is not None]


def _usage(choices: list[_Choice]) -> dict[str, int]:
    prompt = max(choice.prompt_tokens() for choice in choices)
    completion = sum(choice.completion_tokens() for choice in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class Completion:
    """One request's answer, whole (``document``) or as server-sent events (``events``)."""

    def __init__(self, request: CompletionRequest | ChatCompletionRequest, text: TextRequest,
                 choices: list[_Choice]) -> None:
        self.chat = isinstance(request, ChatCompletionRequest)
        self.model, self._choices = request.model, choices
        self._echo = text.payload["prompt"] if isinstance(request, CompletionRequest) and request.echo else ""
        self._usage_in_stream = bool(request.stream_options and request.stream_options.include_usage)
        self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    @classmethod
    async def start(cls, invoker: Invoker, request: CompletionRequest | ChatCompletionRequest,
                    text: TextRequest) -> Completion:
        return cls(request, text, await _open(invoker, request.model, text, request.n))

    def close(self) -> None:
        for choice in self._choices:
            choice.close()

    def _document(self, choices: list[dict[str, Any]], final: bool) -> dict[str, Any]:
        kind = ("chat.completion" if final else "chat.completion.chunk") if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}

    def _choice(self, index: int, text: str | None, finish: str | None, whole: bool = False) -> dict[str, Any]:
        if not self.chat:
            return {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish}
        if whole:
            return {"index": index, "message": {"role": "assistant", "content": text or ""}, "finish_reason": finish}
        return {"index": index, "delta": {} if text is None else {"content": text}, "finish_reason": finish}

    async def document(self) -> dict[str, Any]:
        async def whole(choice: _Choice) -> str:
            return self._echo + "".join([piece async for piece in choice.pieces()])

        try:
            texts = await asyncio.gather(*(whole(choice) for choice in self._choices))
        finally:
            self.close()
        document = self._document([self._choice(c.index, t, c.finish_reason(), whole=True)
                                   for c, t in zip(self._choices, texts, strict=True)], final=True)
        document["usage"] = _usage(self._choices)
        return document

    async def events(self) -> AsyncIterator[bytes]:
        queue: asyncio.Queue[tuple[_Choice, str | None] | OpenAIError] = asyncio.Queue()

        async def relay(choice: _Choice) -> None:
            try:
                async for piece in choice.pieces():
                    await queue.put((choice, piece))
                await queue.put((choice, None))
            except OpenAIError as exc:
                await queue.put(exc)

        tasks = [asyncio.create_task(relay(choice)) for choice in self._choices]
        try:
            for choice in self._choices:
                first = {"role": "assistant", "content": ""} if self.chat else None
                if first or self._echo:
                    start = self._choice(choice.index, self._echo, None)
                    if self.chat:
                        start["delta"] = first
                    yield _event(self._document([start], final=False))
            running = len(tasks)
            while running:
                item = await queue.get()
                if isinstance(item, OpenAIError):
                    yield _event({"error": {"message": item.message, "type": "api_error" if item.status >= 500
                                            else "invalid_request_error", "param": None, "code": None}})
                    break
                choice, piece = item
                if piece is None:
                    running -= 1
                    yield _event(self._document([self._choice(choice.index, None, choice.finish_reason())], False))
                else:
                    yield _event(self._document([self._choice(choice.index, piece, None)], False))
            else:
                if self._usage_in_stream:
                    usage = self._document([], final=False)
                    usage["usage"] = _usage(self._choices)
                    yield _event(usage)
            yield b"data: [DONE]\n\n"
        finally:
            for task in tasks:
                task.cancel()
            self.close()


def _event(document: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(document) + b"\n\n"
