"""Tensors of the Open Inference Protocol (v2), between the wire and a handler's JSON (pure).

A function that declares its tensors gets, per request, ``{input name: nested list}`` (what
``numpy.ndarray.tolist()`` gives; BYTES elements as text) and returns ``{output name: nested
list or scalar}``; these helpers convert both ways and check each tensor against the spec. On the
wire a tensor is JSON (``data``: flat or nested, row-major) or raw little-endian bytes (the binary
tensor data extension; BYTES elements each prefixed by their 4-byte little-endian length).
Every problem is a ``TensorError`` whose message names the tensor.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import orjson

from dilu.spec import TensorSpec
from dilu.tensor_frames import NUMPY_TYPES, FrameError, array_of, raw_bytes

# No request can carry more elements than this (each takes at least a byte); bounding every
# dimension, not only their product, also keeps a zero-sized shape such as [0, 2**62] out of
# numpy, which cannot hold such a dimension.
MAX_ELEMENTS = 2**31 - 1


class TensorError(ValueError):
    """A tensor that does not match its declaration or its own shape; the message names it."""


def element_count(shape: list[int]) -> int:
    return math.prod(shape)


def shape_fits(declared: list[int], actual: list[int] | tuple[int, ...]) -> bool:
    """Same rank, and every fixed (non -1) dimension equal."""
    return len(declared) == len(actual) and all(d in (-1, a) for d, a in zip(declared, actual, strict=True))


def _check_shape(spec: TensorSpec, shape: Any) -> list[int]:
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in shape):
        raise TensorError(f"input {spec.name!r}: shape must be a list of sizes >= 0")
    if math.prod(d for d in shape if d) > MAX_ELEMENTS:
        raise TensorError(f"input {spec.name!r}: shape {shape} holds more than {MAX_ELEMENTS} elements")
    if not shape_fits(spec.shape, shape):
        raise TensorError(f"input {spec.name!r}: shape {shape} does not fit the declared shape {spec.shape}")
    return shape


def check_header(spec: TensorSpec, datatype: Any, shape: Any) -> list[int]:
    """The shape of an input whose header (datatype, shape) matches ``spec``."""
    if datatype != spec.datatype:
        raise TensorError(f"input {spec.name!r}: datatype {datatype!r} given, the function declares "
                          f"{spec.datatype}")
    return _check_shape(spec, shape)


def _flatten(data: Any) -> list:
    if not isinstance(data, list):
        return [data]
    flat: list = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            flat.append(item)
        else:
            stack.pop()
    return flat


_KINDS = {"BOOL": "b", "FP16": "fi", "FP32": "fi", "FP64": "fi"}   # numpy kinds each datatype takes as is


def _from_json_in_c(spec: TensorSpec, shape: list[int], data: Any) -> np.ndarray | None:
    """``from_json``'s array built by numpy from the nested lists, when their elements are plainly
    of the datatype's kind (None otherwise: the element-wise path then decides and names what is
    wrong). Bools among numbers would be taken as 0 and 1, so numbers are scanned for them."""
    try:
        array = np.array(data)
    except (ValueError, OverflowError):   # ragged, or an integer past 64 bits
        return None
    kinds = _KINDS.get(spec.datatype, "iu")
    if array.dtype.kind not in kinds or (kinds != "b" and _holds_bool(data)):
        return None
    if array.size != element_count(shape):
        raise TensorError(f"input {spec.name!r}: {array.size} elements given, shape {shape} holds "
                          f"{element_count(shape)}")
    if array.ndim > 1 and list(array.shape) != shape:
        raise TensorError(f"input {spec.name!r}: data nested as {list(array.shape)} does not follow shape {shape} "
                          "(nest it level by level, or send it flat)")
    dtype = NUMPY_TYPES[spec.datatype]
    if array.dtype.kind in "iu":
        info = np.iinfo(dtype) if dtype.kind in "iu" else None
        if info is not None and array.size and (array.min() < info.min or array.max() > info.max):
            raise TensorError(f"input {spec.name!r}: an element does not fit {spec.datatype}")
    try:
        with np.errstate(over="raise", invalid="raise"):
            return _finite(spec, array.astype(dtype, copy=False)).reshape(shape)
    except FloatingPointError as exc:
        raise TensorError(f"input {spec.name!r}: an element does not fit {spec.datatype}: {exc}") from None


def _check_nesting(spec: TensorSpec, shape: list[int], data: Any) -> None:
    """Nested ``data`` follows ``shape`` level by level; flat data (no list inside) is row-major.
    Only the element count would let ``[[1, [2]], [3, 4]]`` pass for ``[2, 2]``."""
    if not isinstance(data, list) or not any(isinstance(item, list) for item in data):
        return
    level = [data]
    for depth, size in enumerate(shape):
        if not all(isinstance(item, list) and len(item) == size for item in level):
            break
        level = [element for item in level for element in item]
        if depth == len(shape) - 1 and not any(isinstance(item, list) for item in level):
            return
    raise TensorError(f"input {spec.name!r}: nested data does not follow shape {shape} level by level "
                      "(nest it as the shape says, or send it flat)")


def _holds_bool(data: Any) -> bool:
    """Whether a bool is among the (nested) elements; the types of a row are collected in C."""
    if type(data) is not list:
        return type(data) is bool
    kinds = set(map(type, data))
    return bool in kinds or (list in kinds and any(_holds_bool(item) for item in data if type(item) is list))


def from_json(spec: TensorSpec, shape: list[int], data: Any) -> np.ndarray:
    """An input sent as JSON ``data`` (flat or nested, row-major)."""
    if spec.datatype != "BYTES":
        array = _from_json_in_c(spec, shape, data)
        if array is not None:
            return array
    flat = _flatten(data)
    if len(flat) != element_count(shape):
        raise TensorError(f"input {spec.name!r}: {len(flat)} elements given, shape {shape} holds "
                          f"{element_count(shape)}")
    _check_nesting(spec, shape, data)
    if spec.datatype == "BYTES":
        if not all(isinstance(item, str) for item in flat):
            raise TensorError(f"input {spec.name!r}: BYTES elements are strings in JSON")
        array = np.empty(len(flat), dtype=object)
        array[:] = flat
        return array.reshape(shape)
    if spec.datatype == "BOOL":
        if not all(isinstance(item, bool) for item in flat):
            raise TensorError(f"input {spec.name!r}: BOOL elements are true or false")
    elif not all(isinstance(item, (int, float)) and not isinstance(item, bool) for item in flat):
        raise TensorError(f"input {spec.name!r}: {spec.datatype} elements are numbers")
    try:
        with np.errstate(over="raise", invalid="raise"):
            array = np.array(flat, dtype=NUMPY_TYPES[spec.datatype])
    except (OverflowError, ValueError, FloatingPointError, TypeError) as exc:
        raise TensorError(f"input {spec.name!r}: an element does not fit {spec.datatype}: {exc}") from None
    # Whole as written: an int is (float() would round 2**64 - 1 and call it fractional).
    if spec.datatype.startswith(("INT", "UINT")) and not all(isinstance(v, int) or v.is_integer() for v in flat):
        raise TensorError(f"input {spec.name!r}: {spec.datatype} elements are whole numbers")
    return _finite(spec, array).reshape(shape)


def _finite(spec: TensorSpec, array: np.ndarray, kind: str = "input") -> np.ndarray:
    """``array`` when it holds no NaN or infinity: JSON, which handlers receive and answer in,
    has neither, so one would only fail later and less clearly."""
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        position = int(np.flatnonzero(~np.isfinite(array.reshape(-1)))[0])
        raise TensorError(f"{kind} {spec.name!r}: element {position} is {array.reshape(-1)[position]} "
                          "(finite numbers only)")
    return array


def from_binary(spec: TensorSpec, shape: list[int], raw: bytes | memoryview, finite: bool = True) -> np.ndarray:
    """An input sent as raw bytes (binary extension, or gRPC ``raw_input_contents``): an array
    over those bytes, not a copy. ``finite``: refuse NaN and infinities (a handler that takes
    JSON cannot receive them; one that takes arrays can)."""
    try:
        array = array_of(spec.datatype, shape, raw, spec.name)
        return _finite(spec, array) if finite else array
    except FrameError as exc:
        raise TensorError(str(exc)) from None


def to_handler(spec: TensorSpec, array: np.ndarray) -> Any:
    """What the handler receives for an input: nested lists; BYTES elements as text."""
    if spec.datatype != "BYTES":
        return array.tolist()

    def text(item: Any) -> str:
        if isinstance(item, str):
            return item
        try:
            return bytes(item).decode("utf-8")
        except UnicodeDecodeError:
            raise TensorError(f"input {spec.name!r}: a BYTES element is not UTF-8 text (handlers receive "
                              "BYTES as text)") from None

    return np.vectorize(text, otypes=[object])(array).tolist() if array.size else array.tolist()


def handler_body(inputs: list[tuple[TensorSpec, np.ndarray]]) -> bytes:
    """The JSON body the handler receives, ``{input name: nested lists}``, written by orjson
    straight from the arrays (no Python object per element); BYTES elements as text. A float
    is written as the shortest text that reads back as the same value of its datatype."""
    return orjson.dumps({spec.name: to_handler(spec, array) if spec.datatype == "BYTES"
                         else np.ascontiguousarray(array) for spec, array in inputs},
                        option=orjson.OPT_SERIALIZE_NUMPY)


def from_handler(spec: TensorSpec, value: Any, finite: bool = True) -> np.ndarray:
    """An output as the handler returned it, checked against its declaration (and with
    ``finite``, refused if it holds NaN or infinities)."""
    try:
        if spec.datatype == "BYTES":
            array = np.array(value, dtype=object)
            array = np.vectorize(lambda item: item if isinstance(item, (str, bytes)) else str(item),
                                 otypes=[object])(array) if array.size else array
        else:
            with np.errstate(over="raise", invalid="raise"):   # an array of the right type is not copied
                array = np.asarray(value, dtype=NUMPY_TYPES[spec.datatype])
    except (OverflowError, ValueError, FloatingPointError, TypeError) as exc:
        raise TensorError(f"output {spec.name!r}: the handler's value is not a {spec.datatype} tensor: {exc}") from None
    if not shape_fits(spec.shape, array.shape):
        raise TensorError(f"output {spec.name!r}: the handler returned shape {list(array.shape)}, the spec "
                          f"declares {spec.shape}")
    return _finite(spec, array, "output") if finite else array


def to_json_data(spec: TensorSpec, array: np.ndarray) -> list:
    """An output's flat ``data`` for a JSON response; BYTES elements as text."""
    flat = array.reshape(-1).tolist()
    if spec.datatype == "BYTES":
        try:
            return [item.decode("utf-8") if isinstance(item, bytes) else item for item in flat]
        except UnicodeDecodeError:
            raise TensorError(f"output {spec.name!r}: a BYTES element is not UTF-8 text, which JSON cannot "
                              "carry: ask for it as binary data") from None
    return flat


def to_binary(spec: TensorSpec, array: np.ndarray) -> bytes | memoryview:
    """An output's raw bytes (binary extension, or gRPC ``raw_output_contents``)."""
    return raw_bytes(spec.datatype, array)
