"""Cold start, scale to zero after keep-alive, and replacement of a killed instance."""

from __future__ import annotations

import os
import shutil
import signal
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.conftest import FIXTURE_FUNCTIONS
from tests.waiting import eventually

# It measures how the platform reacts to load: it runs with no other test beside it (scripts/test).
pytestmark = pytest.mark.alone


def _copy_with(tmp_path: Path, folder: str, name: str, extra_yaml: str) -> Path:
    source = shutil.copytree(FIXTURE_FUNCTIONS / folder, tmp_path / name)
    spec = source / "model.yaml"
    text = spec.read_text()
    text = "\n".join(line for line in text.splitlines() if not line.startswith("scaling:")
                     and not line.startswith("  keep_alive_s"))
    spec.write_text(text.replace(f"name: {folder}", f"name: {name}") + "\n" + extra_yaml)
    return spec


def test_first_request_rides_a_cold_start_then_scales_to_zero_and_back(start_platform, tmp_path: Path) -> None:
    platform = start_platform()
    spec = _copy_with(tmp_path, "ok", "sleepy", "scaling:\n  min_instances: 0\n  keep_alive_s: 1\n")
    deployed = platform.cli("deploy", str(spec))
    assert deployed.returncode == 0, deployed.stderr

    eventually(lambda: platform.function("sleepy")["ready_instances"] == 0 and not platform.instances("sleepy"),
               timeout=60, what="scale to zero after the keep-alive")
    reply = platform.invoke("sleepy", {"wake": True})
    assert reply.status_code == 200, reply.text
    assert reply.json()["input"] == {"wake": True}
    assert float(reply.headers["x-dilu-queued-ms"]) > 0, "a request that met a cold start says how long it waited"
    assert platform.function("sleepy")["ready_instances"] == 1
    assert "x-dilu-queued-ms" not in platform.invoke("sleepy", {"warm": True}).headers
    events = platform.http.get("/v1/functions/sleepy/events").json()
    actions = [e["action"] for e in events]
    assert "scale-down" in actions and any("scale from zero" in e["reason"] for e in events)

    # And it goes back to zero again once idle.
    eventually(lambda: not platform.instances("sleepy"), timeout=60, what="scale to zero again")


def test_killed_instance_is_replaced_and_the_next_request_succeeds(start_platform, tmp_path: Path) -> None:
    platform = start_platform()
    spec = _copy_with(tmp_path, "ok", "sturdy", "scaling:\n  min_instances: 1\n  keep_alive_s: 300\n")
    assert platform.cli("deploy", str(spec)).returncode == 0
    first = platform.invoke("sturdy", {"n": 1}).json()
    os.kill(first["pid"], signal.SIGKILL)

    reply = platform.invoke("sturdy", {"n": 2})
    assert reply.status_code == 200, reply.text
    assert reply.json()["pid"] != first["pid"]
    eventually(lambda: any(e["action"] == "crashed" for e in platform.http.get("/v1/functions/sturdy/events").json()),
               timeout=30, what="the crash to be recorded")
    eventually(lambda: [i["state"] for i in platform.instances("sturdy")] == ["ready"], timeout=60,
               what="exactly one ready replacement")


def test_the_keep_alive_counts_from_when_the_last_request_was_answered(start_platform, tmp_path: Path) -> None:
    """A request longer than the keep-alive (3 s of work, 2 s kept): the instance stays its
    keep-alive after the answer (counted from the request's start, it was stopped as it answered)."""
    platform = start_platform()
    spec = _copy_with(tmp_path, "cpu_burn", "longrun", "scaling:\n  min_instances: 0\n  keep_alive_s: 2\n")
    spec.write_text(spec.read_text().replace("cpu_ms: 20", "cpu_ms: 3000").replace("name: burn", "name: longrun"))
    assert platform.cli("deploy", str(spec)).returncode == 0
    eventually(lambda: not platform.instances("longrun"), timeout=60, what="the deployment's instance to go")
    reply = platform.invoke("longrun", {})
    answered = time.time()
    assert reply.status_code == 200, reply.text
    instance = reply.headers["x-dilu-instance"]

    def ended() -> float | None:
        rows = platform.http.get("/v1/functions/longrun/instances", params={"all": "true"}).json()
        row = next((r for r in rows if r["id"] == instance and r["ended_at"]), None)
        return datetime.fromisoformat(row["ended_at"]).timestamp() if row else None

    stopped = eventually(ended, timeout=60, what="the idle instance to be stopped")
    assert stopped - answered >= 1.5, f"stopped {stopped - answered:.2f} s after it answered (keep-alive 2 s)"
