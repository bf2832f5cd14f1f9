"""A model's configuration and statistics in Triton's shape (``/v2/models/{name}/config`` and
``/stats``, gRPC ``ModelConfig`` and ``ModelStatistics``), derived from the function's spec and
from what this gateway answered (``gateway.statistics``).

The configuration is what a client reads to build its requests: ``max_batch_size`` (the spec's
batch bound when every tensor has a first dimension of -1, the batch axis, which the dims then
leave out; else 0), each tensor's type and dims, an input's image ``format``, an output's
``label_filename``; and what Dilu runs it with (dynamic batching, instances, decoupled for a
text generator, which streams).
"""

from __future__ import annotations

from typing import Any

from dilu.spec import SpecModel, TensorSpec
from gateway.needs import Models
from gateway.statistics import ModelStats
from gateway.v2.inference import SERVER_NAME, Model, ProtocolError, find_model

BACKEND = "python"


def data_type(datatype: str) -> str:
    """Triton's configuration name of a protocol datatype (BYTES is TYPE_STRING there)."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def batch_bound(spec: SpecModel) -> int:
    """The configuration's ``max_batch_size``: 0 unless every tensor leads with the batch axis."""
    tensors = spec.inputs + spec.outputs
    if spec.batching.max_batch_size > 1 and tensors and all(t.shape and t.shape[0] == -1 for t in tensors):
        return spec.batching.max_batch_size
    return 0


def configuration(model: Model) -> dict[str, Any]:
    """Triton's JSON model configuration of ``model``."""
    spec, bound = model.spec, batch_bound(model.spec)

    def dims(tensor: TensorSpec) -> list[int]:
        return list(tensor.shape[1:] if bound else tensor.shape)

    inputs = [{"name": t.name, "data_type": data_type(t.datatype), "format": f"FORMAT_{t.format or 'NONE'}",
               "dims": dims(t)} for t in spec.inputs]
    outputs = [{"name": t.name, "data_type": data_type(t.datatype), "dims": dims(t),
                "label_filename": t.labels or ""} for t in spec.outputs]
    config: dict[str, Any] = {
        "name": model.name, "platform": SERVER_NAME, "backend": BACKEND, "max_batch_size": bound,
        "input": inputs, "output": outputs, "version_policy": {"latest": {"num_versions": 1}},
        "instance_group": [{"name": model.name, "count": spec.scaling.max_instances,
                            "kind": "KIND_CPU" if spec.resources.gpu is False else "KIND_GPU"}],
        "model_transaction_policy": {"decoupled": model.text or spec.generates == "text"},
    }
    if spec.batching.max_batch_size > 1:
        config["dynamic_batching"] = {"max_queue_delay_microseconds": int(spec.batching.max_wait_ms * 1000)}
    return config


def statistics(model: Model, kept: dict[int, ModelStats], version: str | None = None) -> list[dict[str, Any]]:
    """Triton's JSON statistics of a model: of ``version`` when given, else of its versions that
    answered here (its current one, with zero counts, when none did)."""
    if not version and not kept:
        version = model.version
    if version:
        stats = kept.get(int(version)) if version.isdigit() else None
        return [(stats or ModelStats()).to_wire(model.name, version)]
    return [stats.to_wire(model.name, str(number)) for number, stats in sorted(kept.items())]


async def every_model_statistics(services: Models) -> list[dict[str, Any]]:
    """The statistics of every function served over the protocol, by name."""
    found = []
    for name in sorted(services.functions.names()):
        try:
            model = await find_model(services, name)
        except ProtocolError:
            continue    # not served over the protocol
        found += statistics(model, services.invoker.stats.of(name))
    return found
