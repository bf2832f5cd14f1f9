"""The platform's own files, reachable by instance users even below a folder others cannot traverse.

A root worker's Python often lives under ``/root`` (pyenv, uv, conda), which is 0700: the
unprivileged instance users cannot even start that interpreter. Rather than opening ``/root`` on
the host, each instance's private mount namespace (``worker.sandbox.private_temp``) covers every
such closed folder with an empty tmpfs that holds only the platform's folders, bound back
read-only at their own paths. The instance reaches the interpreter, its environment and Dilu,
and sees nothing else of the closed folder (root's other files, the worker's state).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass

from worker.mounts import bind_read_only, tmpfs


@dataclass(frozen=True)
class Cover:
    """A folder others cannot traverse, and the platform's paths inside it that instances need."""

    folder: str
    paths: tuple[str, ...]

    def to_json(self) -> list:
        return [self.folder, list(self.paths)]

    @classmethod
    def from_json(cls, value: list) -> Cover:
        return cls(str(value[0]), tuple(str(p) for p in value[1]))


def traversable_by_others(folder: str) -> bool:
    """Whether users other than the owner may pass through ``folder`` (its o+x bit)."""
    try:
        return bool(os.stat(folder).st_mode & stat.S_IXOTH)
    except OSError:
        return True      # a folder that is not there needs no cover: the probe reports what is missing


def covers_for(paths: list[str], traversable: Callable[[str], bool] = traversable_by_others) -> tuple[Cover, ...]:
    """The covers that make each of ``paths`` (absolute) reachable: one per outermost folder
    above them that others cannot traverse, holding the paths below it (those inside another
    of them left out, as binding the outer brings them). Pure given ``traversable``."""
    unique = sorted({os.path.normpath(p) for p in paths if os.path.isabs(p)})
    needed = [p for p in unique if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in unique)]
    covers: dict[str, list[str]] = {}
    for path in needed:
        ancestors = []
        folder = os.path.dirname(path)
        while folder != os.path.dirname(folder):
            ancestors.append(folder)
            folder = os.path.dirname(folder)
        closed = [a for a in reversed(ancestors) if not traversable(a)]     # outermost first
        if closed:
            covers.setdefault(closed[0], []).append(path)
    # Each path's outermost closed folder: two covers are never nested, since a folder inside
    # another closed one has that one above it too.
    return tuple(Cover(f, tuple(ps)) for f, ps in sorted(covers.items()))


def describe(covers: tuple[Cover, ...]) -> str:
    """One line for the worker's log: what instances see of each closed folder (pure)."""
    return "; ".join(f"{c.folder} shows them only {', '.join(c.paths)} (read-only)" for c in covers)


def hold(covers: tuple[Cover, ...]) -> list[tuple[Cover, list[tuple[str, int | str]]]]:
    """Opens what the covers bring back, before any mount hides it: a descriptor per folder or
    file, a symlink's target for a symlink (recreated, since a mount cannot hold a symlink)."""
    held = []
    for cover in covers:
        entries: list[tuple[str, int | str]] = []
        for path in cover.paths:
            if os.path.islink(path):
                entries.append((path, os.readlink(path)))
            elif os.path.exists(path):
                entries.append((path, os.open(path, os.O_PATH | os.O_CLOEXEC)))
        held.append((cover, entries))
    return held


def apply(held: list[tuple[Cover, list[tuple[str, int | str]]]]) -> None:
    """In the calling process's own mount namespace (as root): each cover's folder becomes an
    empty tmpfs, traversable only, with its held paths bound back read-only. Raises OSError."""
    for cover, entries in held:
        tmpfs(cover.folder, b"size=1m,mode=0711")
        for path, source in entries:
            os.makedirs(os.path.dirname(path), mode=0o711, exist_ok=True)
            if isinstance(source, str):
                os.symlink(source, path)
                continue
            if stat.S_ISDIR(os.fstat(source).st_mode):
                os.mkdir(path, mode=0o711)
            else:
                os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
            bind_read_only(source, path)
