"""`dilu logs -f`: the lines a second read of a log's tail adds."""

from __future__ import annotations

import pytest

from cli.follow import new_lines


@pytest.mark.parametrize(("previous", "current", "fresh"), [
    ([], ["a", "b"], ["a", "b"]),
    (["a", "b"], ["a", "b"], []),
    (["a", "b"], ["a", "b", "c"], ["c"]),
    (["a", "b", "c"], ["b", "c", "d", "e"], ["d", "e"]),          # the tail window moved on
    (["x", "x"], ["x", "x", "x"], ["x"]),                         # repeated lines are not lost
    (["a", "b"], ["c", "d"], ["c", "d"]),                         # more was written than a read holds
])
def test_only_the_new_lines_are_printed(previous, current, fresh) -> None:
    assert new_lines(previous, current) == fresh
