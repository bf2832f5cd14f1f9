"""Weight artifacts: written whole or not at all, copied into a host's cache only when the bytes
match their digest, mapped by instances without reading them."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy
import pytest
from safetensors.numpy import save_file

from dilu.artifacts import ArtifactError, ArtifactStore, ArtifactTooLarge, copy_verified
from dilu.bundles import pack
from worker.instance.weights import _map_numpy, map_weights

pytestmark = pytest.mark.unit


def _weights(path: Path) -> str:
    save_file({"w": numpy.arange(12, dtype=numpy.float32).reshape(3, 4), "b": numpy.ones(3, dtype=numpy.int64)},
              str(path))
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_upload_is_stored_only_when_its_bytes_match_the_digest(tmp_path) -> None:
    source = tmp_path / "w.safetensors"
    digest = _weights(source)
    store = ArtifactStore(tmp_path / "store")
    writer = store.writer(digest, 10**6)
    writer.write(source.read_bytes()[:-1])
    with pytest.raises(ArtifactError, match=f"not {digest}"):
        writer.commit()
    assert not store.has(digest) and list(store.folder.iterdir()) == []
    writer = store.writer(digest, 10**6)
    writer.write(source.read_bytes())
    writer.commit()
    assert store.has(digest) and store.path(digest).read_bytes() == source.read_bytes()
    small = store.writer(digest, 10)
    with pytest.raises(ArtifactTooLarge):
        small.write(source.read_bytes())
    small.discard()
    assert [p.name for p in store.folder.iterdir()] == [digest.partition(":")[2]]


def test_bytes_that_are_not_safetensors_are_refused_under_their_right_digest(tmp_path) -> None:
    store = ArtifactStore(tmp_path / "store")
    junk = b"\x08\x00\x00\x00\x00\x00\x00\x00{bad json"
    digest = "sha256:" + hashlib.sha256(junk).hexdigest()
    writer = store.writer(digest, 10**6)
    writer.write(junk)
    with pytest.raises(ArtifactError, match="not a safetensors file"):
        writer.commit()
    assert not store.has(digest)


def test_a_store_file_changed_after_upload_is_not_cached(tmp_path) -> None:
    source = tmp_path / "w.safetensors"
    digest = _weights(source)
    source.write_bytes(source.read_bytes()[:-4] + b"\x00\x00\x00\x01")
    target = tmp_path / "cache" / "w"
    with pytest.raises(ArtifactError, match="does not match its digest"):
        copy_verified(source, target, digest, link=False)   # a copy from a store on another file system
    assert not target.exists() and [p.name for p in target.parent.iterdir()] == []
    fresh = tmp_path / "fresh.safetensors"
    copy_verified(fresh, target, _weights(fresh), link=False)
    assert target.read_bytes() == fresh.read_bytes() and target.stat().st_mode & 0o777 == 0o644
    # On one file system the cache shares the store's inode: the bytes the gateway hashed.
    linked = tmp_path / "cache" / "linked"
    copy_verified(fresh, linked, _weights(fresh))
    assert linked.stat().st_ino == fresh.stat().st_ino


def test_the_weights_file_is_left_out_of_the_code_bundle(tmp_path) -> None:
    import gzip
    import io
    import tarfile

    (tmp_path / "handler.py").write_text("class H: pass\n")
    _weights(tmp_path / "model.safetensors")
    data = pack(tmp_path, 10**7, (tmp_path / "model.safetensors",))
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(data))) as archive:
        assert archive.getnames() == ["handler.py"]


def test_mapped_weights_are_views_of_the_file(tmp_path) -> None:
    path = tmp_path / "w.safetensors"
    _weights(path)
    tensors = map_weights(str(path))
    assert "torch" in sys.modules and tensors["w"].tolist()[2] == [8.0, 9.0, 10.0, 11.0]
    arrays = _map_numpy(str(path))
    assert arrays["b"].tolist() == [1, 1, 1] and arrays["w"].shape == (3, 4)
    assert isinstance(arrays["w"].base, numpy.memmap) or not arrays["w"].flags.owndata
    with pytest.raises(ValueError):   # read-only: the file's pages are shared by every instance
        arrays["w"][0, 0] = 1.0
