"""How an instance reads a request body and writes its answer: JSON, or for a handler that takes
arrays (``arrays:`` in its spec) also the tensor frame of ``dilu.tensor_frames``.

Loaded at every instance start, so numpy and the frame module are imported only by a function
that takes arrays.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from dilu.instance_protocol import TENSOR_FRAME_TYPE, TENSORS_HEADER, InstanceConfig

try:   # in the platform's environment and the runtime images; the standard parser elsewhere
    import orjson

    loads: Callable[[bytes], Any] = orjson.loads
except ImportError:   # pragma: no cover - a function image built without it
    orjson = None
    loads = json.loads

JSON = "application/json"


class JsonCodec:
    """A handler of JSON values (the default)."""

    adapt = None

    def read_frame(self, header: str | None, body: bytes) -> Any:
        raise ValueError("this function takes JSON (its spec does not set arrays)")

    def write(self, output: Any, framed: bool) -> tuple[bytes | str, str, dict[str, str]]:
        """(body, media type, extra headers) of an answer."""
        return json.dumps(output, allow_nan=False), JSON, {}


class ArrayCodec:
    """A handler of arrays: frames in and out, and JSON (``/v1``) converted at the edges."""

    def __init__(self, config: InstanceConfig, device: str) -> None:
        from dilu import tensor_frames

        self._frames = tensor_frames
        self._kind = config.arrays or "numpy"
        self._device = device
        self._inputs = config.inputs or {}
        self._outputs = config.outputs or {}
        self._shapes = config.shapes

    def adapt(self, handler: Any) -> Any:
        from worker.instance.arrays import ArrayHandler

        return ArrayHandler(handler, self._inputs, self._outputs, self._kind, self._device, self._shapes)

    def read_frame(self, header: str | None, body: bytes) -> dict[str, Any]:
        tensors = self._frames.decode(header, body)
        given = {t.name: t.datatype for t in tensors}
        if given != self._inputs:
            raise ValueError(f"the frame holds {given}, the function takes {self._inputs}")
        return {t.name: t.array for t in tensors}

    def write(self, output: dict[str, Any], framed: bool) -> tuple[bytes | str, str, dict[str, str]]:
        if framed:
            tensors = [self._frames.Tensor(name, datatype, output[name]) for name, datatype in self._outputs.items()]
            header, body = self._frames.encode(tensors)
            return bytes(body), TENSOR_FRAME_TYPE, {TENSORS_HEADER: header}
        import numpy as np

        for name, array in output.items():
            if array.dtype.kind == "f" and not np.isfinite(array).all():
                raise ValueError(f"output {name!r} holds NaN or infinity, which JSON cannot carry")
        if orjson is not None and all(array.dtype != object for array in output.values()):
            try:   # written from the arrays' memory; a layout or type orjson refuses goes the long way
                return orjson.dumps({name: np.ascontiguousarray(array) for name, array in output.items()},
                                    option=orjson.OPT_SERIALIZE_NUMPY), JSON, {}
            except TypeError:
                pass
        return json.dumps({name: _listed(array) for name, array in output.items()}), JSON, {}


def _listed(array: Any) -> Any:
    """An array as nested lists; BYTES elements as text."""
    if array.dtype != object:
        return array.tolist()
    import numpy as np

    return np.vectorize(lambda item: item.decode("utf-8", "replace") if isinstance(item, bytes) else item,
                        otypes=[object])(array).tolist() if array.size else array.tolist()


def codec_for(config: InstanceConfig, device: str) -> JsonCodec | ArrayCodec:
    return ArrayCodec(config, device) if config.arrays else JsonCodec()
