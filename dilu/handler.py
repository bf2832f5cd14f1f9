"""The base class a function's handler may extend; the runtime server only needs the contract.

Contract (duck-typed, subclassing is optional):
- ``__init__(**options)`` receives the spec's ``model`` options as keyword arguments.
- ``load()`` is called exactly once before the instance reports ready; raising fails the instance.
- ``predict(inputs: list) -> list`` receives a batch of decoded JSON request bodies and returns
  one JSON-serialisable result per input, in order.
- An input the handler cannot accept is the caller's fault: raise ``InputError`` (or return an
  ``InputError`` in its place) and that request is answered 422 with the message. Any other
  exception is answered 500 with its message. Either way, when a batch fails the runtime runs
  its halves again (recursively), so only the requests that fail on their own get the error.
"""

from __future__ import annotations

from typing import Any


class InputError(ValueError):
    """The request's input is unusable (the caller's fault); answered 422 with this message."""


class Handler:
    """Convenience base: keeps the options and exposes the device chosen for the instance."""

    def __init__(self, **options: Any) -> None:
        self.options = options
        from dilu.instance_protocol import InstanceEnvironment

        # The worker sets DILU_DEVICE to "cuda" on GPU workers and "cpu" elsewhere.
        self.device = InstanceEnvironment.from_environ().device

    def load(self) -> None:
        """Load weights and warm up; called once."""

    def predict(self, inputs: list[Any]) -> list[Any]:  # pragma: no cover - abstract
        raise NotImplementedError
