"""What a text generator receives for an OpenAI request, and the stop strings the platform cuts at."""

from __future__ import annotations

import pytest

from gateway.openai.protocol import ChatCompletionRequest, CompletionRequest
from gateway.openai.text import RequestError, StopScanner, text_request


def _scan(stops: list[str], pieces: list[str]) -> tuple[str, bool]:
    scanner = StopScanner(stops)
    sent = "".join(scanner.feed(piece) for piece in pieces) + scanner.flush()
    return sent, scanner.stopped


@pytest.mark.parametrize(("stops", "pieces", "sent", "stopped"), [
    ([], ["ab", "cd"], "abcd", False),
    (["cd"], ["ab", "cd", "ef"], "ab", True),
    (["cd"], ["abc", "def"], "ab", True),                 # a stop split across pieces
    (["cd"], ["abc", "xef"], "abcxef", False),            # a held "c" that began no stop goes out
    (["xyz", "b"], ["a", "bxyz"], "a", True),             # the first stop in the text wins
    (["END"], ["E", "N", "D", "more"], "", True),
    (["aa"], ["a"], "a", False),                          # held back, then flushed at the end
])
def test_a_stream_is_cut_before_its_first_stop_string(stops, pieces, sent, stopped) -> None:
    assert _scan(stops, pieces) == (sent, stopped)


def test_nothing_is_sent_after_a_stop() -> None:
    scanner = StopScanner(["."])
    assert scanner.feed("one. two") == "one" and scanner.feed("three") == "" and scanner.flush() == ""


def test_sampling_parameters_pass_only_when_set_and_stop_is_the_platforms() -> None:
    text = text_request(CompletionRequest(model="m", prompt=["hi"], top_p=0.5, stop="x"))
    assert text.payload == {"prompt": "hi", "top_p": 0.5} and text.stop == ["x"] and text.max_tokens is None
    handled = text_request(CompletionRequest(model="m", prompt="hi", max_tokens=3, stop=["x", ""]), ["stop"])
    assert handled.payload == {"prompt": "hi", "max_new_tokens": 3, "stop": ["x"]} and handled.stop == []


def test_chat_joins_text_parts_and_renders_the_prompt() -> None:
    request = ChatCompletionRequest(model="m", max_completion_tokens=4, messages=[
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]}])
    text = text_request(request)
    assert text.payload["messages"] == [{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": "Hello"}]
    assert text.payload["prompt"] == "system: Be brief.\nuser: Hello\nassistant: " and text.max_tokens == 4


@pytest.mark.parametrize(("fields", "handles", "words"), [
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, [], "only text parts"),
    ({"tools": [{"type": "function"}]}, [], "tools are not served by 'm'"),
    ({"tool_choice": "auto"}, [], "tools are not served"),
    ({"response_format": {"type": "json_schema"}}, [], "response_format 'json_schema' is not served"),
    ({"stop": ["a", "b", "c", "d", "e"]}, [], "at most 4 strings"),
])
def test_what_is_not_served_is_refused(fields, handles, words) -> None:
    request = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "x"}],
                                                    **fields})
    with pytest.raises(RequestError, match=words):
        text_request(request, handles)


def test_a_handler_that_handles_tools_receives_them() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], tools=tools,
                                    tool_choice="auto", response_format={"type": "text"})
    assert text_request(request, ["tools"]).payload["tools"] == tools
    assert "response_format" not in text_request(request, ["tools"]).payload


def test_several_prompts_in_one_request_are_refused() -> None:
    with pytest.raises(RequestError, match="one prompt per request"):
        text_request(CompletionRequest(model="m", prompt=["a", "b"]))
