"""The OpenAI routes as a user coming from vLLM's server meets them, through the official openai
client: usage from the handler, n choices, sampling parameters that reach the handler, stop
strings the platform enforces, text parts in chat, the handler's own default length, embeddings,
and what is not served refused in OpenAI's error shape (the key checked before the body)."""

from __future__ import annotations

import base64
import json
import struct

import httpx
import openai
import pytest

from tests.conftest import FIXTURE_FUNCTIONS
from tests.platform import Platform

REPO = FIXTURE_FUNCTIONS.parents[2]
ADMIN = "admin-key-for-openai-conformance-0123"
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    running = Platform(tmp_path_factory.mktemp("openai") / "home", env={"DILU_ADMIN_KEY": ADMIN,
                                                                         "DILU_API_KEY": ADMIN})
    try:
        for spec in (REPO / "examples" / "gpt" / "model.yaml", REPO / "examples" / "bert" / "model.yaml",
                     FIXTURE_FUNCTIONS / "text_echo" / "model.yaml"):
            done = running.cli("deploy", str(spec))
            assert done.returncode == 0, done.stderr
        running.http.headers["authorization"] = f"Bearer {ADMIN}"
        yield running
    finally:
        running.close()


@pytest.fixture
def client(platform):
    with openai.OpenAI(base_url=f"{platform.url}/v1", api_key=ADMIN, max_retries=0) as made:
        yield made


def _greedy(platform, prompt: str, count: int) -> str:
    """The greedy text through Dilu's own API, token by token as a stream carries it."""
    reply = platform.invoke("gpt", {"prompt": prompt, "max_new_tokens": count})
    assert reply.status_code == 200, reply.text
    return "".join(bytes([token]).decode("utf-8", errors="replace") for token in reply.json()["tokens"])


def test_usage_is_the_handlers_and_streams_when_asked(platform, client) -> None:
    completion = client.completions.create(model="gpt", prompt=PROMPT, max_tokens=6)
    assert completion.usage.prompt_tokens == len(PROMPT.encode()) and completion.usage.completion_tokens == 6
    assert completion.usage.total_tokens == len(PROMPT.encode()) + 6
    chunks = list(client.chat.completions.create(model="gpt", messages=[{"role": "user", "content": "Hi"}],
                                                 max_tokens=4, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4
    assert chunks[-1].usage.prompt_tokens == len(b"user: Hi\nassistant: ")
    assert all(chunk.usage is None for chunk in chunks[:-1])


def test_n_choices_and_sampling_parameters_reach_the_handler(platform, client) -> None:
    many = client.completions.create(model="gpt", prompt=PROMPT, max_tokens=5, n=3, temperature=1.2, seed=11)
    assert sorted(choice.index for choice in many.choices) == [0, 1, 2]
    assert len({choice.text for choice in many.choices}) == 1       # one seed: the same sample each time
    assert many.usage.completion_tokens == 15
    again = client.completions.create(model="gpt", prompt=PROMPT, max_tokens=5, temperature=1.2, seed=11)
    assert again.choices[0].text == many.choices[0].text
    # A nucleus of one token is greedy decoding, whatever the temperature: top_p reached the handler.
    narrow = client.completions.create(model="gpt", prompt=PROMPT, max_tokens=5, temperature=1.5, top_p=1e-6)
    assert narrow.choices[0].text == _greedy(platform, PROMPT, 5)

    streamed: dict[int, str] = {}
    for chunk in client.chat.completions.create(model="gpt", messages=[{"role": "user", "content": "Hi"}],
                                                max_tokens=3, n=2, stream=True):
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + (choice.delta.content or "")
    assert sorted(streamed) == [0, 1] and streamed[0] == streamed[1] == _greedy(platform, "user: Hi\nassistant: ", 3)

    seen = json.loads(client.completions.create(model="text-echo", prompt="x", seed=3, top_p=0.5,
                                                presence_penalty=1.0).choices[0].text)
    assert seen == {"presence_penalty": 1.0, "seed": 3, "top_p": 0.5}     # only what the request set
    with pytest.raises(openai.BadRequestError, match="frequency_penalty: this generator cannot honour it"):
        client.completions.create(model="text-echo", prompt="x", frequency_penalty=0.5)


def test_the_platform_enforces_stop_strings_and_ends_the_generation(platform, client) -> None:
    text = _greedy(platform, PROMPT, 24)
    stop = text[5:8]
    cut = text[:text.index(stop)]
    whole = client.completions.create(model="gpt", prompt=PROMPT, max_tokens=24, stop=[stop])
    assert whole.choices[0].text == cut and whole.choices[0].finish_reason == "stop"
    assert whole.usage.completion_tokens < 24
    pieces = [c.choices[0].text for c in client.completions.create(model="gpt", prompt=PROMPT, max_tokens=24,
                                                                   stop=stop, stream=True) if c.choices]
    assert "".join(pieces) == cut
    # A handler that handles its stop strings gets them, and the platform leaves its text alone.
    seen = json.loads(client.completions.create(model="text-echo", prompt="x", stop=["}"]).choices[0].text)
    assert seen == {"stop": ["}"]}


def test_chat_takes_text_parts_and_the_handler_chooses_the_length(platform, client) -> None:
    parts = [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]
    with_parts = client.chat.completions.create(model="gpt", messages=[{"role": "user", "content": parts}])
    prompt = "user: Hello\nassistant: "
    assert with_parts.choices[0].message.content == _greedy(platform, prompt, 64)   # its own bound, not 16
    assert with_parts.usage.completion_tokens == 64 and with_parts.choices[0].finish_reason == "stop"
    image = [{"type": "image_url", "image_url": {"url": "http://example.invalid/x.png"}}]
    with pytest.raises(openai.BadRequestError, match="only text parts"):
        client.chat.completions.create(model="gpt", messages=[{"role": "user", "content": image}])
    echoed = client.completions.create(model="gpt", prompt=PROMPT, max_tokens=3, echo=True)
    assert echoed.choices[0].text == PROMPT + _greedy(platform, PROMPT, 3)


def test_what_is_not_served_is_refused_not_ignored(client) -> None:
    chat = {"model": "gpt", "messages": [{"role": "user", "content": "Hi"}]}
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for extra, words in (({"tools": tools}, "tools are not served by 'gpt'"),
                         ({"response_format": {"type": "json_object"}}, "response_format 'json_object' is not "
                                                                         "served by 'gpt'"),
                         ({"logprobs": True}, "logprobs"), ({"top_logprobs": 2}, "top_logprobs")):
        with pytest.raises(openai.BadRequestError, match=words):
            client.chat.completions.create(**chat, **extra)
    with pytest.raises(openai.BadRequestError, match="best_of"):
        client.completions.create(model="gpt", prompt="x", best_of=2, n=2)
    answer = client.chat.completions.create(model="text-echo", messages=chat["messages"], tools=tools,
                                            response_format={"type": "json_object"})
    seen = json.loads(answer.choices[0].message.content)
    assert seen["tools"] == tools and seen["response_format"] == {"type": "json_object"}


def test_embeddings_of_an_encoder(platform, client) -> None:
    texts = ["a cat sat", "on the mat"]
    made = client.embeddings.create(model="bert", input=texts)
    direct = [platform.invoke("bert", {"text": text}).json() for text in texts]
    assert [item.embedding for item in made.data] == [pytest.approx(d["embedding"], abs=1e-6) for d in direct]
    assert made.usage.prompt_tokens == sum(d["tokens"] for d in direct)
    raw = platform.http.post("/v1/embeddings", json={"model": "bert", "input": "a cat sat",
                                                     "encoding_format": "base64"}).json()
    vector = base64.b64decode(raw["data"][0]["embedding"])
    assert list(struct.unpack(f"<{len(vector) // 4}f", vector)) == pytest.approx(direct[0]["embedding"], abs=1e-6)
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        client.embeddings.create(model="bert", input="x", dimensions=3)
    with pytest.raises(openai.NotFoundError, match="not an encoder"):
        client.embeddings.create(model="gpt", input="x")
    assert {model.id for model in client.models.list()} == {"gpt", "bert", "text-echo"}


def test_errors_keep_openais_shape_and_the_key_comes_first(platform) -> None:
    base = f"{platform.url}/v1"
    wrong = httpx.post(f"{base}/chat/completions", content=b"{not json", headers={"authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
    huge = httpx.post(f"{base}/completions", headers={"authorization": f"Bearer {ADMIN}"},
                      content=b'{"model": "gpt", "prompt": "' + b"x" * (11 * 2**20) + b'"}')
    assert huge.status_code == 413 and "DILU_MAX_REQUEST_BYTES" in huge.json()["error"]["message"]
    deep = httpx.post(f"{base}/embeddings", headers={"authorization": f"Bearer {ADMIN}"},
                      content=b'{"model": "bert", "input": ' + b"[" * 500 + b"]" * 500 + b"}")
    assert deep.status_code == 400 and deep.json()["error"]["type"] == "invalid_request_error"
