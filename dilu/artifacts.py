"""Weight artifacts: large files named by the SHA-256 of their bytes, kept apart from code bundles.

A function's spec names its weights as ``weights: sha256:<hex>``; ``dilu deploy`` uploads the
file once per digest. The store is a folder every gateway and worker reaches (one host's folder
for ``dilu up``, a shared volume otherwise: see docs/DECISIONS.md), holding ``<hex>`` per
artifact, written whole or not at all. A worker copies an artifact into its host's cache once,
checking the digest as it reads; every instance on that host maps that one file.

An artifact is a safetensors file (a little-endian u64 header length, a JSON header, the
tensors' bytes): it is checked at upload, so an instance never meets a file it cannot map.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from dilu.bundles import is_digest

CHUNK = 8 * 2**20


class ArtifactError(ValueError):
    """An artifact is missing, not what its digest says, or not a safetensors file; the message says which."""


class ArtifactTooLarge(ArtifactError):
    """An upload passed DILU_MAX_ARTIFACT_BYTES."""


def hex_of(digest: str) -> str:
    if not is_digest(digest):
        raise ArtifactError(f"{digest!r} is not an artifact digest (sha256:<64 lowercase hex digits>)")
    return digest.partition(":")[2]


def check_safetensors(path: Path) -> int:
    """The number of tensors in the safetensors file at ``path``; ArtifactError with the library's
    reason otherwise (a short file, a header that is not JSON, a tensor whose bytes lie outside
    the file or do not match its datatype and shape)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as handle:
            return len(list(handle.keys()))
    except (SafetensorError, OSError, ValueError) as exc:
        raise ArtifactError(f"not a safetensors file: {exc}") from None


class ArtifactStore:
    """The folder of stored artifacts. ``writer`` receives one, ``path`` finds one."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def path(self, digest: str) -> Path:
        return self.folder / hex_of(digest)

    def has(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def writer(self, digest: str, max_bytes: int) -> ArtifactWriter:
        self.folder.mkdir(parents=True, exist_ok=True)
        return ArtifactWriter(self.path(digest), digest, max_bytes)


class ArtifactWriter:
    """Receives an artifact's bytes into a temporary file beside its place, hashing them; ``commit``
    checks the digest and the format and moves it into place, ``discard`` drops it. Nothing is
    visible under the digest's name until both checks pass."""

    def __init__(self, target: Path, digest: str, max_bytes: int) -> None:
        self._target, self._digest, self._max = target, digest, max_bytes
        handle, name = tempfile.mkstemp(prefix=".upload-", dir=target.parent)
        self._file = os.fdopen(handle, "wb")
        self._temp = Path(name)
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self._max:
            raise ArtifactTooLarge(f"the artifact is over the limit of {self._max} bytes (DILU_MAX_ARTIFACT_BYTES)")
        self._hash.update(data)
        self._file.write(data)

    def commit(self) -> None:
        self._file.close()
        got = "sha256:" + self._hash.hexdigest()
        try:
            if got != self._digest:
                raise ArtifactError(f"the uploaded bytes are {got}, not {self._digest} as named: "
                                    "the file changed or was cut short")
            check_safetensors(self._temp)
            self._temp.chmod(0o644)
            self._temp.replace(self._target)
        finally:
            self._temp.unlink(missing_ok=True)

    def discard(self) -> None:
        self._file.close()
        self._temp.unlink(missing_ok=True)


def digest_of_file(path: Path) -> str:
    """``sha256:<hex>`` of a file's bytes, read in chunks."""
    hashed = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            hashed.update(chunk)
    return "sha256:" + hashed.hexdigest()


def file_chunks(path: Path) -> Iterable[bytes]:
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            yield chunk


def copy_verified(source: Path, target: Path, digest: str, link: bool = True) -> None:
    """Puts the store's ``source`` at ``target`` in a host's cache (readable by all, as instances
    of other users map it). On one file system it is hard-linked: the same inode the gateway
    hashed at upload, so nothing can differ. Otherwise it is copied, and only when the bytes hash
    to ``digest`` (ArtifactError otherwise, and ``target`` is not written). ``link=False``
    always copies."""
    target.parent.mkdir(parents=True, exist_ok=True)
    linked = target.parent / f".link-{os.getpid()}-{target.name}"
    try:
        if link:
            os.link(source, linked)
            linked.replace(target)
            return
    except OSError:
        linked.unlink(missing_ok=True)   # another file system (a shared store): copy it
    handle, name = tempfile.mkstemp(prefix=".fetch-", dir=target.parent)
    temp, hashed = Path(name), hashlib.sha256()
    try:
        with os.fdopen(handle, "wb") as out:
            for chunk in file_chunks(source):
                hashed.update(chunk)
                out.write(chunk)
        if "sha256:" + hashed.hexdigest() != digest:
            raise ArtifactError(f"artifact {digest} in the store does not match its digest "
                                f"(its bytes are sha256:{hashed.hexdigest()}): upload it again")
        temp.chmod(0o644)
        temp.replace(target)
    finally:
        temp.unlink(missing_ok=True)
