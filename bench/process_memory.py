"""The memory a process tree holds: RSS and PSS summed over a process and all its descendants.

PSS (proportional set size) splits each shared page among the processes that map it, so forks
of one zygote are not counted once per fork as RSS counts them; both are in MiB.
"""

from __future__ import annotations

import time
from pathlib import Path


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        tree.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return tree


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    tree, found, queue = _children(), [], [pid]
    while queue:
        current = queue.pop()
        found.append(current)
        queue += tree.get(current, [])
    return found


def tree_memory_mib(pid: int) -> tuple[float, float, int]:
    """(RSS, PSS, processes) of ``pid``'s tree; processes that ended meanwhile are left out."""
    rss = pss = 0
    count = 0
    for each in descendants(pid):
        try:
            rollup = Path(f"/proc/{each}/smaps_rollup").read_text()
        except OSError:
            continue
        count += 1
        for line in rollup.splitlines():
            if line.startswith("Rss:"):
                rss += int(line.split()[1])
            elif line.startswith("Pss:"):
                pss += int(line.split()[1])
    return rss / 1024, pss / 1024, count


def settled_memory_mib(pid: int, timeout_s: float = 90.0) -> tuple[float, float, int]:
    """The tree's memory once it stops changing (its spares done importing): three readings a
    second apart within 2 % and the same processes, or the last reading at ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    readings = [tree_memory_mib(pid)]
    while time.monotonic() < deadline:
        time.sleep(1.0)
        readings = [*readings[-2:], tree_memory_mib(pid)]
        if len(readings) == 3 and len({count for _, _, count in readings}) == 1 and \
                max(pss for _, pss, _ in readings) <= 1.02 * min(pss for _, pss, _ in readings):
            break
    return readings[-1]
