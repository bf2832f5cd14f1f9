"""The loads one gateway asked for, as spans of time (pure, monotonic times passed in).

A span is a function's load from when it was asked for until it became routable, owned by the
request (or pre-warm) that asked. Node runs are compared against the spans to tell a run beside
other functions' loads from one alone (``dilu.workflows.history``).
"""

from __future__ import annotations

from dataclasses import dataclass

KEPT_S = 300.0      # how long a finished load's span is kept to compare node runs against


@dataclass(eq=False)
class LoadSpan:
    function: str
    began: float
    owner: object = None
    ended: float | None = None      # None: still in flight


class LoadSpans:
    def __init__(self) -> None:
        self._spans: list[LoadSpan] = []

    def begin(self, function: str, at: float, owner: object = None) -> LoadSpan:
        """A load for ``owner`` is in flight from ``at``; ``end`` closes it. An earlier load of the
        function still in flight ends here: from now on this one covers it (and it may never have
        started: see ``superseded``)."""
        self._spans = [s for s in self._spans if s.ended is None or at - s.ended < KEPT_S]
        for older in self._spans:
            if older.function == function and older.ended is None:
                older.ended = at
        span = LoadSpan(function, at, owner)
        self._spans.append(span)
        return span

    @staticmethod
    def end(span: LoadSpan, at: float) -> None:
        span.ended = at

    def adopt(self, function: str, previous: object, owner: object) -> None:
        """``owner`` took over ``previous``'s load of ``function`` still in flight (a request
        arrived while its pre-warm was loading): that load is now the request's own."""
        for span in self._spans:
            if span.function == function and span.ended is None and span.owner is previous:
                span.owner = owner

    def in_flight(self, function: str, owner: object) -> LoadSpan | None:
        """``owner``'s load of ``function`` still in flight: a node reached before the load its
        request asked for (or took over) is done waits for that same load, which goes on being
        timed from when it was asked for (a pre-warm that came late counts as late)."""
        return next((s for s in self._spans if s.function == function and s.ended is None and s.owner is owner),
                    None)

    def superseded(self, span: LoadSpan) -> bool:
        """Whether a newer load of the span's function began before this one became routable: a
        load asked for and then no longer needed is never started, and becomes routable only
        through the next request's load; its time says nothing of how long loading takes."""
        return any(other is not span and other.function == span.function and other.began > span.began
                   for other in self._spans)

    def overlaps(self, function: str, began: float, ended: float) -> dict[str, float]:
        """How long other functions' loads overlapped a run of ``function`` from ``began`` to
        ``ended`` (the longest span of each: one load may have two, planned then reached cold)."""
        result: dict[str, float] = {}
        for span in self._spans:
            overlap = min(ended, span.ended if span.ended is not None else ended) - max(began, span.began)
            if span.function != function and overlap > 0:
                result[span.function] = max(result.get(span.function, 0.0), overlap)
        return result
