"""Tensors as bytes between a gateway and an instance, with their names, datatypes and shapes.

A function that takes arrays (``arrays:`` in its spec) receives inference-protocol requests in
this frame instead of JSON, so an image crosses each hop as its raw bytes and reaches the
handler as an array over the request's own buffer. The frame's header, a JSON list
``[{"name", "datatype", "shape", "size"}]``, travels in the HTTP header ``x-dilu-tensors``; the
body is each tensor's bytes in header order: little-endian elements, or for BYTES each element
prefixed by its 4-byte little-endian length, as in the protocol's binary extension. With the
header out of the body, one tensor's body is the tensor's own memory, sent without a copy.

Instances import this module, so it needs the standard library and numpy only.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from dilu.instance_protocol import TENSOR_FRAME_TYPE, TENSORS_HEADER

MEDIA_TYPE = TENSOR_FRAME_TYPE
HEADER = TENSORS_HEADER
MAX_TENSORS = 256
MAX_HEADER_BYTES = 60 * 1024   # within what HTTP servers take in one header
NUMPY_TYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype("<u1"), "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"), "UINT64": np.dtype("<u8"), "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"), "INT32": np.dtype("<i4"), "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"), "FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}
_LENGTH = struct.Struct("<I")


class FrameError(ValueError):
    """A frame or a tensor in it that is malformed; the message names what is wrong."""


@dataclass(frozen=True)
class Tensor:
    name: str
    datatype: str
    array: np.ndarray


def split_bytes(raw: bytes | memoryview, count: int, name: str) -> np.ndarray:
    """The ``count`` elements of a BYTES tensor's raw form, as a flat object array of bytes."""
    view, items, offset = memoryview(raw), [], 0
    while offset < len(view):
        if offset + 4 > len(view):
            raise FrameError(f"input {name!r}: a BYTES element's 4-byte length is cut short")
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4
        if offset + length > len(view):
            raise FrameError(f"input {name!r}: a BYTES element is shorter than its length says")
        items.append(bytes(view[offset:offset + length]))
        offset += length
    if len(items) != count:
        raise FrameError(f"input {name!r}: {len(items)} BYTES elements given, the shape holds {count}")
    array = np.empty(count, dtype=object)
    array[:] = items
    return array


def join_bytes(array: np.ndarray) -> bytes:
    """A BYTES tensor's raw form; text elements are written as UTF-8."""
    parts = []
    for item in array.reshape(-1):
        encoded = item.encode("utf-8") if isinstance(item, str) else bytes(item)
        parts += [_LENGTH.pack(len(encoded)), encoded]
    return b"".join(parts)


def raw_bytes(datatype: str, array: np.ndarray) -> bytes | memoryview:
    """The tensor's raw form; a view of the array itself where its layout already is."""
    if datatype == "BYTES":
        return join_bytes(array)
    array = np.ascontiguousarray(array, dtype=NUMPY_TYPES[datatype])
    return memoryview(array).cast("B") if array.size else b""


def array_of(datatype: str, shape: list[int], raw: bytes | memoryview, name: str) -> np.ndarray:
    """The array over ``raw`` (not copied), after checking its size against the shape."""
    count = math.prod(shape)
    if datatype == "BYTES":
        return split_bytes(raw, count, name).reshape(shape)
    dtype = NUMPY_TYPES[datatype]
    if len(raw) != count * dtype.itemsize:
        raise FrameError(f"input {name!r}: {len(raw)} bytes given, shape {shape} of {datatype} takes "
                         f"{count * dtype.itemsize}")
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def encode(tensors: Iterable[Tensor]) -> tuple[str, bytes | memoryview]:
    """(header, body) of a frame holding ``tensors``. The body of one numeric tensor is a view of
    its array (no copy); several are joined (one copy)."""
    header, blobs = [], []
    for tensor in tensors:
        blob = raw_bytes(tensor.datatype, tensor.array)
        header.append({"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.array.shape),
                       "size": len(blob) if isinstance(blob, bytes) else blob.nbytes})
        blobs.append(blob)
    body = blobs[0] if len(blobs) == 1 else b"".join(blobs)
    return json.dumps(header, separators=(",", ":")), body


def _entry(item: object, position: int) -> tuple[str, str, list[int], int]:
    if not isinstance(item, dict):
        raise FrameError(f"tensor {position} of the frame is not an object")
    name, datatype, shape, size = item.get("name"), item.get("datatype"), item.get("shape"), item.get("size")
    if not isinstance(name, str) or datatype not in NUMPY_TYPES:
        raise FrameError(f"tensor {position} of the frame has no name or an unknown datatype {datatype!r}")
    if (not isinstance(shape, list) or len(shape) > 16
            or not all(type(d) is int and 0 <= d < 2**31 for d in shape)):
        raise FrameError(f"tensor {name!r}: shape must be a list of at most 16 sizes >= 0")
    if type(size) is not int or size < 0:
        raise FrameError(f"tensor {name!r}: size must be a byte count")
    return name, datatype, shape, size


def decode(header: str | None, body: bytes | memoryview) -> list[Tensor]:
    """The tensors of a frame, each an array over ``body``; ``FrameError`` names what is malformed."""
    if header is None:
        raise FrameError(f"the tensor frame has no {HEADER} header")
    if len(header) > MAX_HEADER_BYTES:
        raise FrameError(f"the tensor frame's header is longer than {MAX_HEADER_BYTES} bytes")
    try:
        entries = json.loads(header)
    except ValueError as exc:
        raise FrameError(f"the tensor frame's header is not JSON: {exc}") from None
    if not isinstance(entries, list) or len(entries) > MAX_TENSORS:
        raise FrameError(f"the tensor frame's header must list at most {MAX_TENSORS} tensors")
    view = memoryview(body).cast("B") if not isinstance(body, bytes) else memoryview(body)
    tensors, offset, names = [], 0, set()
    for position, item in enumerate(entries):
        name, datatype, shape, size = _entry(item, position)
        if name in names:
            raise FrameError(f"tensor {name!r} appears twice in the frame")
        names.add(name)
        if offset + size > len(view):
            raise FrameError(f"tensor {name!r}: its {size} bytes run past the end of the frame")
        tensors.append(Tensor(name, datatype, array_of(datatype, shape, view[offset:offset + size], name)))
        offset += size
    if offset != len(view):
        raise FrameError(f"the tensor frame has {len(view) - offset} bytes that no tensor claims")
    return tensors
