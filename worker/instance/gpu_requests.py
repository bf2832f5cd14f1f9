"""Tells the GPU's token manager when this instance serves a request (the shim's request API).

While a latency instance serves, the shim holds background launches on its GPU
(``dilu.policy.isolation``); the count lives in the shared region, so telling it costs two atomic
adds, no system call and no round trip. Without the shim (CPU instances) there is no API and
nothing to tell.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator


class RequestSignal:
    def __init__(self) -> None:
        process = ctypes.CDLL(None)
        try:
            self._begin, self._end = process.dilu_request_begin, process.dilu_request_end
        except AttributeError:
            self._begin = self._end = None
        else:
            self._begin.restype = self._end.restype = None

    @property
    def available(self) -> bool:
        return self._begin is not None

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """Counts a request as in flight for the duration of the block (queued in the instance or
        in a batch: either way the GPU is about to be needed)."""
        if self._begin is None:
            yield
            return
        self._begin()
        try:
            yield
        finally:
            self._end()
