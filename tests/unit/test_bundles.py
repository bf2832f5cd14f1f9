"""Code bundles: deterministic packing, .dilignore, size limits, and unpacking that refuses
anything but plain files inside the bundle's folder."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

import pytest

from dilu.bundles import (
    MAX_MEMBERS,
    BundleError,
    check_members,
    digest_of,
    has_module,
    ignored,
    is_digest,
    pack,
    read_member,
    unpack,
)
from tests.builders import compression_bomb


def make_function(folder: Path) -> Path:
    (folder / "pkg").mkdir(parents=True)
    (folder / "handler.py").write_text("class H: pass\n")
    (folder / "pkg" / "__init__.py").write_text("")
    (folder / "request.json").write_text('{"x": 1}')
    (folder / "weights.bin").write_bytes(b"w" * 1000)
    (folder / "__pycache__").mkdir()
    (folder / "__pycache__" / "handler.cpython-311.pyc").write_bytes(b"compiled")
    return folder


def names(data: bytes) -> set[str]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        return set(archive.getnames())


def test_packing_is_deterministic_and_skips_caches(tmp_path: Path) -> None:
    folder = make_function(tmp_path / "fn")
    first = pack(folder, 10**6)
    (folder / "handler.py").touch()            # a new mtime changes nothing
    assert pack(folder, 10**6) == first
    assert names(first) == {"handler.py", "pkg/__init__.py", "request.json", "weights.bin"}
    (folder / "handler.py").write_text("class H: x = 1\n")
    assert digest_of(pack(folder, 10**6)) != digest_of(first)


@pytest.mark.parametrize(("pattern", "left_out"), [
    ("*.bin", {"weights.bin"}),
    ("pkg/", {"pkg/__init__.py"}),
    ("/request.json", {"request.json"}),
    ("# a comment only", set()),
])
def test_dilignore(tmp_path: Path, pattern: str, left_out: set[str]) -> None:
    folder = make_function(tmp_path / "fn")
    (folder / ".dilignore").write_text(pattern + "\n")
    everything = {"handler.py", "pkg/__init__.py", "request.json", "weights.bin"}
    assert names(pack(folder, 10**6)) == everything - left_out


def test_ignore_rules() -> None:
    assert ignored("a/.git", True, []) and ignored("x.pyc", False, [])
    assert ignored("data/big.bin", False, ["*.bin"]) and not ignored("data/big.bin", False, ["/big.bin"])
    assert not ignored("notes.txt", False, ["notes/"])      # a folder pattern does not match a file


def test_too_large_names_the_largest_files(tmp_path: Path) -> None:
    folder = make_function(tmp_path / "fn")
    (folder / "huge.bin").write_bytes(bytes(range(256)) * 4096)   # 1 MiB that does not compress away
    with pytest.raises(BundleError, match=r"over the 0\.1 MiB bundle limit.*huge\.bin.*\.dilignore"):
        pack(folder, 100 * 1024)


def test_unpack_checks_the_digest_and_is_cached(tmp_path: Path) -> None:
    data = pack(make_function(tmp_path / "fn"), 10**6)
    digest = digest_of(data)
    assert is_digest(digest) and not is_digest("sha256:xyz") and not is_digest("md5:" + "0" * 64)
    with pytest.raises(BundleError, match="does not match"):
        unpack(data, "sha256:" + "0" * 64, tmp_path / "cache", 10**6)
    folder = unpack(data, digest, tmp_path / "cache", 10**6)
    assert (folder / "handler.py").read_text() == "class H: pass\n"
    assert unpack(data, digest, tmp_path / "cache", 10**6) == folder
    assert has_module(data, "handler:H") and has_module(data, "pkg:X") and not has_module(data, "other:H")
    assert read_member(data, "request.json") == b'{"x": 1}'
    with pytest.raises(KeyError):
        read_member(data, "missing.json")


def archive_with(member: tarfile.TarInfo, payload: bytes = b"") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        archive.addfile(member, io.BytesIO(payload) if payload else None)
    return buffer.getvalue()


def escaping() -> tarfile.TarInfo:
    info = tarfile.TarInfo("../outside.py")
    info.size = 1
    return info


def symlink() -> tarfile.TarInfo:
    info = tarfile.TarInfo("link")
    info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
    return info


def special(name: str, kind: bytes, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info


def absolute() -> tarfile.TarInfo:
    info = tarfile.TarInfo("/etc/cron.d/x")
    info.size = 1
    return info


HOSTILE = [
    (escaping(), b"x", "'../outside.py' points outside the bundle"),
    (absolute(), b"x", "'/etc/cron.d/x' points outside the bundle"),
    (symlink(), b"", "'link' is a link"),
    (special("hard", tarfile.LNKTYPE, "../../etc/passwd"), b"", "'hard' is a link"),
    (special("pipe", tarfile.FIFOTYPE), b"", "'pipe' is a device, fifo"),
    (special("disk", tarfile.BLKTYPE), b"", "'disk' is a device, fifo"),
    (special("tty", tarfile.CHRTYPE), b"", "'tty' is a device, fifo"),
]


@pytest.mark.parametrize(("member", "payload", "message"), HOSTILE)
def test_unpack_refuses_hostile_archives(tmp_path: Path, member: tarfile.TarInfo, payload: bytes,
                                         message: str) -> None:
    data = archive_with(member, payload)
    with pytest.raises(BundleError, match=message):
        check_members(data, 10**6)     # what the gateway runs at upload
    with pytest.raises(BundleError, match=message):
        unpack(data, digest_of(data), tmp_path / "cache", 10**6)
    assert not (tmp_path / "outside.py").exists()
    cache = tmp_path / "cache"
    assert not cache.exists() or [p.name for p in cache.iterdir()] == []     # nothing half-unpacked is left


def test_a_compression_bomb_is_refused_at_the_header_that_passes_the_limit() -> None:
    data = compression_bomb(64 * 2**20)
    assert len(data) < 2**20      # a small upload that would expand 64 times over
    with pytest.raises(BundleError, match="unpacks past 8.0 MiB .at 'zeros.bin'.: over the expansion limit"):
        check_members(data, 2**20)


def test_too_many_members_and_garbage_are_refused() -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for n in range(MAX_MEMBERS + 1):
            archive.addfile(tarfile.TarInfo(f"f{n}"))
    with pytest.raises(BundleError, match=f"more than {MAX_MEMBERS} files"):
        check_members(buffer.getvalue(), 10**6)
    with pytest.raises(BundleError, match="not a readable .tar.gz"):
        check_members(gzip.compress(b"not a tar archive at all, but long enough to be read" * 20), 10**6)
