"""The worker's cache of code bundles: fetched from the database once, checked, unpacked."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from dilu.bundles import BundleError, is_digest, unpack
from dilu.db import repo


class BundleCache:
    """``folder(digest)``: the unpacked code of a bundle under ``cache_dir`` (shared by the
    worker's agents; an unpacked folder is never changed, so concurrent starts just reuse it)."""

    def __init__(self, *, sessions: sessionmaker[Session], cache_dir: Path, max_bytes: int) -> None:
        self._sessions = sessions
        self._dir = cache_dir
        self._max_bytes = max_bytes
        self._locks: dict[str, asyncio.Lock] = {}

    async def folder(self, digest: str) -> Path:
        """Raises RuntimeError with a user-readable message when the bundle cannot be had."""
        if not is_digest(digest):
            raise RuntimeError(f"bundle {digest!r} is not a sha256 digest")
        target = self._dir / digest.partition(":")[2]
        if target.is_dir():
            return target
        async with self._locks.setdefault(digest, asyncio.Lock()):
            if target.is_dir():
                return target
            return await asyncio.to_thread(self._fetch_and_unpack, digest)

    def _fetch_and_unpack(self, digest: str) -> Path:
        try:
            with self._sessions() as session:
                data = repo.get_bundle_data(session=session, digest=digest)
        except Exception as exc:  # noqa: BLE001 - any database failure means "cannot fetch now"
            raise RuntimeError(f"cannot fetch bundle {digest}: {type(exc).__name__}: {exc}") from None
        if data is None:
            raise RuntimeError(f"bundle {digest} is not stored (deleted, or never uploaded)")
        try:
            return unpack(data, digest, self._dir, self._max_bytes)
        except BundleError as exc:
            raise RuntimeError(str(exc)) from None
