"""The classification extension: an output asked for with ``classification: N`` (a requested
output's parameter, what tritonclient's ``class_count`` sends) comes back as its N highest scores
per batch row, each a BYTES element ``"score:index:label"`` (``"score:index"`` without a labels
file), highest first, as Triton answers it.

Labels come from the file the output's spec names (``labels``), read once per function version
from its folder or bundle.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

import numpy as np

from dilu.bundles import read_code_file
from dilu.db import repo
from dilu.spec import TensorSpec
from gateway.needs import Stored
from gateway.v2.inference import Model, ProtocolError, Result
from gateway.v2.model_info import batch_bound

MAX_CLASSES = 10_000
LABELS_KEPT = 64      # (function, version, file) label lists cached
_labels: OrderedDict[tuple[str, str, str], list[str]] = OrderedDict()


def class_count(value: object, output: str) -> int:
    """A request's ``classification`` parameter, checked."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CLASSES:
        raise ProtocolError(400, f"output {output!r}: classification must be a count of classes from 1 to "
                                 f"{MAX_CLASSES}, not {value!r}")
    return value


async def _labels_of(services: Stored, model: Model, spec: TensorSpec) -> list[str] | None:
    if spec.labels is None:
        return None
    key = (model.name, model.version, spec.labels)
    if key in _labels:
        _labels.move_to_end(key)
        return _labels[key]

    def load() -> list[str]:
        with services.sessions() as session:
            row = repo.get_function(session=session, name=model.name)
            if row is None:
                raise KeyError(spec.labels)
            bundle = repo.get_bundle_data(session=session, digest=row.bundle) if row.bundle else None
            return read_code_file(row.source_dir, bundle, spec.labels).decode("utf-8", "replace").splitlines()

    try:
        labels = await asyncio.to_thread(load)
    except KeyError:
        raise ProtocolError(500, f"output {spec.name!r}: its labels file {spec.labels!r} cannot be read") from None
    _labels[key] = labels
    while len(_labels) > LABELS_KEPT:
        _labels.popitem(last=False)
    return labels


def _top(scores: np.ndarray, count: int, labels: list[str] | None) -> list[bytes]:
    order = np.argsort(-scores, kind="stable")[:count]
    named = []
    for index in order:
        text = f"{float(scores[index]):f}:{int(index)}"
        if labels is not None and index < len(labels):
            text += f":{labels[index]}"
        named.append(text.encode())
    return named


async def classify(services: Stored, result: Result, counts: dict[str, int]) -> Result:
    """``result`` with each output in ``counts`` replaced by its top classes."""
    model, batched = result.model, batch_bound(result.model.spec) > 0
    outputs = []
    for spec, array in result.outputs:
        count = counts.get(spec.name)
        if count is None:
            outputs.append((spec, array))
            continue
        if spec.datatype == "BYTES" or spec.datatype == "BOOL":
            raise ProtocolError(400, f"output {spec.name!r} holds {spec.datatype}, not scores to classify")
        labels = await _labels_of(services, model, spec)
        rows = array.reshape(array.shape[0], -1) if batched and array.ndim > 1 else array.reshape(1, -1)
        top = np.array([_top(row.astype(np.float64), count, labels) for row in rows], dtype=object)
        if not (batched and array.ndim > 1):
            top = top.reshape(-1)
        outputs.append((TensorSpec(name=spec.name, datatype="BYTES", shape=[-1] * top.ndim), top))
    return Result(model=model, outputs=outputs, id=result.id, headers=result.headers)
