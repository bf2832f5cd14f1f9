"""What a text generator (``generates: text``) receives: ``{prompt, messages, max_new_tokens,
temperature, stop}``, built from a request in OpenAI's terms, for the OpenAI routes and the
inference protocol's text models alike."""

from __future__ import annotations

from typing import Any

DEFAULT_MAX_TOKENS = 16
MAX_PROMPT_CHARS = 1_000_000


class TextInputError(ValueError):
    """A field of a generation request is wrong; ``param`` names it."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _number(body: dict, name: str, default: Any, low: float, high: float, whole: bool = False) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (whole and not isinstance(value, int)):
        raise TextInputError(f"{name} must be a {'whole ' if whole else ''}number", param=name)
    if not low <= value <= high:
        raise TextInputError(f"{name} must be between {low:g} and {high:g}", param=name)
    return value


def generation_input(body: dict, chat: bool) -> dict[str, Any]:
    """What a text generator receives for a request in OpenAI's terms (``prompt`` or ``messages``,
    ``max_tokens``, ``temperature``, ``stop``): checked and bounded; TextInputError names the field."""
    payload: dict[str, Any] = {
        "max_new_tokens": _number(body, "max_completion_tokens" if chat and "max_completion_tokens" in body
                                  else "max_tokens", DEFAULT_MAX_TOKENS, 1, 1_000_000, whole=True),
        "temperature": _number(body, "temperature", 1.0, 0, 2),
    }
    stop = body.get("stop")
    if stop is not None:
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) for s in stop):
            raise TextInputError("stop must be a string or a list of at most 4 strings", param="stop")
        payload["stop"] = stop
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages):
            raise TextInputError("messages must be a non-empty list of {role, content} with text content",
                                 param="messages")
        payload["messages"] = [{"role": m["role"], "content": m["content"]} for m in messages]
        payload["prompt"] = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise TextInputError("prompt must be a string", param="prompt")
        payload["prompt"] = prompt
    if len(payload["prompt"]) > MAX_PROMPT_CHARS:
        raise TextInputError(f"the prompt is longer than {MAX_PROMPT_CHARS} characters", param="prompt")
    return payload
