"""Maps a function's safetensors weights into the instance, then copies them to its device.

Mapping reads no tensor data: tensors are views of the file's pages (the host's page cache, so
a second instance on the host maps the pages the first one faulted in). On a GPU, ``to_device``
is the one copy of each tensor from those pages to the device. The file was checked at upload
(``dilu.artifacts.check_safetensors``); a failure here is still a load failure with its reason.
"""

from __future__ import annotations

import json
import sys
from typing import Any

# numpy's types of safetensors' datatypes (the others have none: a torch runtime maps them)
_NUMPY_TYPES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16", "F16": "float16",
                "U32": "uint32", "I32": "int32", "F32": "float32", "U64": "uint64", "I64": "int64", "F64": "float64"}


def map_weights(path: str) -> dict[str, Any]:
    """``{name: tensor}`` over the mapped file: torch tensors when torch is importable (the
    handler's module usually imported it already), else read-only numpy arrays."""
    try:
        import torch  # noqa: F401 - the handler's own framework, when it has one
    except ImportError:
        return _map_numpy(path)
    from safetensors import safe_open

    with safe_open(path, framework="pt", device="cpu") as handle:
        return {name: handle.get_tensor(name) for name in handle.keys()}


def _map_numpy(path: str) -> dict[str, Any]:
    import numpy

    with open(path, "rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(length))
    mapped = numpy.memmap(path, dtype=numpy.uint8, mode="r")
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = _NUMPY_TYPES.get(entry["dtype"])
        if dtype is None:
            raise ValueError(f"weight {name!r} is {entry['dtype']}, which numpy has no type for: install torch")
        begin, end = entry["data_offsets"]
        tensors[name] = mapped[8 + length + begin:8 + length + end].view(dtype).reshape(entry["shape"])
    return tensors


def to_device(tensors: dict[str, Any], device: str) -> bool:
    """Moves torch tensors to ``device`` in place of the mapped ones (True), when it is not the
    CPU; waits for the copies, so the stage's time is theirs."""
    torch = sys.modules.get("torch")
    if device == "cpu" or torch is None or not tensors:
        return False
    for name, tensor in tensors.items():
        tensors[name] = tensor.to(device)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return True
