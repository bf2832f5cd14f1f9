"""Process-runtime instances of a root worker run as their function's own unprivileged user, in a
folder of their own, out of reach of the worker's state, of other functions (code, files,
/proc) and of the worker's secrets; simulated-GPU instances still reach their token manager; a
root worker whose Python those users cannot run refuses to start instead of running code as root."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import FIXTURE_FUNCTIONS, ROOT
from tests.platform import dilu_executable
from tests.shim_harness import build_shim
from tests.waiting import eventually
from worker.sandbox import platform_reach, runtime_problem
from worker.uids import InstanceUser

FIRST_UID = 300000     # the default DILU_INSTANCE_UIDS starts here


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "the user switch is what a root worker does"
    problem = runtime_problem(sys.executable, InstanceUser(FIRST_UID, FIRST_UID, "probe"),
                              platform_reach(sys.executable))
    if problem is None:
        return None
    return f"instance users cannot start the instance runtime here ({problem})"


switching_users = pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))
SECRET = "s3cr3t-cluster-key-of-the-platform-0123"


def deploy_snoop(platform, tmp_path: Path, name: str, extra: str = "") -> None:
    source = shutil.copytree(FIXTURE_FUNCTIONS / "snoop", tmp_path / name)
    spec = (source / "model.yaml").read_text().replace("name: snoop", f"name: {name}") + extra
    (source / "model.yaml").write_text(spec)
    (source / "secret.txt").write_text(f"only {name} may read this")
    (source / "secret.txt").chmod(0o600)
    deployed = platform.cli("deploy", str(source / "model.yaml"))     # uploaded as a bundle
    assert deployed.returncode == 0, deployed.stderr


def snoop(platform, name: str, **probe) -> dict:
    reply = platform.invoke(name, probe)
    assert reply.status_code == 200, reply.text
    return reply.json()


@switching_users
def test_instances_run_unprivileged_and_apart(start_platform, tmp_path: Path) -> None:
    platform = start_platform(env={"DILU_CLUSTER_KEY": SECRET, "MY_PLATFORM_TOKEN": "t0ken"})
    deploy_snoop(platform, tmp_path, "alpha")
    # A PYTHON* variable is read at start-up, so beta's instance is a fresh process, alpha's a spare.
    deploy_snoop(platform, tmp_path, "beta", "env: {PYTHONDONTWRITEBYTECODE: '1'}\n")
    home = platform.home
    alpha = snoop(platform, "alpha", paths=[str(home / "dilu.db"), str(home / "bundles"), str(home / "logs"),
                                           "/root", "secret.txt"],
                  env=["DILU_CLUSTER_KEY", "MY_PLATFORM_TOKEN", "DILU_DATABASE_URL", "PATH"])
    assert alpha["uid"] >= FIRST_UID and (alpha["gid"], alpha["groups"]) == (alpha["uid"], [])
    assert alpha["readable"] == {str(home / "dilu.db"): False, str(home / "bundles"): False,
                                 str(home / "logs"): False, "/root": False,
                                 "secret.txt": True}     # its own code, even a file only its owner could read
    assert alpha["env"]["DILU_CLUSTER_KEY"] is None and alpha["env"]["MY_PLATFORM_TOKEN"] is None
    assert alpha["env"]["DILU_DATABASE_URL"] is None and alpha["env"]["PATH"]
    assert alpha["home_writable"] and alpha["home"] != os.environ.get("HOME")
    sandbox = Path(alpha["cwd"]).parent
    assert sandbox.stat().st_uid == alpha["uid"] and (sandbox.stat().st_mode & 0o777) == 0o700

    # beta, as an attacker: another user, and nothing of alpha's is readable.
    victim = f"/proc/{alpha['pid']}"
    beta = snoop(platform, "beta", paths=[f"{victim}/environ", f"{victim}/cwd", f"{victim}/root", alpha["cwd"],
                                          f"{alpha['cwd']}/secret.txt", f"{alpha['cwd']}/handler.py"],
                 env=["DILU_CLUSTER_KEY"])
    assert beta["uid"] >= FIRST_UID and beta["uid"] != alpha["uid"]
    assert not any(beta["readable"].values()), beta["readable"]
    assert beta["env"]["DILU_CLUSTER_KEY"] is None
    # Its own /proc is its own (a fresh process), as alpha's is (a spare that switched users).
    assert snoop(platform, "beta", paths=[f"/proc/{beta['pid']}/environ"])["readable"] == {
        f"/proc/{beta['pid']}/environ": True}
    assert snoop(platform, "alpha", paths=["/proc/self/environ", "/proc/self/fd"])["readable"] == {
        "/proc/self/environ": True, "/proc/self/fd": True}

    # A function keeps its user across instances; deleting the function removes its folder.
    assert platform.cli("rm", "alpha").returncode == 0
    eventually(lambda: not sandbox.exists(), timeout=30, what="the instance folder to be removed")
    (tmp_path / "again").mkdir()
    deploy_snoop(platform, tmp_path / "again", "alpha")
    assert snoop(platform, "alpha")["uid"] == alpha["uid"]


@pytest.fixture
def closed_folder():
    """A new folder only its owner may traverse, as /root is (pytest's own temp folders lie
    below one already, which would then be the folder to reach through)."""
    folder = Path(tempfile.mkdtemp(prefix="dilu-closed-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def python_in_a_closed_folder(closed: Path) -> tuple[Path, Path]:
    """(a Python environment below ``closed``, with Dilu and its libraries; ``closed``). Beside
    the environment lies a file of root's."""
    assert (closed.stat().st_mode & 0o777) == 0o700
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(closed / "env")], check=True)
    (closed / "private-notes").write_text("root's own")
    (closed / "private-notes").chmod(0o644)     # readable by all, were the folder open
    site = next((closed / "env" / "lib").glob("python3*/site-packages"))
    outer = next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
    (site / "dilu-outer.pth").write_text(f"import site; site.addsitedir({outer!r})\n")
    return closed / "env" / "bin" / "python", closed


@switching_users
def test_a_root_worker_whose_python_lies_under_a_closed_folder_serves_without_opening_it(
        start_platform, tmp_path: Path, closed_folder: Path) -> None:
    python, closed = python_in_a_closed_folder(closed_folder)
    platform = start_platform(env={"DILU_PYTHON": str(python)})
    deploy_snoop(platform, tmp_path, "alpha")
    seen = snoop(platform, "alpha", paths=[str(closed)],
                 exists=[str(closed / "private-notes"), str(platform.home / "dilu.db"), str(python)])
    assert seen["uid"] >= FIRST_UID
    # The instance reaches its Python; the folder's other files are not even there in its view.
    assert seen["exists"] == {str(closed / "private-notes"): False, str(platform.home / "dilu.db"): False,
                              str(python): True}
    assert seen["readable"] == {str(closed): False}     # traversable only, not listable
    assert (closed.stat().st_mode & 0o777) == 0o700, "the host's folder stays closed"
    assert f"{closed} shows them only {closed / 'env'} (read-only)" in platform.role.log()


@pytest.mark.skipif(os.geteuid() != 0, reason="the user switch is what a root worker does")
def test_a_root_worker_refuses_a_python_without_dilu_and_says_so(tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    env = {**os.environ, "DILU_HOME": str(tmp_path / "home"), "DILU_PYTHON": str(bare / "bin" / "python"),
           "DILU_GRPC_PORT": "0"}
    started = subprocess.run([dilu_executable(), "up", "--port", "0"], env=env, capture_output=True, text=True,
                             timeout=120, stdin=subprocess.DEVNULL)
    assert started.returncode != 0
    assert "cannot import Dilu's instance runtime (ModuleNotFoundError: No module named 'worker')" in started.stderr
    assert "Instances need a Python with Dilu installed" in started.stderr and "readable" not in started.stderr
    assert "Traceback" not in started.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="the user switch is what a root worker does")
def test_a_root_worker_that_cannot_run_instances_unprivileged_refuses_to_start(tmp_path: Path,
                                                                              closed_folder: Path) -> None:
    python, closed = python_in_a_closed_folder(closed_folder)
    (closed / "env").chmod(0o700)       # the environment itself closed: no view can open it
    env = {**os.environ, "DILU_HOME": str(tmp_path / "home"), "DILU_PYTHON": str(python), "DILU_GRPC_PORT": "0"}
    started = subprocess.run([dilu_executable(), "up", "--port", "0"], env=env, capture_output=True, text=True,
                             timeout=120, stdin=subprocess.DEVNULL)
    assert started.returncode != 0
    assert "instance code never runs as root" in started.stderr, started.stderr
    assert f"chmod o+rx {closed / 'env'}" in started.stderr, started.stderr
    assert "Traceback" not in started.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="a root worker runs each function as its own user")
def test_a_root_worker_refuses_mps_which_serves_one_user_at_a_time(tmp_path: Path) -> None:
    env = {**os.environ, "DILU_HOME": str(tmp_path / "home"), "DILU_GRPC_PORT": "0", "DILU_MPS": "on",
           "DILU_FAKE_GPUS": "1", "DILU_GPUS": "none"}
    started = subprocess.run([dilu_executable(), "up", "--port", "0"], env=env, capture_output=True, text=True,
                             timeout=120, stdin=subprocess.DEVNULL)
    assert started.returncode != 0
    assert "MPS server serves one user at a time" in started.stderr, started.stderr
    assert "Traceback" not in started.stderr


@switching_users
def test_gpu_instances_reach_the_token_manager_as_another_user(start_platform) -> None:
    build_shim()
    platform = start_platform(env={"DILU_FAKE_GPUS": "1", "DILU_GPUS": "none"})
    deployed = platform.cli("deploy", str(ROOT / "examples" / "synthetic-gpu" / "latency.yaml"))
    assert deployed.returncode == 0, deployed.stderr
    platform.wait_ready("synthetic-latency")
    assert platform.invoke("synthetic-latency", {}).status_code == 200

    def gated() -> bool:   # its kernels went through the shim's gate (reported with the heartbeat)
        telemetry = platform.instances("synthetic-latency")[0]["telemetry"]
        return telemetry is not None and telemetry["launches"] > 0

    eventually(gated, timeout=30,
               what=f"token-manager telemetry; logs: {platform.cli('logs', 'synthetic-latency').stdout}")
