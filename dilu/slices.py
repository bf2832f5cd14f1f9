"""The one owner of an instance's compute slice: what placement counts, workers enforce and rows record.

An instance's slice is, in order: the spec's pinned ``sm_request``/``sm_limit``; else its
version's finished profile; else the default below. The controller always hands workers a
concrete slice, so placement, enforcement and accounting never disagree about what an unprofiled
instance holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dilu.spec import FunctionSpec

# Until a profile says otherwise, an instance is guaranteed a quarter of its device and may
# burst to all of it.
DEFAULT_SM_REQUEST = 0.25
DEFAULT_SM_LIMIT = 1.0


@dataclass(frozen=True)
class Slice:
    sm_request: float
    sm_limit: float
    batch: int


def effective_slice(spec: FunctionSpec, profile: Any | None) -> Slice:
    """The slice and batch size instances of a function version run with.

    ``profile`` is the version's profile row (or None); its batch never exceeds the spec's
    ``max_batch_size``, the user's bound.
    """
    resources, max_batch = spec.resources, spec.batching.max_batch_size
    if resources.sm_request is not None and resources.sm_limit is not None:
        return Slice(resources.sm_request, resources.sm_limit, max_batch)
    if profile is not None and profile.status == "done":
        batch = min(profile.batch or max_batch, max_batch) if profile.kind == "inference" else max_batch
        return Slice(profile.sm_request, profile.sm_limit, batch)
    return Slice(*default_slice(None, resources.sm_limit), max_batch)


def default_slice(sm_request: float | None, sm_limit: float | None) -> tuple[float, float]:
    """(request, limit) with the defaults filled in, request never above limit."""
    limit = sm_limit if sm_limit is not None else DEFAULT_SM_LIMIT
    request = sm_request if sm_request is not None else DEFAULT_SM_REQUEST
    return min(request, limit), limit
