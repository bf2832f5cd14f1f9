"""The function spec (``model.yaml``): parsing, validation and defaults.

``make_spec(user_yaml, defaults)`` is pure: it turns the user's YAML text into a frozen
``FunctionSpec`` or raises ``SpecError`` whose messages name the field (and the YAML line when
the parser knows it). Unknown fields are errors, so typos never pass silently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dilu.limits import LimitExceeded, check_yaml
from dilu.slices import MAX_SHARE, MIN_SHARE, ComputeSlice

# Lower-case letters, digits, "-" and "_" (Triton's model names, such as simple_string, hold "_").
NAME_PATTERN = r"^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$"
NAME_FRAGMENT_PATTERN = r"^[a-z0-9_-]{0,63}$"   # a part of a name, as a filter matches it ("-" alone too)
HANDLER_PATTERN = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"
_MEMORY_UNITS = {
    "": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
    "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40,
}


def parse_memory(value: int | str) -> int:
    """Bytes from an int or a string such as ``512Mi``, ``2G`` or ``1.5Gi``."""
    if isinstance(value, bool):
        raise ValueError("memory must be a size such as 512Mi or 2Gi")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError("memory must be positive")
        return value
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]i?)?[bB]?\s*", str(value))
    if not match:
        raise ValueError(f"memory {value!r} is not a size such as 512Mi or 2Gi")
    number, unit = match.groups()
    size = int(float(number) * _MEMORY_UNITS[(unit or "").lower()])
    if size <= 0:
        raise ValueError("memory must be positive")
    return size


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False)


class Slo(_Strict):
    p99_ms: float = Field(1000.0, gt=0, description="Target p99 latency of one request, in ms")


class Resources(_Strict):
    memory: int = Field(2 * 2**30, description="Memory slice in bytes; accepts 512Mi, 2Gi, ...")
    gpu: bool | Literal["auto"] = Field(
        "auto", description="true: needs a GPU; false: CPU only; auto: a GPU when one is free")
    sm_request: float | None = Field(None, ge=MIN_SHARE, le=MAX_SHARE,
                                     description="Pinned guaranteed compute share (0.01-1)")
    sm_limit: float | None = Field(None, ge=MIN_SHARE, le=MAX_SHARE, description="Pinned burst compute share (0.01-1)")

    @field_validator("memory", mode="before")
    @classmethod
    def _memory(cls, value: Any) -> int:
        return parse_memory(value)

    @model_validator(mode="after")
    def _request_within_limit(self) -> Resources:
        if self.sm_request is not None and self.sm_limit is not None:
            ComputeSlice.checked(self.sm_request, self.sm_limit)    # SliceError is a ValueError
        return self


class Scaling(_Strict):
    min_instances: int = Field(0, ge=0, le=1000)
    max_instances: int = Field(4, ge=1, le=1000)
    keep_alive_s: float = Field(60.0, ge=0, description="Idle time before the last instances stop")
    target_concurrency: int | None = Field(
        None, ge=1, le=4096, description="Requests (streams for their whole duration) in flight per instance before "
                                         "another is added; default: the batch size for a function that streams "
                                         "text, else twice the batch size and the profile's latency model")

    @model_validator(mode="after")
    def _bounds(self) -> Scaling:
        if self.min_instances > self.max_instances:
            raise ValueError("min_instances must be <= max_instances")
        return self


class Batching(_Strict):
    max_batch_size: int = Field(1, ge=1, le=4096)
    max_wait_ms: float = Field(0.0, ge=0, le=10_000)


class Warmup(_Strict):
    """Requests an instance answers before it is ready (as Triton's model warm-up): the first
    calls of a model are slow (allocations, lazy initialisation, kernel selection), and a warm-up
    moves that cost out of the first user's request into the measured loading stages."""

    request: Any = Field(None, description="One request body (JSON), as a client would send it")
    file: str | None = Field(None, max_length=255, pattern=r"^[A-Za-z0-9_./-]+$",
                             description="A JSON file in the function's code holding the request body")
    count: int = Field(1, ge=1, le=100, description="How many times the request is run")

    @field_validator("file")
    @classmethod
    def _inside_code(cls, value: str | None) -> str | None:
        if value is not None and (value.startswith("/") or ".." in value.split("/")):
            raise ValueError("the warm-up file is a path inside the function's code (relative, no '..')")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> Warmup:
        if (self.request is None) == (self.file is None):
            raise ValueError("give the warm-up request either inline (request) or as a file of the code (file)")
        return self


DATATYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
             "FP16", "FP32", "FP64", "BYTES")
TENSOR_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.:-]{0,127}$"


class TensorSpec(_Strict):
    """One input or output of the inference protocol (v2): its name, element type and shape."""

    name: str = Field(..., pattern=TENSOR_NAME_PATTERN, description="Tensor name, as clients send it")
    datatype: Literal[DATATYPES] = Field(...,
                                         description="Element type in the protocol's names (FP32, INT64, BYTES, ...)")
    shape: list[int] = Field(..., max_length=16, description="Dimensions; -1 for a dimension of any size")
    format: Literal["NCHW", "NHWC"] | None = Field(None, description="An image input's layout, as Triton's model "
                                                                     "configuration states it for image clients")
    labels: str | None = Field(None, max_length=255, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_./-]*$",
                               description="An output's labels: a file in the function's folder, one label per "
                                           "line (line i names class i); the classification extension (a "
                                           "request's class_count) answers 'score:index:label'")

    @field_validator("labels")
    @classmethod
    def _relative(cls, value: str | None) -> str | None:
        if value is not None and ".." in value.split("/"):
            raise ValueError("a file in the function's folder (no '..')")
        return value

    @field_validator("shape")
    @classmethod
    def _dims(cls, value: list[int]) -> list[int]:
        if any(dim < -1 for dim in value):
            raise ValueError("each dimension is a size >= 0, or -1 for any size")
        return value


def _unique_names(tensors: list[TensorSpec], what: str) -> None:
    seen: set[str] = set()
    for tensor in tensors:
        if tensor.name in seen:
            raise ValueError(f"{what}: the name {tensor.name!r} appears twice")
        seen.add(tensor.name)


class SpecModel(_Strict):
    """The YAML document, field by field (this is what ``dilu spec schema`` prints)."""

    name: str = Field(..., pattern=NAME_PATTERN,
                      description="Function name: lower-case letters, digits, - and _ (at most 63)")
    handler: str = Field(..., pattern=HANDLER_PATTERN,
                         description="module:Class, the module resolved relative to the spec's folder")
    model: dict[str, Any] = Field(default_factory=dict, description="Options passed to the handler")
    function_class: Literal["latency", "batch"] = Field("latency", alias="class")
    slo: Slo = Field(default_factory=Slo)
    resources: Resources = Field(default_factory=Resources)
    scaling: Scaling = Field(default_factory=Scaling)
    batching: Batching = Field(default_factory=Batching)
    env: dict[str, str] = Field(default_factory=dict)
    image: str | None = Field(
        None, max_length=255, pattern=r"^[a-z0-9][a-z0-9._/:@-]*$",
        description="A container image that already holds the handler (docker runtime); the code is "
                    "then not uploaded and the handler's module is imported from the image's working "
                    "directory or its Python path")
    # Inference is normally free of side effects, so a latency function's request whose instance
    # died under it is retried once elsewhere; a batch function's (training, jobs that write) is
    # not. A function says otherwise with this.
    idempotent: bool | None = Field(None, description="May a request whose instance died while serving it be "
                                                      "retried once on another instance (the reply then carries "
                                                      "x-dilu-retried)? Default: true for class latency, false "
                                                      "for class batch")
    inputs: list[TensorSpec] = Field(
        default_factory=list, max_length=64,
        description="Declared input tensors: the function then also serves the inference protocol (v2) at "
                    "/v2/models/<name>; its handler receives {input name: nested list} per request")
    outputs: list[TensorSpec] = Field(
        default_factory=list, max_length=64,
        description="Declared output tensors: the handler returns {output name: nested list or scalar}")
    arrays: Literal["numpy", "torch"] | None = Field(
        None, description="The handler takes and returns arrays: predict({input name: array}) -> {output name: "
                          "array}, a batch stacked along the first axis; numpy arrays, or torch tensors on the "
                          "instance's device. Inference-protocol tensors then reach it as raw bytes")
    generates: Literal["text", "embeddings"] | None = Field(
        None, description="text: a text generator, also served by the OpenAI-compatible routes (/v1/completions, "
                          "/v1/chat/completions, /v1/models) as the model of its name; it takes {prompt, messages, "
                          "max_new_tokens, temperature, ...} and streams chunks holding text (docs/api.md). "
                          "embeddings: an encoder, served by /v1/embeddings; it takes {text} and answers "
                          "{embedding, tokens}")
    handles: list[Literal["stop", "tools", "response_format"]] = Field(
        default_factory=list, max_length=3,
        description="What a text generator does itself: stop (it ends at the request's stop strings; otherwise "
                    "the platform cuts the text there and ends the generation), tools and response_format (the "
                    "OpenAI routes pass them on; otherwise a request with them is refused)")
    max_stream_s: float | None = Field(
        None, gt=0, le=86400,
        description="Longest one streamed answer may run, start to end (the gateway's DILU_MAX_STREAM_S bounds it "
                    "too); also how long an instance being scaled in, updated or deleted may go on serving the "
                    "streams it has (default: the worker's DILU_DRAIN_S)")
    weights: str | None = Field(
        None,
        description="The function's weights: a safetensors artifact named by its digest (sha256:<hex>). In "
                    "model.yaml, a path to the file (relative to it): dilu deploy uploads it once and sends the "
                    "digest. Instances map it and the handler reads it with dilu.weights()")
    warmup: Warmup | None = Field(None, description="A request each instance runs before it is ready "
                                                    "(its time is the loading stage 'warmup')")

    @model_validator(mode="after")
    def _tensors(self) -> SpecModel:
        if bool(self.inputs) != bool(self.outputs):
            raise ValueError("inputs and outputs are declared together (both, or neither)")
        _unique_names(self.inputs, "inputs")
        _unique_names(self.outputs, "outputs")
        if self.arrays and not self.inputs:
            raise ValueError("arrays: the handler takes arrays of the declared tensors: declare inputs and outputs")
        if self.arrays and self.batching.max_batch_size > 1:
            fixed = [t.name for t in self.inputs + self.outputs if not t.shape or t.shape[0] != -1]
            if fixed:
                raise ValueError(f"arrays with batching: requests are stacked along the first axis, so each tensor's "
                                 f"first dimension is -1 (not so for {', '.join(fixed)})")
        return self

    def occupancy_target(self) -> int | None:
        """Requests in flight per instance before another is added: ``scaling.target_concurrency``,
        or for a function that streams text its batch size (a queued stream waits a whole stream,
        not a service time); None: the rate and the latency model decide alone."""
        if self.scaling.target_concurrency is not None:
            return self.scaling.target_concurrency
        return self.batching.max_batch_size if self.generates == "text" else None

    @property
    def serves_v2(self) -> bool:
        """Whether the function declares its tensors (and so answers the inference protocol)."""
        return bool(self.inputs)

    @field_validator("weights")
    @classmethod
    def _weights_digest(cls, value: str | None) -> str | None:
        from dilu.bundles import is_digest

        if value is not None and not is_digest(value):
            raise ValueError(f"weights: {value[:200]!r} is not an artifact digest (sha256:<64 hex digits>): "
                             "dilu deploy uploads the file model.yaml names and sends its digest")
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"env name {key!r} is not a valid variable name")
            if key.startswith("DILU_") or key in {"LD_PRELOAD", "CUDA_VISIBLE_DEVICES"}:
                raise ValueError(f"env name {key!r} is reserved by the platform")
        return value


FunctionSpec = SpecModel


@dataclass(frozen=True)
class ClusterDefaults:
    """Operator-level defaults applied where the user's YAML is silent."""

    keep_alive_s: float | None = None


@dataclass
class SpecError(Exception):
    """The spec is invalid; each problem names its field and, when known, its line."""

    problems: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return "; ".join(self.problems)


def _line_index(node: yaml.Node | None, path: tuple = (), out: dict | None = None) -> dict[tuple, int]:
    """Maps each key path of a composed YAML document to its 1-based line."""
    out = {} if out is None else out
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key_path = path + (key_node.value,)
            out[key_path] = key_node.start_mark.line + 1
            _line_index(value_node, key_path, out)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            out[path + (index,)] = item.start_mark.line + 1
            _line_index(item, path + (index,), out)
    return out


def _describe(error: dict, lines: dict[tuple, int]) -> str:
    loc = tuple(error["loc"])
    where = ".".join(str(part) for part in loc) or "spec"
    line = None
    for cut in range(len(loc), 0, -1):
        line = lines.get(loc[:cut])
        if line:
            break
    message = error["msg"]
    if error["type"] == "extra_forbidden":
        message = "unknown field"
    elif error["type"] == "missing":
        message = "required field is missing"
    at = f" (line {line})" if line else ""
    return f"{where}{at}: {message}"


def make_spec(user_yaml: str, defaults: ClusterDefaults | None = None) -> FunctionSpec:
    """Parses and validates ``user_yaml``; ``defaults`` fill what the user left out."""
    try:
        root = check_yaml(user_yaml)
        document = yaml.safe_load(user_yaml)
        lines = _line_index(root)
    except LimitExceeded as exc:
        raise SpecError([f"spec: {exc}"]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError([f"malformed YAML{at}: {problem}"]) from None
    return spec_from_dict(document, defaults, lines)


def spec_from_dict(document: Any, defaults: ClusterDefaults | None = None,
                   lines: dict[tuple, int] | None = None) -> FunctionSpec:
    """Validates an already-decoded document (the API receives JSON)."""
    if not isinstance(document, dict):
        raise SpecError(["spec: expected a mapping of fields (name, handler, ...)"])
    document = dict(document)
    defaults = defaults or ClusterDefaults()
    # Each cluster default is applied explicitly, only where the user said nothing.
    if defaults.keep_alive_s is not None:
        scaling = document.get("scaling")
        if scaling is None or (isinstance(scaling, dict) and "keep_alive_s" not in scaling):
            document["scaling"] = {**(scaling or {}), "keep_alive_s": defaults.keep_alive_s}
    try:
        return SpecModel.model_validate(document)
    except ValidationError as exc:
        raise SpecError([_describe(err, lines or {}) for err in exc.errors()]) from None


def spec_to_dict(spec: FunctionSpec) -> dict[str, Any]:
    """The canonical JSON form stored in the database (aliases, so it re-validates)."""
    return spec.model_dump(mode="json", by_alias=True)


def json_schema() -> dict[str, Any]:
    return SpecModel.model_json_schema(by_alias=True)


def retries_after_failure(spec: dict[str, Any]) -> bool:
    """Whether a request whose instance died under it is tried once more elsewhere (the wire
    form of a spec: ``idempotent`` when set, else true for class latency only)."""
    value = spec.get("idempotent")
    return bool(value) if value is not None else spec.get("class", "latency") == "latency"
