"""Handlers that take arrays (``arrays:`` in the spec): requests stacked into one batch of arrays.

The handler's ``predict({input name: array}) -> {output name: array}`` sees a batch as one array
per input, the requests concatenated along the first axis (one request: its arrays as they
came, over the request's own bytes). Each output is cut back into the requests' rows. Requests
whose other dimensions differ cannot share an array, so they are run as separate groups.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dilu.handler import InputError
from dilu.tensor_frames import NUMPY_TYPES, Tensor

Arrays = dict[str, np.ndarray]


def from_json(payload: Any, inputs: dict[str, str], shapes: dict[str, list[int]] | None = None) -> Arrays:
    """A JSON request (``{input name: nested list}``, as ``/v1`` and warm-ups send it) as arrays
    of the declared datatypes and ``shapes`` (-1: any size); ``InputError`` names what does not fit."""
    if not isinstance(payload, dict):
        raise InputError(f"the request must be an object of inputs by name ({', '.join(inputs)})")
    missing = inputs.keys() - payload.keys()
    unknown = payload.keys() - inputs.keys()
    if missing or unknown:
        raise InputError(f"the inputs are {', '.join(inputs)}"
                         + (f"; missing: {', '.join(sorted(missing))}" if missing else "")
                         + (f"; unknown: {', '.join(sorted(unknown))}" if unknown else ""))
    arrays = {}
    for name, datatype in inputs.items():
        value = payload[name]
        try:
            if datatype == "BYTES":
                arrays[name] = np.vectorize(lambda item: item.encode("utf-8") if isinstance(item, str) else item,
                                            otypes=[object])(np.array(value, dtype=object))
            else:
                arrays[name] = np.array(value, dtype=NUMPY_TYPES[datatype])
        except (ValueError, TypeError, OverflowError) as exc:
            raise InputError(f"input {name!r} is not a {datatype} tensor: {exc}") from None
        declared = (shapes or {}).get(name)
        actual = arrays[name].shape
        if declared is not None and (len(declared) != len(actual)
                                     or any(d not in (-1, a) for d, a in zip(declared, actual, strict=True))):
            raise InputError(f"input {name!r}: shape {list(actual)} does not fit the declared shape {declared}")
    return arrays


class ArrayHandler:
    """Wraps a handler that takes arrays in the runtime's ``predict(list) -> list`` contract."""

    def __init__(self, handler: Any, inputs: dict[str, str], outputs: dict[str, str], kind: str = "numpy",
                 device: str = "cpu", shapes: dict[str, list[int]] | None = None) -> None:
        self._handler = handler
        self._inputs = inputs
        self._shapes = shapes
        self._outputs = outputs
        self._torch = kind == "torch"
        self._device = device

    def predict(self, requests: list[Arrays | Any]) -> list[Arrays]:
        """One result per request, in order; a request may be arrays or its JSON form."""
        requests = [r if _all_arrays(r, self._inputs) else from_json(r, self._inputs, self._shapes) for r in requests]
        results: list[Arrays | None] = [None] * len(requests)
        for group in _groups(requests):
            for position, result in zip(group, self._run([requests[p] for p in group]), strict=True):
                results[position] = result
        return results   # type: ignore[return-value]   # every position belongs to one group

    def _run(self, requests: list[Arrays]) -> list[Arrays]:
        rows = [_rows(r) for r in requests]
        if len(requests) == 1:
            batch = requests[0]
        else:
            batch = {name: np.concatenate([r[name] for r in requests]) for name in self._inputs}
        produced = self._handler.predict(self._to_handler(batch))
        if not isinstance(produced, dict):
            raise TypeError(f"predict() of a handler that takes arrays returns {{output name: array}}, got "
                            f"{type(produced).__name__}")
        outputs = {name: self._output(name, produced) for name in self._outputs}
        if len(requests) == 1:
            return [outputs]
        total = sum(rows)
        for name, array in outputs.items():
            if array.ndim == 0 or array.shape[0] != total:
                raise ValueError(f"output {name!r} has {array.shape[0] if array.ndim else 'no'} rows for a batch "
                                 f"of {total}: each output's first axis is the batch's")
        cuts = np.cumsum(rows)[:-1]
        pieces = {name: np.split(array, cuts) for name, array in outputs.items()}
        return [{name: pieces[name][i] for name in outputs} for i in range(len(requests))]

    def _to_handler(self, batch: Arrays) -> dict[str, Any]:
        if not self._torch:
            return batch
        import torch

        def tensor(array: np.ndarray) -> Any:
            if array.dtype == object:    # BYTES: torch has no such tensor
                return array
            # A frame's arrays are read-only views of the request; torch wants memory it may write.
            own = array if array.flags.writeable else array.copy()
            return torch.from_numpy(own).to(self._device)

        return {name: tensor(array) for name, array in batch.items()}

    def _output(self, name: str, produced: dict[str, Any]) -> np.ndarray:
        if name not in produced:
            raise KeyError(f"predict() returned no output {name!r} (it returned {', '.join(map(str, produced))})")
        value = produced[name]
        if hasattr(value, "detach") and hasattr(value, "cpu"):   # a torch tensor, on any device
            value = value.detach().cpu().numpy()
        datatype = self._outputs[name]
        try:
            return np.asarray(value, dtype=NUMPY_TYPES[datatype])
        except (ValueError, TypeError, OverflowError) as exc:
            raise TypeError(f"output {name!r} is not a {datatype} tensor: {exc}") from None


def _all_arrays(request: Any, inputs: dict[str, str]) -> bool:
    return isinstance(request, dict) and request.keys() == inputs.keys() and all(
        isinstance(value, np.ndarray) for value in request.values())


def _rows(request: Arrays) -> int:
    first = next(iter(request.values()))
    return first.shape[0] if first.ndim else 1


def _signature(request: Arrays) -> tuple:
    """Requests with equal signatures stack: every input has at least one axis, the same number
    of rows, and the same other dimensions as the other requests'."""
    shapes = tuple((name, array.shape) for name, array in sorted(request.items()))
    rows = {shape[0] if shape else None for _, shape in shapes}
    if None in rows or len(rows) != 1:
        return ("alone", id(request))
    return tuple((name, shape[1:]) for name, shape in shapes)


def _groups(requests: list[Arrays]) -> list[list[int]]:
    groups: dict[tuple, list[int]] = {}
    for position, request in enumerate(requests):
        groups.setdefault(_signature(request), []).append(position)
    return list(groups.values())


def response_tensors(outputs: Arrays, declared: dict[str, str]) -> list[Tensor]:
    """A result's outputs in declared order, for a frame."""
    return [Tensor(name, datatype, outputs[name]) for name, datatype in declared.items()]
