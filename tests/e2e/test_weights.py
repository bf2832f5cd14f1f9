"""Weights as artifacts: dilu deploy uploads the safetensors file a spec names once per digest,
instances map it and the handler reads it with dilu.weights(); the load's stages show; a file
that is not what its digest says, not safetensors, or not stored is refused by name."""

from __future__ import annotations

import hashlib
import shutil

import httpx
import numpy
import pytest
from safetensors.numpy import save_file

from tests.conftest import FIXTURE_FUNCTIONS


@pytest.fixture
def function_dir(tmp_path):
    folder = tmp_path / "weights_sum"
    shutil.copytree(FIXTURE_FUNCTIONS / "weights_sum", folder)
    save_file({"a": numpy.arange(1000, dtype=numpy.float32), "b": numpy.ones((4, 4), dtype=numpy.float64)},
              str(folder / "weights.safetensors"))
    return folder


def test_deploy_uploads_the_weights_once_and_instances_map_them(start_platform, function_dir) -> None:
    platform = start_platform()
    deployed = platform.cli("deploy", str(function_dir / "model.yaml"))
    assert deployed.returncode == 0, deployed.stderr
    digest = "sha256:" + hashlib.sha256((function_dir / "weights.safetensors").read_bytes()).hexdigest()
    function = platform.function("weights-sum")
    assert function["spec"]["weights"] == digest
    answer = platform.invoke("weights-sum", {})
    assert answer.status_code == 200 and answer.json() == {"names": ["a", "b"], "sums": [499500.0, 16.0]}
    # The load's stages: the fetch into the host's cache and the map are measured on their own.
    assert {"fetch", "map"} <= set(platform.function("weights-sum")["loading"])
    described = platform.cli("describe", "weights-sum")
    assert described.returncode == 0 and "fetch" in described.stdout and "map" in described.stdout, described.stdout

    # Stored once, under its digest; the code bundle does not carry it.
    store = platform.home / "artifacts"
    stored = store / digest.partition(":")[2]
    assert [p.name for p in store.iterdir() if not p.name.startswith(".")] == [stored.name]
    first_upload = stored.stat().st_ino
    # Another function naming the same file: deployed without a second upload.
    spec = function_dir / "model.yaml"
    spec.write_text(spec.read_text().replace("name: weights-sum", "name: weights-twin"))
    again = platform.cli("deploy", str(spec))
    assert again.returncode == 0, again.stderr
    assert stored.stat().st_ino == first_upload
    assert platform.invoke("weights-twin", {}).json()["sums"] == [499500.0, 16.0]
    bundle = platform.function("weights-twin")["bundle"]
    head = platform.http.head(f"/v1/bundles/{bundle}")
    assert head.status_code == 200
    assert platform.http.head(f"/v1/artifacts/{digest}").status_code == 200


def test_artifacts_not_matching_their_digest_or_not_safetensors_are_refused(start_platform, function_dir) -> None:
    platform = start_platform()
    data = (function_dir / "weights.safetensors").read_bytes()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    cut = platform.http.put(f"/v1/artifacts/{digest}", content=data[:-10])
    assert cut.status_code == 422 and digest in cut.json()["error"] and "not " + digest in cut.json()["error"]
    junk = b"this is not a tensor file"
    junk_digest = "sha256:" + hashlib.sha256(junk).hexdigest()
    refused = platform.http.put(f"/v1/artifacts/{junk_digest}", content=junk)
    assert refused.status_code == 422 and "not a safetensors file" in refused.json()["error"]
    assert platform.http.head(f"/v1/artifacts/{junk_digest}").status_code == 404
    bad_name = platform.http.put("/v1/artifacts/sha256:xyz", content=data)
    assert bad_name.status_code == 422
    # A spec naming an artifact nobody uploaded.
    missing = "sha256:" + "0" * 64
    text = (function_dir / "model.yaml").read_text().replace("weights.safetensors", missing)
    answer = platform.http.post("/v1/functions", json={"yaml": text, "source_dir": str(function_dir)})
    assert answer.status_code == 422 and f"artifact {missing} is not stored" in answer.json()["error"]
    # dilu deploy naming a file that is not there, or not safetensors.
    (function_dir / "weights.safetensors").unlink()
    gone = platform.cli("deploy", str(function_dir / "model.yaml"))
    assert gone.returncode != 0 and "is not a file" in gone.stderr
    (function_dir / "weights.safetensors").write_bytes(junk)
    not_tensors = platform.cli("deploy", str(function_dir / "model.yaml"))
    assert not_tensors.returncode != 0 and "not a safetensors file" in not_tensors.stderr
    assert "Traceback" not in gone.stderr + not_tensors.stderr


def test_an_artifact_over_the_limit_is_refused_before_it_is_stored(start_platform, function_dir) -> None:
    platform = start_platform(env={"DILU_MAX_ARTIFACT_BYTES": "1000"})
    data = (function_dir / "weights.safetensors").read_bytes()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    answer = httpx.put(f"{platform.url}/v1/artifacts/{digest}", content=iter([data]), timeout=30)
    assert answer.status_code == 413 and "DILU_MAX_ARTIFACT_BYTES" in answer.json()["error"]
    assert not any(p for p in (platform.home / "artifacts").iterdir() if not p.name.startswith("."))


def test_the_digits_example_reads_held_out_handwriting_with_its_trained_weights(start_platform) -> None:
    import gzip

    example = FIXTURE_FUNCTIONS.parents[2] / "examples" / "digits"
    platform = start_platform()
    deployed = platform.cli("deploy", str(example / "model.yaml"))     # uploads the weights as an artifact
    assert deployed.returncode == 0, deployed.stderr
    assert platform.function("digits")["spec"]["weights"].startswith("sha256:")
    rows = [[int(v) for v in line.split(",")] for line in gzip.open(example / "data" / "digits.csv.gz", "rt")]
    held_out = [row for index, row in enumerate(rows) if index % 5 == 0][:60]   # train.py never saw these
    right = 0
    for row in held_out:
        reply = platform.invoke("digits", {"image": [row[i * 8:(i + 1) * 8] for i in range(8)]})
        assert reply.status_code == 200, reply.text
        right += reply.json()["digit"] == row[64]
    assert right >= 55, f"{right} of {len(held_out)} held-out digits read right"
    refused = platform.invoke("digits", {"image": [[17] * 8] * 8})
    assert refused.status_code == 422 and "from 0 (white) to 16 (black)" in refused.json()["error"]
