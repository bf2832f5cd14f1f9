"""Code bundles: a function's folder packed as a gzipped tar, named by the SHA-256 of its bytes.

``dilu deploy`` packs the spec's folder (``pack``) and uploads it; the platform stores the bytes
once per digest (the ``bundles`` table: see docs/DECISIONS.md); a worker on any host fetches them,
checks the digest and unpacks them into its cache (``unpack``) before it starts an instance.

Packing is deterministic (sorted names, fixed owner, mode and times), so the same folder gives
the same digest and an unchanged function uploads nothing new.
"""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import io
import os
import shutil
import tarfile
import tempfile
from pathlib import Path, PurePosixPath
from zlib import error as zlib_error

IGNORE_FILE = ".dilignore"
ALWAYS_IGNORED = (".git", ".hg", ".svn", "__pycache__", "*.pyc", ".venv", "venv", ".mypy_cache",
                  ".pytest_cache", ".DS_Store", IGNORE_FILE)
MAX_MEMBERS = 20_000
UNPACKED_FACTOR = 8   # an archive may unpack to at most this many times its size limit


class BundleError(ValueError):
    """A bundle cannot be packed, is too large, or is not what its digest says; the message says why."""


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def is_digest(value: str) -> bool:
    prefix, _, hexpart = value.partition(":")
    return prefix == "sha256" and len(hexpart) == 64 and all(c in "0123456789abcdef" for c in hexpart)


def read_ignore_patterns(folder: Path) -> list[str]:
    """The folder's ``.dilignore`` patterns (gitignore-like: one glob per line, ``#`` comments,
    a trailing ``/`` matches folders, a pattern with a ``/`` is matched from the folder's root)."""
    path = folder / IGNORE_FILE
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def ignored(relative: str, is_dir: bool, patterns: list[str]) -> bool:
    """Whether ``relative`` (a POSIX path inside the folder) is left out of the bundle."""
    name = relative.rsplit("/", 1)[-1]
    if any(fnmatch.fnmatch(name, pattern) for pattern in ALWAYS_IGNORED):
        return True
    for pattern in patterns:
        directory_only = pattern.endswith("/")
        pattern = pattern.rstrip("/")
        if directory_only and not is_dir:
            continue
        if "/" in pattern:
            if fnmatch.fnmatch(relative, pattern.lstrip("/")):
                return True
        elif fnmatch.fnmatch(name, pattern):
            return True
    return False


def pack(folder: Path, max_bytes: int, leave_out: tuple[Path, ...] = ()) -> bytes:
    """The folder as a deterministic .tar.gz, without ignored files and the files ``leave_out``
    names (a weights file, uploaded as an artifact); BundleError past ``max_bytes`` (compressed),
    naming the largest files so the user knows what to add to ``.dilignore``."""
    folder = folder.resolve()
    left_out = {path.resolve() for path in leave_out}
    if not folder.is_dir():
        raise BundleError(f"{folder} is not a folder")
    patterns = read_ignore_patterns(folder)
    files: list[tuple[str, Path]] = []
    for root, dirs, names in os.walk(folder):
        base = Path(root)
        rel_root = base.relative_to(folder).as_posix()
        def rel(n: str, rel_root: str = rel_root) -> str:
            return n if rel_root == "." else f"{rel_root}/{n}"

        dirs[:] = sorted(d for d in dirs if not ignored(rel(d), True, patterns) and not (base / d).is_symlink())
        for name in sorted(names):
            path = base / name
            if path.is_file() and not path.is_symlink() and not ignored(rel(name), False, patterns) \
                    and path not in left_out:
                files.append((rel(name), path))
    total = sum(path.stat().st_size for _, path in files)
    if total > max_bytes * UNPACKED_FACTOR:
        raise BundleError(_too_large(folder, files, total, max_bytes))
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as zipped, \
            tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for relative, path in sorted(files):
            info = tarfile.TarInfo(relative)
            info.size = path.stat().st_size
            info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with open(path, "rb") as handle:
                archive.addfile(info, handle)
    data = buffer.getvalue()
    if len(data) > max_bytes:
        raise BundleError(_too_large(folder, files, len(data), max_bytes))
    return data


def _too_large(folder: Path, files: list[tuple[str, Path]], size: int, max_bytes: int) -> str:
    largest = sorted(files, key=lambda item: item[1].stat().st_size, reverse=True)[:3]
    names = ", ".join(f"{rel} ({_mib(path.stat().st_size)})" for rel, path in largest)
    return (f"the function folder {folder} packs to {_mib(size)}, over the {_mib(max_bytes)} bundle limit; "
            f"largest files: {names}. List what the function does not need in {IGNORE_FILE}")


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def check_members(data: bytes, max_bytes: int) -> None:
    """Refuses an archive the platform would not unpack, naming the first bad member: anything
    but plain files and folders (links, devices, fifos), absolute or ``..`` paths, more than
    ``MAX_MEMBERS`` entries, or contents past ``UNPACKED_FACTOR x max_bytes``. Read as a stream,
    so a compression bomb is refused at the header that passes the limit, not after expanding."""
    limit, total, count = max_bytes * UNPACKED_FACTOR, 0, 0
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r|gz") as archive:
            for member in archive:
                count += 1
                if count > MAX_MEMBERS:
                    raise BundleError(f"the bundle holds more than {MAX_MEMBERS} files and folders")
                _check_member(member)
                total += member.size
                if total > limit:
                    raise BundleError(f"the bundle unpacks past {_mib(limit)} (at {member.name!r}): "
                                      "over the expansion limit")
    except (tarfile.TarError, EOFError, OSError, zlib_error) as exc:
        raise BundleError(f"the bundle is not a readable .tar.gz: {exc}") from None


def _check_member(member: tarfile.TarInfo) -> None:
    name = member.name
    if not (member.isfile() or member.isdir()):
        kind = "a link" if member.issym() or member.islnk() else "a device, fifo or other special file"
        raise BundleError(f"bundle member {name!r} is {kind}: only plain files and folders are allowed")
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts:
        raise BundleError(f"bundle member {name!r} points outside the bundle")


def unpack(data: bytes, digest: str, cache_dir: Path, max_bytes: int) -> Path:
    """The bundle's files under ``cache_dir/<hex>`` (unpacked once; later calls return the folder).
    Checks the digest and every member (``check_members``: the gateway checked them at upload,
    this is the second line for bundles stored before that or written to the database directly)."""
    if digest_of(data) != digest:
        raise BundleError(f"bundle {digest} does not match its content (got {digest_of(data)})")
    target = cache_dir / digest.partition(":")[2]
    if target.is_dir():
        return target
    try:
        check_members(data, max_bytes)
    except BundleError as exc:
        raise BundleError(f"bundle {digest}: {exc}") from None
    cache_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=cache_dir))
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            for member in archive.getmembers():
                inside = (staging / member.name).resolve()
                if not inside.is_relative_to(staging.resolve()):
                    raise BundleError(f"bundle {digest}: {member.name} points outside the bundle")
            if hasattr(tarfile, "data_filter"):   # Python >= 3.11.4 checks again as it extracts
                archive.extractall(staging, filter="data")
            else:
                archive.extractall(staging)  # every member was checked above
        for path in [staging, *staging.rglob("*")]:   # readable by the unprivileged instance user
            path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
        try:
            staging.rename(target)
        except OSError:
            if not target.is_dir():   # another start unpacked it first otherwise
                raise
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise BundleError(f"bundle {digest} cannot be unpacked: {exc}") from None
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def has_module(data: bytes, handler: str) -> bool:
    """Whether the bundle holds the file of ``handler``'s module (``module:Class``)."""
    base = handler.split(":", 1)[0].replace(".", "/")
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            names = set(archive.getnames())
    except (tarfile.TarError, EOFError, OSError):
        return False
    return f"{base}.py" in names or f"{base}/__init__.py" in names


def read_member(data: bytes, name: str, limit: int = 10 * 2**20) -> bytes:
    """One file of the bundle (KeyError when it holds none by that name or it is over ``limit``)."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            member = archive.getmember(name)
            handle = archive.extractfile(member) if member.isfile() and member.size <= limit else None
            if handle is None:
                raise KeyError(name)
            return handle.read()
    except (tarfile.TarError, EOFError, OSError):
        raise KeyError(name) from None


def read_code_file(source_dir: str, bundle: bytes | None, name: str, limit: int = 10 * 2**20) -> bytes:
    """One file of a function's code, from its local folder or its bundle (KeyError when there is
    none by that name inside it, or it is over ``limit``)."""
    if bundle is not None:
        return read_member(bundle, name, limit)
    folder = Path(source_dir).resolve()
    path = (folder / name).resolve()
    if not source_dir or not path.is_relative_to(folder) or not path.is_file() or path.stat().st_size > limit:
        raise KeyError(name)
    return path.read_bytes()
