"""CLI commands that need no running platform, as real child processes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.conftest import FIXTURE_FUNCTIONS
from tests.platform import dilu_executable


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([dilu_executable(), *args], capture_output=True, text=True, timeout=60, cwd=cwd,
                          env={**os.environ, "COLUMNS": "200"})


def test_spec_schema_is_json_schema_with_yaml_names() -> None:
    result = run("spec", "schema")
    assert result.returncode == 0
    schema = json.loads(result.stdout)
    assert schema["required"] == ["name", "handler"]
    assert {"class", "slo", "resources", "scaling", "batching", "env"} <= set(schema["properties"])


def test_spec_check(tmp_path: Path) -> None:
    good = run("spec", "check", str(FIXTURE_FUNCTIONS / "ok" / "model.yaml"))
    assert good.returncode == 0 and "ok" in good.stdout
    bad = tmp_path / "model.yaml"
    bad.write_text("name: x\nhandler: handler:Echo\nbatching:\n  max_batch_size: -1\n")
    result = run("spec", "check", str(bad))
    assert result.returncode == 1 and "batching.max_batch_size (line 4)" in result.stderr
    assert "Traceback" not in result.stderr


def test_spec_check_reads_a_weights_file_as_deploy_would(tmp_path: Path) -> None:
    import shutil

    digits = FIXTURE_FUNCTIONS.parents[2] / "examples" / "digits"
    good = run("spec", "check", str(digits / "model.yaml"))       # weights: model.safetensors, a path
    assert good.returncode == 0 and "ok (digits)" in good.stdout, good.stderr
    folder = shutil.copytree(digits, tmp_path / "digits")
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    broken = run("spec", "check", str(folder / "model.yaml"))
    assert broken.returncode == 1 and "weights: model.safetensors" in broken.stderr, broken.stderr
    (folder / "model.safetensors").unlink()
    missing = run("spec", "check", str(folder / "model.yaml"))
    assert missing.returncode == 1 and "is not a file" in missing.stderr


def test_migrate_creates_the_schema(tmp_path: Path) -> None:
    result = subprocess.run([dilu_executable(), "migrate"], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "DILU_HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "dilu.db").exists()


def test_no_gpu_means_one_cpu_device() -> None:
    from worker.devices import discover_devices, discover_gpus

    assert discover_gpus() == [] or all(d.kind == "gpu" and d.uuid for d in discover_gpus())
    forced = discover_devices("none")
    assert [d.kind for d in forced] == ["cpu"] and forced[0].memory_bytes > 0


def test_a_taken_port_is_a_clear_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = str(taken.getsockname()[1])
        for role in (["up", "--port", port], ["gateway"], ["worker"]):
            result = subprocess.run([dilu_executable(), *role], capture_output=True, text=True, timeout=120,
                                    env={**os.environ, "DILU_HOME": str(tmp_path), "DILU_PORT": port})
            assert result.returncode == 1, (role, result.stderr)
            assert f"cannot listen on 127.0.0.1:{port}" in result.stderr and "Traceback" not in result.stderr


def test_a_setting_out_of_range_is_named_not_a_traceback(tmp_path: Path) -> None:
    env = {**os.environ, "DILU_HOME": str(tmp_path), "DILU_MPS": "maybe", "DILU_ISOLATION_WINDOW_US": "-1"}
    result = subprocess.run([dilu_executable(), "up", "--port", "0"], capture_output=True, text=True, timeout=60,
                            env=env, stdin=subprocess.DEVNULL)
    assert result.returncode == 2
    assert "DILU_MPS='maybe': Input should be 'off' or 'on'" in result.stderr, result.stderr
    assert "DILU_ISOLATION_WINDOW_US='-1'" in result.stderr and "Traceback" not in result.stderr
