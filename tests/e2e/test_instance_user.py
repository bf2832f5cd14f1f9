"""Process-runtime instances of a root worker run as an unprivileged user, in a folder of their
own, out of reach of the worker's state; simulated-GPU instances still reach their token manager."""

from __future__ import annotations

import os
import pwd
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import FIXTURE_FUNCTIONS, ROOT
from tests.shim_harness import build_shim
from tests.waiting import eventually
from worker.sandbox import resolve_user, runtime_problem

def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "the user switch is what a root worker does"
    problem = runtime_problem(sys.executable, resolve_user("nobody"), Path("/"))
    return f"nobody cannot start the instance runtime here ({problem}); .ci/run opens the way" if problem else None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))


def test_instances_run_unprivileged_and_apart(start_platform, tmp_path: Path) -> None:  # noqa: ANN001
    platform = start_platform()
    source = shutil.copytree(FIXTURE_FUNCTIONS / "snoop", tmp_path / "snoop")
    (source / "secret.txt").write_text("only root may read this")
    (source / "secret.txt").chmod(0o600)
    deployed = platform.cli("deploy", str(source / "model.yaml"))     # uploaded as a bundle
    assert deployed.returncode == 0, deployed.stderr
    home = platform.home
    reply = platform.invoke("snoop", {"paths": [str(home / "dilu.db"), str(home / "bundles"), str(home / "logs"),
                                                "/root", "secret.txt"]})
    assert reply.status_code == 200, reply.text
    seen = reply.json()
    nobody = pwd.getpwnam("nobody")
    assert (seen["uid"], seen["gid"], seen["groups"]) == (nobody.pw_uid, nobody.pw_gid, [])
    assert seen["readable"] == {str(home / "dilu.db"): False, str(home / "bundles"): False,
                                str(home / "logs"): False, "/root": False,
                                "secret.txt": True}     # its own code, even a file only its owner could read
    assert seen["home_writable"] and seen["home"] != os.environ.get("HOME")
    sandbox = Path(seen["cwd"]).parent
    assert sandbox.stat().st_uid == nobody.pw_uid and (sandbox.stat().st_mode & 0o777) == 0o700

    # Deleting the function removes its folder.
    assert platform.cli("rm", "snoop").returncode == 0
    eventually(lambda: not sandbox.exists(), timeout=30, what="the instance folder to be removed")


def test_gpu_instances_reach_the_token_manager_as_another_user(start_platform) -> None:  # noqa: ANN001
    build_shim()
    platform = start_platform(env={"DILU_FAKE_GPUS": "1", "DILU_GPUS": "none"})
    deployed = platform.cli("deploy", str(ROOT / "examples" / "synthetic-gpu" / "latency.yaml"))
    assert deployed.returncode == 0, deployed.stderr
    platform.wait_ready("synthetic-latency")
    assert platform.invoke("synthetic-latency", {}).status_code == 200

    def gated() -> bool:   # its kernels went through the shim's gate (reported with the heartbeat)
        telemetry = platform.instances("synthetic-latency")[0]["telemetry"]
        return telemetry is not None and telemetry["launches"] > 0

    eventually(gated, timeout=30, what=f"token-manager telemetry; logs: {platform.cli('logs', 'synthetic-latency').stdout}")
