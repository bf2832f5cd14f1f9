"""Fencing: what a controller's decisions carry so that a deposed leader's late ones are refused.

Every decision a leading controller makes carries the term of its lease (``dilu.db.lease``). The
database refuses a write whose term is no longer the lease's; a worker refuses an order older
than the newest term it has been sent; the state store refuses routes from an older term. A
leader paused past its lease (SIGSTOP, a long GC, a partition) therefore wakes to refusals, not
to a second controller's worth of starts and stops.
"""

from __future__ import annotations

TERM_HEADER = "x-dilu-term"   # on every call a controller makes to a worker


class Deposed(Exception):
    """A decision made in a term that has ended: another controller leads now."""

    def __init__(self, term: int, current: int | None) -> None:
        self.term, self.current = term, current
        now = f"term {current} leads now" if current is not None else "no lease is held now"
        super().__init__(f"refused: this decision was made in controller term {term}, and {now}")


class TermWatermark:
    """The newest term a party has been told of; an order from an older one is refused."""

    def __init__(self) -> None:
        self.newest = 0

    def admit(self, term: int) -> bool:
        """Whether an order of ``term`` may be carried out (raising the watermark to it)."""
        if term < self.newest:
            return False
        self.newest = term
        return True
