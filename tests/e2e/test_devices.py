"""Where functions land on a machine without a GPU: a simulated GPU is added beside the CPU
worker, and runs only what asks for a GPU; a function failed by an earlier start's devices is
deployed again when the platform starts once more, which says what it kept."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.conftest import FIXTURE_FUNCTIONS
from tests.shim_harness import build_shim
from tests.waiting import eventually

FAKE_GPU = {"DILU_FAKE_GPUS": "1", "DILU_GPUS": "none"}


def _function(tmp_path: Path, name: str, gpu: str) -> Path:
    folder = shutil.copytree(FIXTURE_FUNCTIONS / "ok", tmp_path / name)
    spec = (folder / "model.yaml").read_text().replace("name: ok", f"name: {name}").replace("gpu: false",
                                                                                            f"gpu: {gpu}")
    (folder / "model.yaml").write_text(spec)
    return folder / "model.yaml"


def test_a_simulated_gpu_is_added_beside_the_cpu_and_takes_only_what_asks_for_a_gpu(
        start_platform, tmp_path: Path) -> None:
    build_shim()
    platform = start_platform(env=FAKE_GPU)
    workers = platform.http.get("/v1/status").json()["workers"]
    assert sorted(w["device"] for w in workers) == ["cpu", "gpu"]
    for name, gpu in (("plain", "false"), ("either", "auto"), ("needs", "true")):
        deployed = platform.cli("deploy", str(_function(tmp_path, name, gpu)))
        assert deployed.returncode == 0, deployed.stderr
        assert platform.invoke(name, {"x": 1}).status_code == 200
    placed = {name: platform.instances(name)[0]["worker_id"].rsplit("-", 1)[1] for name in ("plain", "either", "needs")}
    # gpu: auto runs on the CPU: a framework's kernels cannot run on the fake driver.
    assert placed == {"plain": "cpu", "either": "cpu", "needs": "fakegpu0"}


def test_a_function_failed_by_the_devices_of_an_earlier_start_is_deployed_again(
        start_platform, tmp_path: Path) -> None:
    build_shim()
    first = start_platform()        # a CPU alone: a function that needs a GPU cannot be held
    deployed = first.cli("deploy", str(_function(tmp_path, "needs", "true")))
    assert deployed.returncode != 0 and "it needs a GPU (resources.gpu: true) and no worker has one" in \
        deployed.stderr, deployed.stderr
    assert "dilu logs" not in deployed.stderr and "add a worker that has them" in deployed.stderr
    assert first.function("needs")["status"] == "failed"
    assert not any("kept from earlier runs" in line for line in first.role.lines)
    first.close()

    again = start_platform(env=FAKE_GPU)      # the same home, now with a simulated GPU
    eventually(lambda: again.function("needs")["status"] == "ready", timeout=120, what="the retried deploy")
    assert again.invoke("needs", {"x": 1}).status_code == 200
    events = again.cli("events", "needs")
    assert "retry" in events.stdout and "failed before this controller started" in events.stdout, events.stdout
    # And the start said what it kept, and how to start afresh instead.
    said = "\n".join(again.role.lines)
    assert "kept from earlier runs in" in said and "1 of them failed before (needs): deployed again now" in said, said
    assert "to start afresh" in said
