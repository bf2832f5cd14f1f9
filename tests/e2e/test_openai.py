"""The OpenAI-compatible routes, driven by the official openai client (sync, async, streaming)
against the gpt example: the same tokens as Dilu's own API, errors in the shape the client
expects, and the platform's keys as the client's API key."""

from __future__ import annotations

import asyncio

import openai
import pytest

from tests.conftest import FIXTURE_FUNCTIONS

REPO = FIXTURE_FUNCTIONS.parents[2]
ADMIN = "admin-key-for-the-openai-test-0123"


def _deploy_gpt(platform) -> None:
    deployed = platform.cli("deploy", str(REPO / "examples" / "gpt" / "model.yaml"))
    assert deployed.returncode == 0, deployed.stderr


@pytest.fixture
def gpt(start_platform):
    platform = start_platform()
    _deploy_gpt(platform)
    echo = platform.cli("deploy", str(REPO / "examples" / "echo" / "model.yaml"))
    assert echo.returncode == 0, echo.stderr
    return platform


def _text_of(platform, prompt: str, count: int) -> str:
    reply = platform.invoke("gpt", {"prompt": prompt, "max_new_tokens": count})
    assert reply.status_code == 200, reply.text
    return reply.json()["text"]


def test_completions_and_chat_through_the_openai_client(gpt) -> None:
    client = openai.OpenAI(base_url=f"{gpt.url}/v1", api_key="no key on an open platform")
    assert [model.id for model in client.models.list()] == ["gpt"]      # echo is no text generator

    expected = _text_of(gpt, "Once upon a time", 8)
    completion = client.completions.create(model="gpt", prompt="Once upon a time", max_tokens=8)
    assert completion.choices[0].text == expected and completion.choices[0].finish_reason == "length"
    assert completion.usage.completion_tokens == 8
    streamed = client.completions.create(model="gpt", prompt="Once upon a time", max_tokens=8, stream=True)
    assert "".join(chunk.choices[0].text for chunk in streamed) == expected

    messages = [{"role": "user", "content": "Hello"}]
    chat_expected = _text_of(gpt, "user: Hello\nassistant: ", 5)
    chat = client.chat.completions.create(model="gpt", messages=messages, max_tokens=5)
    assert chat.choices[0].message.content == chat_expected and chat.choices[0].message.role == "assistant"
    pieces = [chunk.choices[0].delta.content or "" for chunk in
              client.chat.completions.create(model="gpt", messages=messages, max_tokens=5, stream=True)]
    assert "".join(pieces) == chat_expected

    async def asynchronously() -> str:
        async with openai.AsyncOpenAI(base_url=f"{gpt.url}/v1", api_key="none") as async_client:
            stream = await async_client.chat.completions.create(model="gpt", messages=messages, max_tokens=5,
                                                                stream=True)
            return "".join([chunk.choices[0].delta.content or "" async for chunk in stream])

    assert asyncio.run(asynchronously()) == chat_expected
    client.close()


def test_errors_come_in_the_shape_the_client_reads(gpt) -> None:
    client = openai.OpenAI(base_url=f"{gpt.url}/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.NotFoundError, match="not a text generator"):
        client.completions.create(model="echo", prompt="x")
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="nope", prompt="x")
    with pytest.raises(openai.BadRequestError, match="max_new_tokens must be"):
        client.completions.create(model="gpt", prompt="x", max_tokens=10_000)
    with pytest.raises(openai.BadRequestError, match="messages: List should have at least 1 item"):
        client.chat.completions.create(model="gpt", messages=[])
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model="gpt", prompt="x", temperature=7)
    with pytest.raises(openai.BadRequestError, match="model's context of 128 tokens"):
        client.completions.create(model="gpt", prompt="x" * 120, max_tokens=16, stream=True)
    client.close()


def test_the_platforms_keys_are_the_clients_keys(start_platform) -> None:
    platform = start_platform(env={"DILU_ADMIN_KEY": ADMIN, "DILU_API_KEY": ADMIN})
    platform.http.headers["authorization"] = f"Bearer {ADMIN}"
    _deploy_gpt(platform)
    other = platform.http.post("/v1/keys", json={"name": "other-only", "scopes": ["invoke:other"]}).json()["key"]
    gpt_only = platform.http.post("/v1/keys", json={"name": "gpt-only", "scopes": ["invoke:gpt"]}).json()["key"]

    clients: list[openai.OpenAI] = []

    def client(key: str) -> openai.OpenAI:
        clients.append(openai.OpenAI(base_url=f"{platform.url}/v1", api_key=key, max_retries=0))
        return clients[-1]

    assert client(gpt_only).completions.create(model="gpt", prompt="x", max_tokens=2).choices[0].text
    assert [model.id for model in client(gpt_only).models.list()] == ["gpt"]
    assert list(client(other).models.list()) == []
    with pytest.raises(openai.PermissionDeniedError, match="do not allow invoke on 'gpt'"):
        client(other).completions.create(model="gpt", prompt="x", max_tokens=2)
    with pytest.raises(openai.AuthenticationError, match="not valid"):
        client("dilu_wrong_key").completions.create(model="gpt", prompt="x", max_tokens=2)
    for each in clients:
        each.close()


def test_tritonclient_streams_a_text_generator_as_text_input_and_text_output(gpt) -> None:
    """Triton's LLM convention over gRPC: text_input, stream, sampling_parameters in;
    text_output out, one result per chunk (ModelStreamInfer) or the whole text (ModelInfer)."""
    import json
    import queue

    import numpy as np
    import tritonclient.grpc as triton_grpc

    def inputs(prompt: str, stream: bool, sampling: dict) -> list:
        values = {"text_input": ("BYTES", np.array([prompt.encode()], dtype=object)),
                  "stream": ("BOOL", np.array([stream])),
                  "sampling_parameters": ("BYTES", np.array([json.dumps(sampling).encode()], dtype=object))}
        made = []
        for name, (datatype, array) in values.items():
            tensor = triton_grpc.InferInput(name, [1], datatype)
            tensor.set_data_from_numpy(array)
            made.append(tensor)
        return made

    expected = _text_of(gpt, "Once upon a time", 8)
    client = triton_grpc.InferenceServerClient(gpt.grpc_address)
    try:
        metadata = client.get_model_metadata("gpt")
        assert [t.name for t in metadata.outputs] == ["text_output"]
        whole = client.infer("gpt", inputs("Once upon a time", False, {"max_tokens": 8}))
        assert whole.as_numpy("text_output")[0].decode() == expected

        got: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        client.async_stream_infer("gpt", inputs("Once upon a time", True, {"max_tokens": 8, "temperature": 0}),
                                  request_id="s", enable_empty_final_response=True)
        pieces = []
        while True:
            result, error = got.get(timeout=60)
            assert error is None, error
            response = result.get_response()
            if response.outputs:
                pieces.append(result.as_numpy("text_output")[0].decode())
            if response.parameters["triton_final_response"].bool_param:
                break
        assert len(pieces) == 8 and "".join(pieces) == expected
        client.async_stream_infer("gpt", inputs("x", True, {"max_tokens": 0}), request_id="bad")
        result, error = got.get(timeout=60)
        assert result is None and "max_tokens: Input should be greater than or equal to 1" in error.message()
        client.stop_stream()
    finally:
        client.close()
