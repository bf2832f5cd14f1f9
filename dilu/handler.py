"""The base class a function's handler may extend; the runtime server only needs the contract.

Contract (duck-typed, subclassing is optional):
- ``__init__(**options)`` receives the spec's ``model`` options as keyword arguments.
- ``load()`` is called exactly once before the instance reports ready; raising fails the instance.
- ``predict(inputs: list) -> list`` receives a batch of decoded JSON request bodies and returns
  one JSON-serialisable result per input, in order.
"""

from __future__ import annotations

from typing import Any


class Handler:
    """Convenience base: keeps the options and exposes the device chosen for the instance."""

    def __init__(self, **options: Any) -> None:
        self.options = options
        from dilu.config import InstanceSettings

        # The worker sets DILU_DEVICE to "cuda" on GPU workers and "cpu" elsewhere.
        self.device = InstanceSettings().device

    def load(self) -> None:
        """Load weights and warm up; called once."""

    def predict(self, inputs: list[Any]) -> list[Any]:  # pragma: no cover - abstract
        raise NotImplementedError
