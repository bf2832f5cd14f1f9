"""What a text generator receives for a request in OpenAI's terms, and the stop strings the
platform enforces for it (pure).

The handler receives ``{prompt, max_new_tokens?, temperature?, top_p?, seed?, presence_penalty?,
frequency_penalty?}``, each sampling parameter only when the request set it (the handler's own
default otherwise: ``max_new_tokens`` absent means as many as its context allows), chat
``messages`` as ``{role, content}`` text besides the rendered ``prompt``, and ``stop``, ``tools``,
``tool_choice`` and ``response_format`` only when its spec says it ``handles`` them. A handler
refuses what it cannot honour (``dilu.InputError``: a 400 naming it). What the platform does not
serve at all is refused here, never ignored.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from gateway.openai.protocol import MAX_PROMPT_CHARS, MAX_STOPS, ChatCompletionRequest, CompletionRequest

SAMPLING = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty")


class RequestError(ValueError):
    """A field of a request is wrong or not served; ``param`` names it."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass
class TextRequest:
    payload: dict[str, Any]        # what the handler receives
    stop: list[str]                # stop strings the platform enforces (none when the handler does)
    max_tokens: int | None         # the request's bound on new tokens, when it set one


def _stops(value: str | list[str] | None) -> list[str]:
    stops = [value] if isinstance(value, str) else list(value or [])
    if len(stops) > MAX_STOPS or any(len(stop) > 256 for stop in stops):
        raise RequestError(f"stop must be a string or a list of at most {MAX_STOPS} strings of at most 256 "
                           "characters", param="stop")
    return [stop for stop in stops if stop]


def _content(message: Any, position: int) -> str:
    content = message.content
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for part in content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise RequestError(f"messages[{position}].content: only text parts ({{type: text, text}}) are served, "
                               f"not {str(part.get('type'))[:40]!r}", param="messages")
        texts.append(part["text"])
    return "".join(texts)


def _refuse_unserved(request: CompletionRequest | ChatCompletionRequest, handles: Collection[str]) -> None:
    if isinstance(request, CompletionRequest):
        return      # logprobs, logit_bias, best_of and suffix: their models admit only what is served
    if (request.tools or request.tool_choice not in (None, "none")) and "tools" not in handles:
        raise RequestError(f"tools are not served by {request.model!r}: its handler does not handle them "
                           "(handles: [tools] in its spec)", param="tools")
    kind = (request.response_format or {}).get("type", "text")
    if kind != "text" and "response_format" not in handles:
        raise RequestError(f"response_format {str(kind)[:40]!r} is not served by {request.model!r}: its handler "
                           "does not handle it (handles: [response_format] in its spec)", param="response_format")


def text_request(request: CompletionRequest | ChatCompletionRequest, handles: Collection[str] = ()) -> TextRequest:
    """The handler's input for ``request`` (checked by its model) and what the platform enforces."""
    _refuse_unserved(request, handles)
    payload: dict[str, Any] = {}
    if isinstance(request, ChatCompletionRequest):
        messages = [{"role": m.role, "content": _content(m, i)} for i, m in enumerate(request.messages)]
        payload["messages"] = messages
        payload["prompt"] = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
        max_tokens = request.max_completion_tokens or request.max_tokens
        for name, feature in (("tools", "tools"), ("tool_choice", "tools"), ("response_format", "response_format")):
            if getattr(request, name) is not None and feature in handles:
                payload[name] = getattr(request, name)
    else:
        prompt = request.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise RequestError("prompt: one prompt per request (n makes several completions of it)",
                                   param="prompt")
            prompt = prompt[0]
        payload["prompt"] = prompt
        max_tokens = request.max_tokens
    if len(payload["prompt"]) > MAX_PROMPT_CHARS:
        raise RequestError(f"the prompt is longer than {MAX_PROMPT_CHARS} characters", param="prompt")
    if max_tokens is not None:
        payload["max_new_tokens"] = max_tokens
    payload.update({name: getattr(request, name) for name in SAMPLING if getattr(request, name) is not None})
    stops = _stops(request.stop)
    if "stop" in handles:
        if stops:
            payload["stop"] = stops
        stops = []
    return TextRequest(payload=payload, stop=stops, max_tokens=max_tokens)


class StopScanner:
    """Cuts a stream of text at the first of its stop strings: ``feed`` returns what may be sent
    (holding back an end that could begin a stop string), ``stopped`` turns true at a stop, and
    ``flush`` returns what was held back once the text ends without one."""

    def __init__(self, stops: list[str]) -> None:
        self._stops = [stop for stop in stops if stop]
        self._held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        if not self._stops:
            return text
        buffer = self._held + text
        found = [(index, stop) for stop in self._stops if (index := buffer.find(stop)) >= 0]
        if found:
            self.stopped, self._held = True, ""
            return buffer[:min(found)[0]]
        keep = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(buffer)), keep, -1):
                if buffer.endswith(stop[:size]):
                    keep = size
                    break
        self._held = buffer[len(buffer) - keep:] if keep else ""
        return buffer[:len(buffer) - keep]

    def flush(self) -> str:
        held, self._held = self._held, ""
        return "" if self.stopped else held
