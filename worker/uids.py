"""One unprivileged user per function on a host: uids from a configured range, recorded.

A root worker runs each function's instances as a uid of their own (its group the same number,
no supplementary groups), so one function cannot read another's code, files or ``/proc``
(environment, working folder): the kernel refuses those across users. The uid is recorded in a
host-wide file (guarded by ``flock``, so every worker on the host agrees) and reused for the
function's later instances; it is never handed to another function. Entries of a platform
whose state folder is gone are forgotten, so the range is not used up by finished platforms; a
uid is handed out again only once no process of it runs (one that outlived its platform would
otherwise become the next function's).
"""

from __future__ import annotations

import fcntl
import json
import os
import pwd
from dataclasses import dataclass
from pathlib import Path

DEFAULT_REGISTRY = Path("/var/lib/dilu/instance-uids.json")


@dataclass(frozen=True)
class InstanceUser:
    uid: int
    gid: int
    name: str


class UidRegistry:
    """``user_for(function)``: the function's own user on this host."""

    def __init__(self, path: Path, uid_range: tuple[int, int], namespace: Path) -> None:
        self._path = path
        self._first, self._last = uid_range
        self._namespace = str(namespace.resolve())    # this platform (its state folder)
        self._known: dict[str, InstanceUser] = {}

    def user_for(self, function: str) -> InstanceUser:
        known = self._known.get(function)
        if known is not None:
            return known
        key = f"{self._namespace}\n{function}"
        self._path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
        with os.fdopen(fd, "r+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            text = handle.read()
            table: dict[str, int] = json.loads(text) if text.strip() else {}
            uid = table.get(key)
            if uid is None:
                table = {k: v for k, v in table.items() if os.path.isdir(k.partition("\n")[0])}
                uid = self._free(set(table.values()))
                table[key] = uid
                handle.seek(0)
                handle.truncate()
                handle.write(json.dumps(table))
                handle.flush()
                os.fsync(handle.fileno())
        user = InstanceUser(uid, uid, f"dilu-{uid}")
        self._known[function] = user
        return user

    def _free(self, taken: set[int]) -> int:
        running = _uids_running()   # a uid forgotten while its processes live on is not free yet
        for uid in range(self._first, self._last + 1):
            if uid not in taken and uid not in running and not _has_account(uid):
                return uid
        raise RuntimeError(f"every uid of the instance range {self._first}-{self._last} is taken "
                           "(DILU_INSTANCE_UIDS): widen it")


def _uids_running() -> set[int]:
    """Every uid (real, effective, saved or file-system) a process of the host has now: read from
    each process's status, which a process cannot hide as it can its /proc folder's owner."""
    uids: set[int] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status") as status:
                for line in status:
                    if line.startswith("Uid:"):
                        uids.update(int(uid) for uid in line.split()[1:])
                        break
        except (OSError, ValueError):
            pass   # ended meanwhile
    return uids


def _has_account(uid: int) -> bool:
    """Whether a user of the host already has this uid (its files would be the function's)."""
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True
