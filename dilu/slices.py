"""An instance's compute slice, one type from the API to the token manager (``ComputeSlice``),
and the slice a function version's instances run with (``effective_slice``).

A slice is checked where it enters (a spec, the resize API, a worker's API: ``ComputeSlice.checked``),
travels unchanged as this type (on the wire as ``{"sm_request", "sm_limit"}``), and is clamped
only where it is enforced (the token manager). A version's slice is, in order: the spec's pinned
``sm_request``/``sm_limit``; else its finished profile; else ``DEFAULT_SLICE``. The controller
always hands workers a concrete slice, so placement, enforcement and accounting never disagree
about what an unprofiled instance holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:   # the spec validates its slice here: no import at run time
    from dilu.spec import FunctionSpec

MIN_SHARE = 0.01      # the smallest share a slice may name
MAX_SHARE = 1.0       # a whole device


class SliceError(ValueError):
    """A slice that is not one: the message names what is wrong."""


@dataclass(frozen=True)
class ComputeSlice:
    """The share of its device an instance is guaranteed (``request``) and may use at most
    (``limit``), each in [MIN_SHARE, MAX_SHARE], request <= limit."""

    request: float
    limit: float

    @classmethod
    def checked(cls, request: float, limit: float) -> ComputeSlice:
        """The slice, or SliceError naming the problem: the one check every entry point uses."""
        for name, value in (("sm_request", request), ("sm_limit", limit)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) \
                    or not MIN_SHARE <= value <= MAX_SHARE:
                raise SliceError(f"{name} must be a number from {MIN_SHARE:g} to {MAX_SHARE:g}, not {value!r}")
        if request > limit:
            raise SliceError(f"sm_request must be <= sm_limit (got {request:g} > {limit:g})")
        return cls(float(request), float(limit))

    def to_wire(self) -> dict[str, float]:
        return {"sm_request": self.request, "sm_limit": self.limit}

    @classmethod
    def from_wire(cls, data: Any) -> ComputeSlice:
        """A slice sent as ``{"sm_request": r, "sm_limit": l}``, checked."""
        if not isinstance(data, dict) or "sm_request" not in data or "sm_limit" not in data:
            raise SliceError("a slice is an object with sm_request and sm_limit")
        return cls.checked(data["sm_request"], data["sm_limit"])


# Until a profile says otherwise, an instance is guaranteed a quarter of its device and may
# burst to all of it.
DEFAULT_SLICE = ComputeSlice(0.25, 1.0)


@dataclass(frozen=True)
class Slice:
    """What a function version's instances run with: their compute slice and batch size."""

    compute: ComputeSlice
    batch: int


def effective_slice(spec: FunctionSpec, profile: Any | None) -> Slice:
    """The slice and batch size instances of a function version run with.

    ``profile`` is the version's profile row (or None); its batch never exceeds the spec's
    ``max_batch_size``, the user's bound.
    """
    resources, max_batch = spec.resources, spec.batching.max_batch_size
    if resources.sm_request is not None and resources.sm_limit is not None:
        return Slice(ComputeSlice(resources.sm_request, resources.sm_limit), max_batch)
    if profile is not None and profile.status == "done":
        batch = min(profile.batch or max_batch, max_batch) if profile.kind == "inference" else max_batch
        return Slice(ComputeSlice(profile.sm_request, profile.sm_limit), batch)
    if resources.sm_limit is not None:      # a limit alone: the default request, never above it
        return Slice(ComputeSlice(min(DEFAULT_SLICE.request, resources.sm_limit), resources.sm_limit), max_batch)
    return Slice(DEFAULT_SLICE, max_batch)
