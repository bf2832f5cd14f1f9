"""`dilu simulate` as a user runs it: the table, metrics.json by policy, CSVs and plots; bad
input is a message and exit status 1."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.platform import dilu_executable

DOCUMENTED = {"peak_gpus", "gpu_hours", "compute_fragmentation", "memory_fragmentation", "placement_waits",
              "never_placed", "cost", "slo_violation_rate", "inference_throughput", "training_throughput",
              "cold_starts", "instance_starts", "serving_unplaced", "serving_gpu_hours", "serving_peak_gpus",
              "p50_latency_ms",
              "p99_latency_ms"}


def _simulate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([dilu_executable(), "simulate", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "200"}, stdin=subprocess.DEVNULL)


def test_simulate_writes_the_comparison(tmp_path: Path) -> None:
    out = tmp_path / "sim"
    done = _simulate("--workload", "instances-100", "--trace", "poisson:3", "--duration-s", "60", "--nodes", "20",
                     "--serving-gpus", "4", "--trainings", "2", "--policy", "dilu,exclusive", "--price", "3",
                     "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "dilu" in done.stdout and "exclusive" in done.stdout and "1.00x" in done.stdout   # ratios to exclusive
    document = json.loads((out / "metrics.json").read_text())
    assert set(document["policies"]) == {"dilu", "exclusive"}
    for metrics in document["policies"].values():
        assert set(metrics) == DOCUMENTED
        assert metrics["cost"] == round(metrics["gpu_hours"] * 3, 2)
    assert document["policies"]["dilu"]["peak_gpus"] <= document["policies"]["exclusive"]["peak_gpus"]
    assert document["context"]["trace"] == "poisson:3"
    bound = document["context"]["peak_gpus_bound"]
    assert 0 < bound["gpus"] <= document["policies"]["dilu"]["peak_gpus"], "no placement beats the lower bound"
    assert "no placement needs fewer than" in done.stdout
    for picture in ("active_gpus.png", "fragmentation.png", "slo_violations.png", "inference_throughput.png",
                    "training_throughput.png"):
        assert (out / picture).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    header = (out / "metrics.csv").read_text().splitlines()[0]
    assert header.startswith("policy,peak_gpus")


def test_a_replicated_workload_needs_that_many_times_the_gpus(tmp_path: Path) -> None:
    runs = {}
    for copies, nodes in ((1, "20"), (3, "60")):
        out = tmp_path / f"x{copies}"
        done = _simulate("--workload", "instances-100", "--trace", "poisson:3", "--duration-s", "5", "--nodes", nodes,
                         "--policy", "exclusive", "--replicate", str(copies), "--out", str(out))
        assert done.returncode == 0, done.stderr
        runs[copies] = json.loads((out / "metrics.json").read_text())
    assert runs[3]["policies"]["exclusive"]["peak_gpus"] == 3 * runs[1]["policies"]["exclusive"]["peak_gpus"]
    assert runs[3]["context"]["peak_gpus_bound"]["gpus"] == 3 * runs[1]["context"]["peak_gpus_bound"]["gpus"]


def test_simulate_refuses_bad_input(tmp_path: Path) -> None:
    for args, message in ((["--policy", "dilu,magic"], "unknown policy magic"),
                          (["--trace", "nope"], "no trace 'nope'"),
                          (["--workload", "instances-7"], "no workload 'instances-7'"),
                          (["--trace", "poisson:-1"], "rate and cv must be positive")):
        done = _simulate(*args, "--out", str(tmp_path / "x"))
        assert done.returncode == 1 and message in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)
    done = _simulate("--replicate", "0", "--out", str(tmp_path / "x"))
    assert done.returncode == 2 and "--replicate" in done.stderr and "Traceback" not in done.stderr
