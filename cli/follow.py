"""`dilu logs -f`: what is new in a log read again as its last lines (pure)."""

from __future__ import annotations


def new_lines(previous: list[str], current: list[str]) -> list[str]:
    """The lines of ``current`` (a log's last lines, read now) that ``previous`` (its last lines,
    read before) did not end with: the longest end of ``previous`` that begins ``current`` is
    what both saw. With no overlap the whole of ``current`` is new (more was written between
    the two reads than a read holds)."""
    for overlap in range(min(len(previous), len(current)), 0, -1):
        if previous[-overlap:] == current[:overlap]:
            return current[overlap:]
    return current
