"""What gateways tell the controller about a function for its workflows' sake (pure, clock passed).

One message per function, ``WorkflowHint``: until when a workflow request will need it (keep it,
or load it), until when it may be unloaded as soon as it is idle (its loading hides in a
workflow's slack), and when it last served a request that did not come from a workflow (a
function that serves direct traffic is never released early). Each gateway keeps its own
``WorkflowHints`` and publishes a snapshot with its activity; the controller merges the
gateways' hints (the latest of each) and decides with ``releasable`` and ``expected``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

DIRECT_QUIET_S = 60.0     # a function that served a direct request this recently is never released early


@dataclass(frozen=True)
class WorkflowHint:
    expected_until: float | None = None       # a workflow will need it until then (unix time)
    release_idle_until: float | None = None   # until then it may be unloaded once idle
    direct_at: float | None = None            # the latest request that did not come from a workflow

    def expected(self, now: float) -> bool:
        return self.expected_until is not None and self.expected_until > now

    def releasable(self, now: float, quiet_s: float = DIRECT_QUIET_S) -> bool:
        """Whether the function may be unloaded once idle: a gateway said so lately, and no
        direct request came in the last ``quiet_s``."""
        return (self.release_idle_until is not None and self.release_idle_until > now
                and (self.direct_at is None or now - self.direct_at > quiet_s))

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, data: dict[str, Any] | None) -> WorkflowHint:
        data = data or {}
        return cls(*(None if data.get(k) is None else float(data[k])
                     for k in ("expected_until", "release_idle_until", "direct_at")))


def merge_hints(hints: list[WorkflowHint]) -> WorkflowHint:
    """The gateways' hints as one: the latest of each field (a direct request at any gateway counts)."""
    def latest(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return max(known) if known else None

    return WorkflowHint(latest([h.expected_until for h in hints]), latest([h.release_idle_until for h in hints]),
                        latest([h.direct_at for h in hints]))


class WorkflowHints:
    """One gateway's hints. An expectation has an owner (a request, a pre-warm, a hold), which may
    withdraw it sooner (``fulfilled``) or hand it over (``take_over``); the latest of all counts."""

    def __init__(self) -> None:
        self._expected: dict[str, dict[object, float]] = {}    # function: {who expects it: until}
        self._release: dict[str, float] = {}
        self._direct: dict[str, float] = {}

    def expect(self, function: str, until: float, owner: object = None) -> None:
        """A workflow will need ``function`` until ``until`` (unix time)."""
        mine = self._expected.setdefault(function, {})
        mine[owner] = max(until, mine.get(owner, 0.0))

    def expects(self, function: str, now: float) -> bool:
        """Whether anyone still expects ``function`` at ``now``."""
        return any(until > now for until in self._expected.get(function, {}).values())

    def fulfilled(self, function: str, owner: object) -> None:
        """``owner`` no longer needs ``function``: only others' expectations keep it."""
        mine = self._expected.get(function)
        if mine is not None:
            mine.pop(owner, None)

    def take_over(self, function: str, previous: object, owner: object, until: float) -> bool:
        """``owner`` takes over ``previous``'s expectation of ``function`` (now until ``until``);
        False, and nothing changes, when ``previous`` has none."""
        mine = self._expected.get(function)
        if mine is None or previous not in mine:
            return False
        del mine[previous]
        mine[owner] = max(until, mine.get(owner, 0.0))
        return True

    def release_when_idle(self, function: str, until: float) -> None:
        """Until ``until``, ``function`` may be unloaded as soon as it is idle."""
        self._release[function] = max(until, self._release.get(function, 0.0))

    def releasable_now(self, function: str, now: float) -> bool:
        return self._release.get(function, 0.0) > now

    def direct(self, function: str, now: float) -> None:
        """``function`` served a request that did not come from a workflow at ``now``."""
        self._direct[function] = now

    def functions(self) -> set[str]:
        return set(self._expected) | set(self._release) | set(self._direct)

    def snapshot(self, now: float) -> dict[str, WorkflowHint]:
        """Each function's hint at ``now``; what has run out is forgotten."""
        self._expected = {name: live for name, owners in self._expected.items()
                          if (live := {owner: until for owner, until in owners.items() if until > now})}
        self._release = {name: until for name, until in self._release.items() if until > now}
        return {name: WorkflowHint(max(self._expected[name].values()) if name in self._expected else None,
                                   self._release.get(name), self._direct.get(name))
                for name in self.functions()}
