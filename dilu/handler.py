"""The base class a function's handler may extend; the runtime server only needs the contract.

Contract (duck-typed, subclassing is optional):
- ``__init__(**options)`` receives the spec's ``model`` options as keyword arguments.
- ``load()`` is called exactly once before the instance reports ready; raising fails the instance.
- ``predict(inputs: list) -> list`` receives a batch of decoded JSON request bodies and returns
  one JSON-serialisable result per input, in order.
- A batch-class function (``class: batch``, a training loop) reports its progress with
  ``dilu.report_progress(units)``: the profiler sizes its slice by that rate.
- A streaming handler (text generation, step-by-step work) has ``start(request) -> state`` and
  ``step(states: list) -> list`` instead of (or beside) ``predict``: ``step`` advances every
  running request by one step and returns one chunk for each, ``Last(chunk)`` for a request's
  final one. Requests join and leave the running batch between steps. Optional
  ``finish(chunks) -> result`` makes the whole answer a plain (not streamed) request gets;
  without it, that answer is the list of chunks.
- A function whose spec names ``weights`` (a safetensors artifact) reads them with
  ``dilu.weights()`` (in ``load()`` or later): ``{name: tensor}``, mapped from the host's copy of
  the file, not read or unpickled; on a GPU instance already on its device.
- An input the handler cannot accept is the caller's fault: raise ``InputError`` (or return an
  ``InputError`` in its place) and that request is answered 422 with the message. Any other
  exception is answered 500 with its message. Either way, when a batch fails the runtime runs
  its halves again (recursively), so only the requests that fail on their own get the error.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

_progress_lock = threading.Lock()
_progress_units = 0.0


def report_progress(units: float = 1.0) -> None:
    """Records ``units`` of work done (samples, steps, tokens: any unit, used consistently).

    The progress hook of batch-class functions (training, offline work): the profiler measures
    the rate of progress at each compute share, and ``dilu describe`` shows the current rate.
    Thread-safe and cheap; call it from the training loop as often as convenient.
    """
    global _progress_units
    with _progress_lock:
        _progress_units += units


def progress_units() -> float:
    """All units reported so far in this process."""
    return _progress_units


_weights: dict[str, Any] | None = None


def weights() -> dict[str, Any]:
    """The function's weights, ``{tensor name: tensor}``: torch tensors on the instance's device
    when torch is installed, else read-only numpy arrays. On the CPU they are views of the mapped
    file (instances on one host share its pages): a numpy array refuses writes, a write to a
    torch tensor gives this instance a private copy of the pages it touches (the file and other
    instances are never changed). RuntimeError when the spec names no ``weights``."""
    if _weights is None:
        raise RuntimeError("this function has no weights: name a safetensors file as `weights:` in its spec")
    return _weights


def set_weights(tensors: dict[str, Any]) -> None:
    """The runtime's side of ``weights()``: called once, before the handler is built."""
    global _weights
    _weights = tensors


class InputError(ValueError):
    """The request's input is unusable (the caller's fault); answered 422 with this message."""


@dataclass(frozen=True)
class Last:
    """What ``step`` returns in a request's place for its final chunk (``None``: no chunk, just the
    end); the request then leaves the running batch."""

    chunk: Any = None


class Handler:
    """Convenience base: keeps the options and exposes the device chosen for the instance."""

    def __init__(self, **options: Any) -> None:
        self.options = options
        from dilu.instance_protocol import InstanceEnvironment

        # The worker sets DILU_DEVICE to "cuda" on GPU workers and "cpu" elsewhere.
        self.device = InstanceEnvironment.from_environ().device

    def load(self) -> None:
        """Load weights and warm up; called once."""

    def report_progress(self, units: float = 1.0) -> None:
        """Batch-class functions: records ``units`` of work done (see ``dilu.report_progress``)."""
        report_progress(units)

    def predict(self, inputs: list[Any]) -> list[Any]:  # pragma: no cover - abstract
        raise NotImplementedError
