"""Vertical scaling end to end on a simulated GPU: gateway, instance, shim, token manager, policy."""

from __future__ import annotations

import threading
import time

import pytest

from tests.conftest import ROOT
from tests.shim_harness import build_shim
from tests.waiting import eventually

# It measures how the platform reacts to load: it runs with no other test beside it (scripts/test).
pytestmark = pytest.mark.alone

EXAMPLE = ROOT / "examples" / "synthetic-gpu"


@pytest.fixture(scope="module", autouse=True)
def _built() -> None:
    build_shim()


def training_share(platform) -> float:
    share = platform.invoke("synthetic-training", {}).json()["share"]
    return share if share is not None else -1.0


def test_latency_burst_squeezes_batch_work_and_its_end_gives_the_share_back(start_platform) -> None:
    platform = start_platform(env={"DILU_FAKE_GPUS": "1", "DILU_GPUS": "none"})
    for spec in ("training.yaml", "latency.yaml"):
        result = platform.cli("deploy", str(EXAMPLE / spec))
        assert result.returncode == 0, result.stderr
    status = platform.http.get("/v1/status").json()
    assert sorted(w["device"] for w in status["workers"]) == ["cpu", "gpu"]   # the simulated GPU beside the CPU

    alone = eventually(lambda: (s := training_share(platform)) > 0.6 and s, timeout=60,
                       what="the training loop to run at its limit")
    shares: list[float] = []
    latencies: list[float] = []
    stop = threading.Event()

    def burst() -> None:
        while not stop.is_set():
            reply = platform.invoke("synthetic-latency", {})
            assert reply.status_code == 200, reply.text
            latencies.append(reply.json()["ms"])
            time.sleep(0.05)  # the gap between requests

    sender = threading.Thread(target=burst)
    sender.start()
    try:
        eventually(lambda: len(latencies) >= 5, timeout=60, what="latency requests to run")
        for _ in range(10):
            shares.append(training_share(platform))
            time.sleep(0.2)  # sampling the training loop's progress during the burst
    finally:
        stop.set()
        sender.join()
    assert max(shares) < 0.75 * alone, f"batch work kept {shares} of the GPU beside a latency burst (alone {alone})"
    telemetry = platform.instances("synthetic-training")[0]["telemetry"]
    assert telemetry is not None and telemetry["granted_share"] > 0
    # The latency instance's server told its shim when it served, and the training loop's shim
    # held its launches meanwhile (isolation), reported with the heartbeats.
    eventually(lambda: platform.instances("synthetic-training")[0]["telemetry"]["held_ms"] > 0, timeout=30,
               what="the training instance's launches to have been held for the latency requests")
    described = platform.cli("describe", "synthetic-training")
    assert described.returncode == 0 and "0.5/0.75" in described.stdout, described.stdout
    row = next(line for line in described.stdout.splitlines() if "synthetic-training-" in line and "│" in line)
    held = row.split("│")[10].strip()   # the HELD column: time its launches waited for latency work
    assert held.endswith(" ms") and int(held.split()[0]) > 0, described.stdout

    eventually(lambda: training_share(platform) > 0.6, timeout=30,
               what="the training loop to get its share back after the burst")
    # The platform recorded the squeeze: the token manager's view of the latency instance has KLCs.
    latency_view = platform.instances("synthetic-latency")[0]["telemetry"]
    assert latency_view["klc_ms"] is not None and latency_view["launches"] > 0


def test_dilu_scale_resizes_running_instances(start_platform) -> None:
    platform = start_platform(env={"DILU_FAKE_GPUS": "1", "DILU_GPUS": "none"})
    assert platform.cli("deploy", str(EXAMPLE / "training.yaml")).returncode == 0
    eventually(lambda: training_share(platform) > 0.6, timeout=60, what="the training loop at its limit")
    before = platform.instances("synthetic-training")[0]["id"]
    scaled = platform.cli("scale", "synthetic-training", "--sm-request", "0.2", "--sm-limit", "0.3")
    assert scaled.returncode == 0, scaled.stderr
    eventually(lambda: 0 < training_share(platform) < 0.36, timeout=30, what="the new slice to bite")
    (instance,) = platform.instances("synthetic-training")
    assert instance["id"] == before, "resized in place, not restarted"
    assert (instance["sm_request"], instance["sm_limit"]) == (0.2, 0.3)
    assert any(e["action"] == "resize" for e in platform.http.get("/v1/functions/synthetic-training/events").json())
    bad = platform.cli("scale", "synthetic-training", "--sm-request", "0.9", "--sm-limit", "0.3")
    assert bad.returncode == 1 and "sm_request must be <= sm_limit" in bad.stderr
    # The GPU's token manager runs in a process of its own and has kept its period throughout.
    status = platform.cli("status").stdout
    assert "(its own process)" in status and "gates opened): 0" in status, status


def test_a_resize_that_does_not_fit_is_refused_naming_the_gpu(start_platform) -> None:
    """Training (0.5/0.75) and latency (0.5/0.75) fill the GPU's requests; growing one is a 409
    naming the GPU and the shortfall, and nothing changes."""
    platform = start_platform(env={"DILU_FAKE_GPUS": "1", "DILU_GPUS": "none"})
    for spec in ("training.yaml", "latency.yaml"):
        assert platform.cli("deploy", str(EXAMPLE / spec)).returncode == 0
    refused = platform.http.patch("/v1/functions/synthetic-latency/slice", json={"sm_request": 0.7, "sm_limit": 0.8})
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert "fakegpu0" in error and "compute requests would total 1.20 > 1 (short by 0.20)" in error, error
    cli = platform.cli("scale", "synthetic-latency", "--sm-request", "0.7", "--sm-limit", "0.8")
    assert cli.returncode == 1 and "short by 0.20" in cli.stderr and "Traceback" not in cli.stderr
    (instance,) = platform.instances("synthetic-latency")
    assert (instance["sm_request"], instance["sm_limit"]) == (0.5, 0.75)
    assert platform.function("synthetic-latency")["spec"]["resources"]["sm_request"] == 0.5
    shrunk = platform.http.patch("/v1/functions/synthetic-latency/slice", json={"sm_request": 0.3, "sm_limit": 0.5})
    assert shrunk.status_code == 200, shrunk.text
