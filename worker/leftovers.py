"""What a worker's instances leave on the host (cgroups, sandbox folders), on record in its state
folder, so that the next worker of the same id removes what a killed one could not.

Instance processes die with their worker (PR_SET_PDEATHSIG), but a worker killed with SIGKILL
runs no cleanup: its instances' cgroups and folders would stay behind for good. The record is
one empty file per instance, written before its groups are made and removed once they are.
"""

from __future__ import annotations

import re
from pathlib import Path

_SAFE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


class Leftovers:
    """The record of one worker's (``owner``'s) instances under ``state_dir``."""

    def __init__(self, state_dir: Path, owner: str) -> None:
        if not _SAFE.match(owner):
            raise ValueError(f"worker id {owner!r} cannot name a folder")
        self.folder = state_dir / "instances-of" / owner
        self.folder.mkdir(parents=True, exist_ok=True)

    def note(self, instance_id: str, sandbox_root: Path | None = None) -> None:
        """``instance_id`` may leave things behind (its sandbox under ``sandbox_root``)."""
        if _SAFE.match(instance_id):
            (self.folder / instance_id).write_text(str(sandbox_root or ""))

    def forget(self, instance_id: str) -> None:
        if _SAFE.match(instance_id):
            (self.folder / instance_id).unlink(missing_ok=True)

    def left(self) -> list[tuple[str, Path | None]]:
        """The instances on record (a previous worker's, at start), with their sandbox roots."""
        found = []
        for entry in sorted(self.folder.iterdir()):
            if _SAFE.match(entry.name):
                root = entry.read_text().strip()
                found.append((entry.name, Path(root) if root else None))
        return found
