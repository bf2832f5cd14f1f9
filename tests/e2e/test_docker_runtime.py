"""The docker runtime against the real Docker engine: function containers from an uploaded bundle,
replaced when killed, adopted by a restarted worker, resized at run time, unprivileged, with the
shim and the token manager's socket mounted read-only.

Needs a Docker engine and the images `scripts/ci-images` builds (`.ci/run` runs it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from tests.conftest import FIXTURE_FUNCTIONS, ROOT
from tests.platform import Platform
from tests.waiting import eventually
from worker.backends.bounds import RUNTIME_MEMORY

RUNTIME_IMAGE = "dilu/runtime-cpu:latest"


def _docker(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60)


def _docker_ready() -> str | None:
    if shutil.which("docker") is None:
        return "no docker client"
    if _docker("info").returncode != 0:
        return "no Docker engine answers"
    if _docker("image", "inspect", RUNTIME_IMAGE).returncode != 0:
        return f"{RUNTIME_IMAGE} is not built (scripts/ci-images)"
    return None


pytestmark = pytest.mark.skipif(_docker_ready() is not None, reason=str(_docker_ready()))


def containers(function: str) -> list[dict]:
    ids = _docker("ps", "-q", "--filter", f"label=dev.dilu.function={function}").stdout.split()
    return json.loads(_docker("inspect", *ids).stdout) if ids else []


def one_container(function: str) -> dict:
    return eventually(lambda: (found := containers(function)) and len(found) == 1 and found[0],
                      timeout=60, what=f"one running container of {function}")


@pytest.fixture
def whoami_folder(tmp_path: Path) -> Path:
    """The whoami function plus files its .dilignore leaves out of the bundle."""
    folder = tmp_path / "whoami"
    shutil.copytree(FIXTURE_FUNCTIONS / "whoami", folder)
    (folder / "big.bin").write_bytes(os.urandom(1024))
    (folder / "notes").mkdir()
    (folder / "notes" / "todo.txt").write_text("not code")
    return folder


def test_bundle_container_kill_resize_adopt(tmp_path: Path, whoami_folder: Path) -> None:
    env = {"DILU_RUNTIME": "docker", "DILU_GPUS": "none"}
    platform = Platform(tmp_path / "home", env=env)
    try:
        deployed = platform.cli("deploy", str(whoami_folder / "model.yaml"))
        assert deployed.returncode == 0, deployed.stderr
        function = platform.function("whoami")
        assert function["bundle"].startswith("sha256:") and function["source_dir"] == ""

        reply = platform.invoke("whoami", {"n": 1})
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["uid"] != 0                                     # never root
        assert body["cwd"] == "/opt/dilu/function"
        assert "handler.py" in body["files"] and "model.yaml" in body["files"]
        assert "big.bin" not in body["files"] and "notes" not in body["files"]   # .dilignore honoured

        container = one_container("whoami")
        host = container["HostConfig"]
        assert host["NetworkMode"] == "host" and host["ReadonlyRootfs"] is True
        assert host["CapDrop"] == ["ALL"] and host["Memory"] == 256 * 2**20 + RUNTIME_MEMORY
        assert container["Config"]["User"] not in ("", "0", "root", "0:0")
        code = [m for m in container["Mounts"] if m["Destination"] == "/opt/dilu/function"]
        assert len(code) == 1 and code[0]["RW"] is False

        # Vertical scaling of a CPU function in a container: the CFS quota follows the slice.
        scaled = platform.cli("scale", "whoami", "--sm-request", "0.2", "--sm-limit", "0.3")
        assert scaled.returncode == 0, scaled.stderr
        expected_quota = int(0.3 * (os.cpu_count() or 1) * 100_000)
        eventually(lambda: one_container("whoami")["HostConfig"]["CpuQuota"] == expected_quota,
                   timeout=20, what="the container's CPU quota to follow the slice")

        # docker kill under load: the container is replaced and no request goes unanswered.
        statuses: list[int] = []
        stop = threading.Event()

        def load() -> None:
            while not stop.is_set() and len(statuses) < 400:
                statuses.append(platform.invoke("whoami", {"n": len(statuses)}).status_code)

        sender = threading.Thread(target=load)
        sender.start()
        eventually(lambda: len(statuses) >= 20, timeout=30, what="requests before the kill")
        killed = container["Id"]
        assert _docker("kill", killed).returncode == 0
        eventually(lambda: (found := containers("whoami")) and found[0]["Id"] != killed
                   and platform.invoke("whoami", {}).status_code == 200,
                   timeout=60, what="a replacement container that serves")
        count_at_replacement = len(statuses)
        eventually(lambda: len(statuses) >= count_at_replacement + 20, timeout=30, what="requests after")
        stop.set()
        sender.join(60)
        assert statuses and all(status == 200 for status in statuses), sorted(set(statuses))

        # The worker dies (SIGKILL): its containers live on; the next run adopts them.
        before = one_container("whoami")
        instance = platform.invoke("whoami", {}).headers["x-dilu-instance"]
        platform.role.process.send_signal(signal.SIGKILL)
        platform.role.process.wait(30)
        assert containers("whoami")[0]["Id"] == before["Id"]
    finally:
        platform.close()

    restarted = Platform(tmp_path / "home", env=env)
    try:
        reply = eventually(lambda: (r := restarted.invoke("whoami", {})).status_code == 200 and r,
                           timeout=60, what="the adopted instance to serve")
        assert reply.headers["x-dilu-instance"] == instance
        assert one_container("whoami")["Id"] == before["Id"]
        log = restarted.cli("logs", "whoami")
        assert log.returncode == 0 and instance in log.stdout
    finally:
        restarted.close()
    # A worker that stops normally stops its instances' containers.
    eventually(lambda: not containers("whoami"), timeout=30, what="the containers to be removed")


def test_gpu_container_gets_the_shim_read_only(tmp_path: Path) -> None:
    platform = Platform(tmp_path / "home", env={"DILU_RUNTIME": "docker", "DILU_GPUS": "none",
                                                "DILU_FAKE_GPUS": "1"})
    try:
        spec = ROOT / "examples" / "synthetic-gpu" / "latency.yaml"
        deployed = platform.cli("deploy", str(spec))
        assert deployed.returncode == 0, deployed.stderr
        reply = platform.invoke("synthetic-latency", json.loads((spec.parent / "request.json").read_text()))
        assert reply.status_code == 200, reply.text

        container = one_container("synthetic-latency")
        mounts = {m["Destination"]: m for m in container["Mounts"]}
        assert mounts["/opt/dilu/shim"]["RW"] is False
        assert mounts["/run/dilu"]["RW"] is False
        env = dict(item.split("=", 1) for item in container["Config"]["Env"])
        assert env["LD_PRELOAD"] == "/opt/dilu/shim/libdilu_shim.so"
        assert env["DILU_TOKEN_SOCKET"].startswith("/run/dilu/")
        # The shim inside the container registered with the worker's token manager and its
        # kernel launches were counted there.
        instance = reply.headers["x-dilu-instance"]

        def launches_counted() -> bool:
            rows = platform.instances("synthetic-latency")
            view = next((r.get("telemetry") or {} for r in rows if r["id"] == instance), {})
            return view.get("processes", 0) >= 1 and view.get("launches", 0) >= 40

        eventually(launches_counted, timeout=20, what="the token manager to see the container's launches")
    finally:
        platform.close()
