"""Scaling that follows occupancy: work that holds an instance for long barely shows in a rate."""

from __future__ import annotations

import json
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.conftest import FIXTURE_FUNCTIONS
from tests.waiting import eventually
from worker.cgroups import CpuLimiter

# It measures how the platform reacts to load: it runs with no other test beside it (scripts/test).
pytestmark = pytest.mark.alone

needs_cgroups = pytest.mark.skipif(not CpuLimiter().available, reason="no writable cgroup cpu controller")


def test_streams_that_fill_every_slot_scale_out_whatever_their_rate(start_platform, tmp_path: Path) -> None:
    """Eight streams of ten seconds on a function of four slots (its batch) and two instances at
    most: eight requests in ten seconds are no rate to speak of, but they occupy twice what one
    instance holds, so a second instance starts while they still run, and later streams use it."""
    platform = start_platform()
    source = shutil.copytree(FIXTURE_FUNCTIONS / "slow_stream", tmp_path / "slow")
    assert platform.cli("deploy", str(source / "model.yaml")).returncode == 0
    platform.wait_ready("slow-stream")

    def stream(tokens: int) -> set[int]:
        with platform.http.stream("POST", "/v1/functions/slow-stream/invoke", json={"max_new_tokens": tokens},
                                  headers={"accept": "text/event-stream"}) as reply:
            assert reply.status_code == 200
            return {json.loads(line[len("data: "):])["pid"] for line in reply.iter_lines()
                    if line.startswith("data: {") and '"pid"' in line}

    def serving() -> list[dict]:
        return [i for i in platform.instances("slow-stream") if i["state"] == "ready"]

    with ThreadPoolExecutor(8) as pool:
        streams = [pool.submit(stream, 40) for _ in range(8)]
        eventually(lambda: len(serving()) == 2, timeout=60, what="a second instance for the occupied slots")
        assert not all(s.done() for s in streams), "the second instance came only after the streams ended"
        pids = set().union(*(s.result(timeout=120) for s in streams))
    later = set().union(*ThreadPoolExecutor(8).map(stream, [4] * 8))
    assert len(pids | later) == 2, "both instances served streams"


@needs_cgroups
def test_a_profiled_batch_below_the_bound_says_why_and_a_queue_batches_to_the_bound(
        start_platform, tmp_path: Path, instance_visible_dir: Path) -> None:
    """Batching buys this function nothing and a batch of two misses its SLO, so the profile
    keeps batch 1 of the spec's 16 and says why; yet twenty requests queued behind a held one
    leave in batches of 16, the user's bound, not one by one."""
    platform = start_platform(env={"DILU_PROFILING": "true", "DILU_PROFILE_TRIAL_S": "0.4"})
    source = shutil.copytree(FIXTURE_FUNCTIONS / "held_batches", tmp_path / "held")
    deployed = platform.cli("deploy", str(source / "model.yaml"), timeout=300)
    assert deployed.returncode == 0, deployed.stderr
    reason = "batch 1 of up to 16: batch 2 misses the p99 target at every share tried"
    assert reason in deployed.stdout and "batches of up to 16" in deployed.stdout, deployed.stdout
    assert reason in platform.cli("describe", "held-batches").stdout
    assert platform.function("held-batches")["profile"]["batch"] == 1
    (instance,) = [i for i in platform.instances("held-batches") if i["role"] == "serve"]

    def queued() -> int:
        text = httpx.get(instance["endpoint"] + "/metrics", timeout=10).text
        return int(float(re.search(r"^dilu_instance_queued_requests (\S+)$", text, re.M).group(1)))

    with ThreadPoolExecutor(21) as pool:
        held = pool.submit(platform.invoke, "held-batches", {"hold": str(instance_visible_dir)})
        eventually(lambda: (instance_visible_dir / "held").exists(), timeout=30, what="the held batch")
        replies = [pool.submit(platform.invoke, "held-batches", {"n": n}) for n in range(20)]
        eventually(lambda: queued() == 20, timeout=30, what="twenty requests queued at the instance")
        (instance_visible_dir / "open").touch()
        sizes = [reply.result(timeout=60).json()["batch"] for reply in replies]
    assert held.result(timeout=60).json()["batch"] == 1
    assert sorted(sizes, reverse=True) == [16] * 16 + [4] * 4, "the queue left in batches of the bound"
