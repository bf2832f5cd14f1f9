"""A handler's failures at request time, in the instance's log (what `dilu logs` shows): the
traceback of each distinct failure once (its type and the line that raised it), a bounded
number of them, so a failure on every request neither floods the log nor goes unseen. A
refusal of the caller's input (``dilu.InputError``) is the caller's to read, not logged."""

from __future__ import annotations

import logging
import traceback

from dilu.handler import InputError

log = logging.getLogger("dilu.handler")
DISTINCT_KEPT = 100


class HandlerFailures:
    def __init__(self) -> None:
        self._seen: set[tuple[str, str, int]] = set()

    def failed(self, exc: BaseException, during: str) -> None:
        """Logs ``exc`` (raised by the handler's ``during``, e.g. ``predict``) unless seen before."""
        if isinstance(exc, InputError):
            return
        frames = traceback.extract_tb(exc.__traceback__)
        where = (frames[-1].filename, frames[-1].lineno or 0) if frames else ("", 0)
        key = (type(exc).__name__, *where)
        if key in self._seen or len(self._seen) >= DISTINCT_KEPT:
            return
        self._seen.add(key)
        text = "".join(traceback.format_exception(exc)).rstrip()
        log.error("%s() failed (logged once for this error; it is each failing request's 500):\n%s", during, text)
