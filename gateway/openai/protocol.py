"""The OpenAI API's request and response documents, as the gateway serves them (checked on the
way in; the routes build the answers in these shapes). Unknown fields are ignored, as other
servers of this API do; fields the platform does not serve are refused by ``gateway.openai.text``
when set to anything but their neutral value."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_N = 16
MAX_STOPS = 4
MAX_PROMPT_CHARS = 1_000_000
MAX_EMBEDDING_INPUTS = 2048


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str = Field(..., min_length=1, max_length=63)


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Sampling(_Request):
    max_tokens: int | None = Field(None, ge=1, le=1_000_000)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=-(2**63), lt=2**63)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    stop: str | list[str] | None = Field(None, description=f"At most {MAX_STOPS} strings that end the text "
                                                          "(not included)")
    n: int = Field(1, ge=1, le=MAX_N, description="Completions to make of the prompt")
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: Literal[False] | None = Field(None, description="Not served: null or false only")
    logit_bias: dict[str, float] | None = Field(None, max_length=0, description="Not served: null or empty only")
    user: str | None = Field(None, max_length=256)


class CompletionRequest(_Sampling):
    prompt: str | list[str] = Field(..., description="The text to complete (a list of one string is accepted)")
    echo: bool = Field(False, description="Put the prompt before the completion")
    best_of: Literal[1] | None = Field(None, description="Not served beyond 1 (n makes several completions)")
    suffix: None = Field(None, description="Not served: null only")


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str = Field(..., min_length=1, max_length=64)
    content: str | list[dict[str, Any]] | None = Field(None, description="Text, or a list of text parts")


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(..., min_length=1, max_length=10_000)
    max_completion_tokens: int | None = Field(None, ge=1, le=1_000_000)
    top_logprobs: None = Field(None, description="Not served: null only")
    tools: list[dict[str, Any]] | None = Field(None, description="Passed to a handler that handles tools")
    tool_choice: Any = None
    response_format: dict[str, Any] | None = Field(None, description="Passed to a handler that handles it; "
                                                                     "type text is always accepted")


class EmbeddingRequest(_Request):
    input: str | list[str] = Field(..., description=f"A text, or at most {MAX_EMBEDDING_INPUTS} texts")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1, description="Served only as the encoder's own size")
    user: str | None = Field(None, max_length=256)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int = 0
    total_tokens: int


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: Literal["stop", "length"] | None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class Embedding(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str


class EmbeddingResponse(BaseModel):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: Usage


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]
