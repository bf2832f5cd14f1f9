"""Scaling that follows occupancy: work that holds an instance for long barely shows in a rate."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.conftest import FIXTURE_FUNCTIONS
from tests.waiting import eventually


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
