"""The worker's cache of weight artifacts: each copied from the store once per host, checked."""

from __future__ import annotations

import asyncio
from pathlib import Path

from dilu.artifacts import ArtifactError, ArtifactStore, copy_verified, hex_of


class ArtifactCache:
    """``path(digest)``: the host's copy of an artifact under ``cache_dir`` (shared by the
    worker's agents and instances; a cached file is never changed, so later starts just map it)."""

    def __init__(self, *, store: ArtifactStore, cache_dir: Path) -> None:
        self._store = store
        self._dir = cache_dir
        self._locks: dict[str, asyncio.Lock] = {}

    async def path(self, digest: str) -> Path:
        """Raises RuntimeError with a user-readable message when the artifact cannot be had."""
        try:
            target = self._dir / hex_of(digest)
        except ArtifactError as exc:
            raise RuntimeError(f"weights: {exc}") from None
        if target.is_file():
            return target
        async with self._locks.setdefault(digest, asyncio.Lock()):
            if not target.is_file():
                await asyncio.to_thread(self._fetch, digest, target)
        return target

    def _fetch(self, digest: str, target: Path) -> None:
        source = self._store.path(digest)
        if not source.is_file():
            raise RuntimeError(f"weights: artifact {digest} is not in the store at {self._store.folder} "
                               "(deleted, never uploaded, or the store is not shared with this worker)")
        try:
            copy_verified(source, target, digest)
        except ArtifactError as exc:
            raise RuntimeError(f"weights: {exc}") from None
        except OSError as exc:
            raise RuntimeError(f"weights: cannot copy artifact {digest} into this host's cache: {exc}") from None
