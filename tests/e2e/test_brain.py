"""The controller's brain on the CPU: real profiling under CPU quotas, lazy horizontal scaling
under a bursty trace, and keep-alive with pre-warming from the idle-time histogram."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import FIXTURE_FUNCTIONS, ROOT
from tests.waiting import eventually
from worker.cgroups import CpuLimiter

# It measures how the platform reacts to load: it runs with no other test beside it (scripts/test).
pytestmark = pytest.mark.alone

TRACE = ROOT / "data" / "traces" / "rps" / "bursty.txt"

needs_cgroups = pytest.mark.skipif(not CpuLimiter().available, reason="no writable cgroup cpu controller")


def burn_function(tmp_path: Path, name: str, extra: str = "") -> Path:
    source = shutil.copytree(FIXTURE_FUNCTIONS / "cpu_burn", tmp_path / name)
    (source / "model.yaml").write_text(
        f"name: {name}\nhandler: handler:Burn\nmodel:\n  cpu_ms: 10\nslo:\n  p99_ms: 120\n"
        "resources:\n  memory: 64Mi\n  gpu: false\nbatching:\n  max_batch_size: 8\n  max_wait_ms: 2\n" + extra)
    return source / "model.yaml"


@needs_cgroups
def test_an_unpinned_function_is_profiled_under_cpu_quotas_and_placed(start_platform, tmp_path: Path) -> None:
    platform = start_platform(env={"DILU_PROFILING": "true", "DILU_PROFILE_TRIAL_S": "0.4",
                                   "DILU_PROFILE_MAX_BATCH": "8"})
    deployed = platform.cli("deploy", str(burn_function(tmp_path, "burner")), timeout=300)
    assert deployed.returncode == 0, deployed.stderr
    assert "profiled: compute request" in deployed.stdout
    profile = platform.function("burner")["profile"]
    assert profile["status"] == "done" and profile["meets_slo"]
    assert 0 < profile["sm_request"] < 1.0 and profile["sm_request"] <= profile["sm_limit"]
    assert profile["latency_ms"] <= 120 and profile["throughput_per_s"] > 0
    assert 0 < profile["trials"] < 60, "far fewer trials than the 6 x 10 grid"
    (instance,) = [i for i in platform.instances("burner") if i["role"] == "serve"]
    assert (instance["sm_request"], instance["sm_limit"]) == (profile["sm_request"], profile["sm_limit"])
    reply = platform.invoke("burner", {})
    assert reply.status_code == 200 and reply.json()["batch"] >= 1
    events = platform.http.get("/v1/functions/burner/events").json()
    assert any(e["action"] == "profiled" for e in events)
    described = platform.cli("describe", "burner")
    assert "profile: request" in described.stdout


async def _replay(url: str, rates: list[float], stop_at: float) -> int:
    """Sends each second's requests spread over that second (open loop, bounded)."""
    sent = 0
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=64)) as client:
        pending: set[asyncio.Task] = set()
        for rate in rates:
            second = time.monotonic()
            count = int(round(rate))
            for index in range(count):
                pending.add(asyncio.create_task(client.post(url, json={})))
                sent += 1
                await asyncio.sleep(max(0.0, second + (index + 1) / max(count, 1) - time.monotonic()))
            if time.monotonic() > stop_at:
                break
            await asyncio.sleep(max(0.0, second + 1 - time.monotonic()))
        results = await asyncio.gather(*pending, return_exceptions=True)
    failures = [r for r in results if isinstance(r, Exception) or r.status_code != 200]
    assert not failures, failures[:3]
    return sent


@needs_cgroups
def test_bursty_load_scales_out_lazily_and_back_in(start_platform, tmp_path: Path) -> None:
    platform = start_platform(env={
        "DILU_PROFILING": "true", "DILU_PROFILE_TRIAL_S": "0.4",
        "DILU_HORIZONTAL_WINDOW": "10", "DILU_HORIZONTAL_OUT_SAMPLES": "5", "DILU_HORIZONTAL_IN_SAMPLES": "6"})
    spec = burn_function(tmp_path, "bursty", "scaling:\n  min_instances: 1\n  max_instances: 4\n  keep_alive_s: 600\n")
    assert platform.cli("deploy", str(spec), timeout=300).returncode == 0
    profile = platform.function("bursty")["profile"]
    capacity = profile["throughput_per_s"]
    assert 1 <= profile["batch"] <= 8, "the search stays within the spec's max_batch_size"
    events = platform.http.get("/v1/functions/bursty/events").json()
    profiled = [e["reason"] for e in events if e["action"] == "profiled"]
    assert profiled and "formed on average" in profiled[0] and "p99" in profiled[0], profiled
    assert profile["batch"] == 8 or "of up to 8: batch" in profiled[0], "a batch below the bound says why"
    trace = [float(line) for line in TRACE.read_text().split()]
    start = max(range(len(trace) - 40), key=lambda i: sum(trace[i:i + 20]) - sum(trace[i + 20:i + 40]))
    segment = trace[start:start + 40]  # a 20 s burst, then 20 s of calm
    scale = 2.5 * capacity / (sum(segment[:20]) / 20)
    rates = [r * scale for r in segment]
    began = time.time()
    asyncio.run(_replay(f"{platform.url}/v1/functions/bursty/invoke", rates, time.monotonic() + 60))

    def horizontal(action: str) -> list[dict]:
        return [e for e in platform.http.get("/v1/functions/bursty/events").json()
                if e["action"] == action and "samples" in e["reason"]]

    ups = eventually(lambda: horizontal("scale-up"), timeout=30, what="a lazy scale-out")
    first_up = ups[0]["at"]
    from datetime import datetime

    delay = datetime.fromisoformat(first_up).timestamp() - began
    # On the trend (a second over capacity, the backlog growing): within the 20 s burst it is for.
    assert delay < 20, f"scaled out after {delay:.1f}s of overload: after the burst"
    eventually(lambda: horizontal("scale-down"), timeout=60, what="scale-in once the burst is over")


def test_an_idle_function_goes_to_zero_and_is_prewarmed_before_its_next_request(start_platform,
                                                                                tmp_path: Path) -> None:
    # Weighing memory against cold starts off: a 64 MiB instance would otherwise be worth holding
    # through these short gaps; this is about the histogram's timing.
    platform = start_platform(env={"DILU_KEEPALIVE_MIN_SAMPLES": "3", "DILU_KEEPALIVE_MIN_UNLOAD_S": "2",
                                   "DILU_KEEPALIVE_REQUEST_WORTH_GB_S": "0"})
    source = shutil.copytree(FIXTURE_FUNCTIONS / "ok", tmp_path / "regular")
    (source / "model.yaml").write_text(
        "name: regular\nhandler: handler:Echo\nresources:\n  memory: 64Mi\n  gpu: false\n"
        "scaling:\n  min_instances: 0\n  keep_alive_s: 600\n")
    assert platform.cli("deploy", str(source / "model.yaml")).returncode == 0
    served_warm = []
    for index in range(6):
        if index:
            # Regular 8 s gaps: the histogram learns them, unloads the instance after each request
            # and pre-warms it shortly before the next one.
            deadline = time.monotonic() + 8
            eventually(lambda until=deadline: time.monotonic() >= until, timeout=10, interval=0.05)
        warm = bool([i for i in platform.instances("regular") if i["state"] == "ready"])
        assert platform.invoke("regular", {"n": index}).status_code == 200
        served_warm.append(warm)
    events = platform.http.get("/v1/functions/regular/events").json()
    reasons = [e["reason"] for e in events]
    assert any("pre-warm at" in r for r in reasons), reasons
    assert any(r.startswith("pre-warm") for r in reasons), reasons
    assert served_warm[-1] and served_warm[-2], f"the last requests found a pre-warmed instance: {served_warm}"


@needs_cgroups
def test_profiling_interrupted_by_a_restart_starts_over(start_platform, tmp_path: Path) -> None:
    env = {"DILU_PROFILING": "true", "DILU_PROFILE_TRIAL_S": "1.0"}
    first = start_platform(env=env, name="home")
    spec = burn_function(tmp_path, "restarted")
    assert first.cli("deploy", str(spec), "--no-wait").returncode == 0
    eventually(lambda: (first.function("restarted").get("profile") or {}).get("trials", 0) >= 1, timeout=60,
               what="profiling to be under way")
    first.close()
    second = start_platform(env=env, name="home")  # same state folder, new controller
    function = second.wait_ready("restarted", timeout=180)
    assert function["profile"]["status"] == "done"
    reasons = [e["reason"] for e in second.http.get("/v1/functions/restarted/events").json()]
    assert any("profiling restarts" in r for r in reasons), reasons
    # Profiling instances (the interrupted run's and the finished run's) end; none is left running.
    eventually(lambda: not [i for i in second.http.get("/v1/functions/restarted/instances").json()
                            if i["role"] == "profile"], timeout=30, what="no profiling instance left")


@needs_cgroups
def test_a_training_loop_is_profiled_by_its_reported_progress(start_platform) -> None:
    """The PyTorch training example reports samples with dilu.report_progress: profiling searches
    its slice by that rate (request <= limit, on the 5 % grid), describe shows the rate."""
    platform = start_platform(env={"DILU_PROFILING": "true", "DILU_PROFILE_TRIAL_S": "1.5"})
    deployed = platform.cli("deploy", str(ROOT / "examples" / "train-mlp" / "training.yaml"), timeout=300)
    assert deployed.returncode == 0, deployed.stderr
    profile = platform.function("train-mlp")["profile"]
    assert profile["status"] == "done" and profile["kind"] == "training", profile
    # Where the knee lies is a measurement (a rate), not asserted here: on a two-core host the
    # platform's own processes share the cores with the trials and move a 1.5 s trial's rate by
    # more than the knee's 10 % margin. The searches over the measured rates are unit-tested
    # (test_profiler.py); here, the full-host trial plus a bisection of the twenty 5 % shares.
    assert profile["trials"] >= 1 + 4, profile
    assert round(profile["sm_request"] * 100) % 5 == 0 and round(profile["sm_limit"] * 100) % 5 == 0, profile
    assert profile["sm_request"] <= profile["sm_limit"], profile
    assert profile["throughput_per_s"] > 0
    described = eventually(lambda: (d := platform.cli("describe", "train-mlp")).returncode == 0
                           and "/s" in d.stdout.split("PROGRESS")[-1] and d, timeout=30,
                           what="describe to show the progress rate")
    assert "units/s of progress" in described.stdout
    assert platform.invoke("train-mlp", {}).json()["steps"] > 0


def test_profiling_without_a_sample_input_fails_the_deployment_saying_what_to_add(start_platform,
                                                                                  tmp_path: Path) -> None:
    platform = start_platform(env={"DILU_PROFILING": "true"})
    source = shutil.copytree(FIXTURE_FUNCTIONS / "ok", tmp_path / "nosample")
    (source / "request.json").unlink()
    (source / "model.yaml").write_text("name: nosample\nhandler: handler:Echo\nresources:\n  memory: 64Mi\n")
    result = platform.cli("deploy", str(source / "model.yaml"))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "add request.json" in result.stderr and "pin the slice" in result.stderr, result.stderr
    (source / "request.json").write_text("{not json")
    result = platform.cli("deploy", str(source / "model.yaml"))
    assert result.returncode == 1 and "request.json is not valid JSON" in result.stderr, result.stderr


@needs_cgroups
def test_a_sample_the_function_fails_on_fails_the_deployment_with_its_error(start_platform, tmp_path: Path) -> None:
    platform = start_platform(env={"DILU_PROFILING": "true", "DILU_PROFILE_TRIAL_S": "0.2"})
    source = shutil.copytree(FIXTURE_FUNCTIONS / "picky", tmp_path / "picky")
    (source / "model.yaml").write_text("name: picky\nhandler: handler:Picky\n"
                                       "resources:\n  memory: 64Mi\n  gpu: false\n")
    (source / "request.json").write_text('{"x": "four"}')
    result = platform.cli("deploy", str(source / "model.yaml"), timeout=300)
    assert result.returncode == 1, result.stdout
    assert "profiling failed" in result.stderr and "HTTP 422" in result.stderr
    assert "x must be a number, got 'four'" in result.stderr, result.stderr
    profile = platform.function("picky")["profile"]
    assert profile["status"] == "failed" and profile["sm_request"] is None, "no whole-device award"
