"""Functions of different owners on one host, each trying the other from its own code: memory,
processes, temp files and the open platform's gateway are fenced; the rows of the tenant-fence
table in docs/DECISIONS.md ("Who may touch what")."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import FIXTURE_FUNCTIONS, ROOT
from tests.e2e.test_instance_user import switching_users
from tests.shim_harness import build_shim
from tests.waiting import eventually
from worker.tokens.peers import MAX_PROCESSES


def deploy_tenant(platform, tmp_path: Path, name: str, extra: str = "", gpu: bool = False) -> None:
    source = shutil.copytree(FIXTURE_FUNCTIONS / "tenant", tmp_path / name)
    spec = (source / "model.yaml").read_text().replace("name: tenant", f"name: {name}") + extra
    if gpu:      # a small slice, so the simulated GPU has room for its neighbours too
        spec = spec.replace("gpu: false", "gpu: true, sm_request: 0.1, sm_limit: 0.2")
    (source / "model.yaml").write_text(spec)
    deployed = platform.cli("deploy", str(source / "model.yaml"))
    assert deployed.returncode == 0, deployed.stderr


def attempt(platform, name: str, what: str, **details) -> dict:
    reply = platform.invoke(name, {"attempt": what, **details})
    assert reply.status_code == 200, reply.text
    return reply.json()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


@switching_users
def test_a_function_past_its_memory_is_killed_and_told_so(start_platform, tmp_path: Path) -> None:
    platform = start_platform()
    deploy_tenant(platform, tmp_path, "greedy")
    assert attempt(platform, "greedy", "allocate", mib=64)["held_mib"] == 64       # within its memory
    reply = platform.invoke("greedy", {"attempt": "allocate", "mib": 512})
    assert reply.status_code != 200 and "error" in reply.json(), reply.text

    def told() -> str | None:
        described = platform.cli("describe", "greedy").stdout
        return described if "out of memory" in described else None

    described = eventually(told, timeout=60, what="the instance's out-of-memory error")
    assert "memory limit of 384 MiB" in described and "resources.memory 128 MiB" in described, described


@switching_users
def test_a_function_cannot_fork_past_its_pids_bound(start_platform, tmp_path: Path) -> None:
    platform = start_platform(env={"DILU_INSTANCE_PIDS": "40"})
    deploy_tenant(platform, tmp_path, "forker")
    forked = attempt(platform, "forker", "fork", count=48)
    assert forked["refused"] > 0 and forked["forked"] < 40, forked
    assert attempt(platform, "forker", "whoami")["uid"] > 0     # the instance itself goes on serving


@switching_users
def test_nothing_of_a_function_outlives_its_removal(start_platform, tmp_path: Path) -> None:
    platform = start_platform()
    deploy_tenant(platform, tmp_path, "lingerer")
    daemon = attempt(platform, "lingerer", "daemon")["daemon"]
    assert _alive(daemon)
    assert platform.cli("rm", "lingerer").returncode == 0
    eventually(lambda: not _alive(daemon), timeout=60, what=f"the function's daemon {daemon} to be ended")


@switching_users
def test_each_instance_has_a_private_tmp_and_dev_shm(start_platform, tmp_path: Path) -> None:
    platform = start_platform()
    deploy_tenant(platform, tmp_path, "planter")
    # A fresh process (a PYTHON* variable is read at start-up) and a spare: both paths are fenced.
    deploy_tenant(platform, tmp_path, "reader", "env: {PYTHONDONTWRITEBYTECODE: '1'}\n")
    for folder in ("/tmp", "/dev/shm"):
        planted = f"{folder}/planted-by-planter"
        assert attempt(platform, "planter", "write", path=planted, text="from planter")["written"]
        assert attempt(platform, "planter", "read", path=planted)["text"] == "from planter"
        assert attempt(platform, "reader", "read", path=planted)["text"] is None
        assert attempt(platform, "reader", "write", path=planted, text="from reader")["written"]
        assert attempt(platform, "planter", "read", path=planted)["text"] == "from planter"
        assert not os.path.exists(planted), "nothing of it reaches the host's own folder"


@switching_users
def test_an_open_platform_is_open_to_its_users_not_to_its_functions(start_platform, tmp_path: Path) -> None:
    platform = start_platform()
    deploy_tenant(platform, tmp_path, "insider")
    deploy_tenant(platform, tmp_path, "victim")
    url = platform.url
    calls = [("GET", f"{url}/v1/keys"), ("GET", f"{url}/v1/functions/victim/logs"),
             ("DELETE", f"{url}/v1/functions/victim"), ("POST", f"{url}/v1/keys"), ("GET", f"{url}/v1/functions")]
    answers = attempt(platform, "insider", "call", calls=calls)["calls"]
    for (method, path), answer in zip(calls, answers, strict=True):
        assert answer["status"] == 403, (method, path, answer)
        assert "no API key yet" in answer["body"] and "instance" in answer["body"], answer
    refused = attempt(platform, "insider", "grpc_metadata", address=platform.grpc_address, model="victim")
    assert refused["status"] == "StatusCode.PERMISSION_DENIED" and "no API key yet" in refused["message"], refused
    assert platform.function("victim")["status"] == "ready"
    assert platform.http.get("/v1/keys").status_code == 200      # the machine's own users still may
    assert platform.http.get("/healthz").status_code == 200


@pytest.mark.parametrize(("query", "status"), [("match=-", 200), ("match=a-b", 200), ("match=%25", 422)])
def test_the_dashboard_filter_takes_what_its_pattern_allows(start_platform, query: str, status: int) -> None:
    platform = start_platform()
    reply = platform.http.get(f"/v1/dashboard?{query}")
    assert reply.status_code == status, reply.text


def _resident_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def test_a_stream_nobody_reads_stops_being_made_and_ends(start_platform, tmp_path: Path) -> None:
    import socket
    from urllib.parse import urlsplit

    platform = start_platform(env={"DILU_STREAM_STALL_S": "3"})
    source = shutil.copytree(FIXTURE_FUNCTIONS / "flood_stream", tmp_path / "flood")
    assert platform.cli("deploy", str(source / "model.yaml")).returncode == 0
    platform.wait_ready("flood")

    def first_chunk() -> dict:
        with platform.http.stream("POST", "/v1/functions/flood/invoke", json={},
                                  headers={"accept": "text/event-stream"}) as reply:
            assert reply.status_code == 200
            return json.loads(next(reply.iter_lines()).removeprefix("data: "))

    pid = first_chunk()["pid"]
    before = _resident_mib(pid)
    address = urlsplit(platform.url)
    request = (f"POST /v1/functions/flood/invoke HTTP/1.1\r\nHost: {address.netloc}\r\n"
               "Accept: text/event-stream\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}").encode()
    readers = []
    for _ in range(2):                 # they ask, then never read
        reader = socket.create_connection((address.hostname, address.port))
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader.sendall(request)
        readers.append(reader)
    try:
        eventually(lambda: platform.cli("logs", "flood").stdout.count("stream ended") >= 2, timeout=120,
                   what="the instance to end both unread streams")
        grown = _resident_mib(pid) - before
        assert grown < 48, f"the instance holds {grown:.0f} MiB more for two unread streams"
        assert first_chunk()["n"] == 1, "it goes on serving a caller that reads"
    finally:
        for reader in readers:
            reader.close()


@switching_users
def test_a_function_reaches_only_its_own_registration_with_the_token_manager(start_platform, tmp_path: Path) -> None:
    """On a simulated GPU, from the intruder's own code: claiming the victim's id on its own
    socket, the victim's socket and the manager's are all refused; registering again and again
    stops at the bound per instance, so a function deployed later still registers."""
    platform, latency, victim = _intruder_beside(start_platform, tmp_path, "victim")
    tried = attempt(platform, "intruder", "tokens", victim=victim, flood=MAX_PROCESSES + 8)
    assert tried["as_victim"].startswith("ERR") and f"not {victim}'s" in tried["as_victim"], tried
    assert tried["victim_socket"].startswith("PermissionError"), tried
    assert tried["manager_socket"].startswith("PermissionError"), tried
    # Bounded (its own server may hold one of the entries already), and told why past the bound.
    assert MAX_PROCESSES - 1 <= tried["flood_ok"] <= MAX_PROCESSES, tried
    assert "processes registered already" in tried["flood_refused"][0], tried
    # The intruder still holds its registrations: a function started now gets a slot of its own.
    _deploy_gpu_kernels(platform, tmp_path, latency, "late")


def _intruder_beside(start_platform, tmp_path: Path, victim_name: str) -> tuple:
    """A platform with a simulated GPU, the synthetic latency function as ``victim_name`` (a
    small slice, so more fit beside it) and the tenant fixture as ``intruder`` on the same GPU:
    (platform, the latency spec, the victim's instance id)."""
    build_shim()
    platform = start_platform(env={"DILU_FAKE_GPUS": "1", "DILU_GPUS": "none"})
    latency = (ROOT / "examples" / "synthetic-gpu" / "latency.yaml").read_text().replace(
        "sm_request: 0.5, sm_limit: 0.75", "sm_request: 0.3, sm_limit: 0.4")
    victim = _deploy_gpu_kernels(platform, tmp_path, latency, victim_name)
    deploy_tenant(platform, tmp_path, "intruder", gpu=True)
    return platform, latency, victim


def _deploy_gpu_kernels(platform, tmp_path: Path, spec: str, name: str) -> str:
    """Deploys the synthetic latency function as ``name``, invokes it and waits until its kernels
    are counted by the token manager (it registered); returns its instance's id."""
    folder = shutil.copytree(ROOT / "examples" / "synthetic-gpu", tmp_path / name)
    (folder / "model.yaml").write_text(spec.replace("name: synthetic-latency", f"name: {name}"))
    deployed = platform.cli("deploy", str(folder / "model.yaml"))
    assert deployed.returncode == 0, deployed.stderr
    assert platform.invoke(name, {}).status_code == 200

    def registered() -> str | None:
        (row,) = platform.instances(name)
        return row["id"] if (row.get("telemetry") or {}).get("launches", 0) > 0 else None

    return eventually(registered, timeout=30, what=f"{name}'s launches to be counted; logs: "
                      f"{platform.cli('logs', name).stdout}")


@switching_users
def test_a_function_cannot_write_the_token_memory_of_its_neighbours(start_platform, tmp_path: Path) -> None:
    """From the intruder's own code, registered as itself on a simulated GPU: the board and its
    grant refuse writes however it tries (a writable mapping, a write, reopening through /proc),
    its usage cannot be shrunk under the manager, the latency neighbour's signal comes read-only
    and stays so; writing an absurd consumption into its own usage leaves the neighbour serving."""
    platform, _, victim = _intruder_beside(start_platform, tmp_path, "neighbour")
    tried = attempt(platform, "intruder", "region")
    assert tried["reply"] == "OK" and tried["fds"] == 4, tried
    for name in ("board", "grant"):
        assert tried[f"{name}_map_writable"] == "PermissionError", tried
        assert tried[f"{name}_write"] == "PermissionError", tried
        assert tried[f"{name}_reopened_write"] == "PermissionError", tried
    assert tried["usage_shrink"] == "PermissionError", tried
    assert tried["latency_slots"] and tried["signal_answer"] == "SIG", tried
    assert tried["signal_readable"] == "done" and tried["signal_map_writable"] == "PermissionError", tried
    assert tried["signal_reopened_write"] == "PermissionError", tried

    def counted() -> dict:
        (row,) = platform.instances("neighbour")
        return row["telemetry"]

    before = counted()
    assert platform.invoke("neighbour", {}).status_code == 200
    after = eventually(lambda: (view := counted())["launches"] > before["launches"] and view, timeout=30,
                       what="the neighbour's launches to be counted")
    assert after["tokens"] < 2 ** 40, f"{victim}'s consumption was written from outside: {after}"
    # Its own burst may leave it in debt for a moment ("waiting" until its grant catches up with
    # what it just launched); a consumption written from outside would keep it there for good.
    eventually(lambda: counted()["state"] != "waiting", timeout=30,
               what=f"{victim} to be out of its own burst's debt (a poisoned usage never is)")


@switching_users
def test_a_worker_without_a_cluster_key_takes_no_orders_from_its_functions(tmp_path: Path, postgres_url: str,
                                                                           redis_prefix: str) -> None:
    """Separate roles on loopback, no DILU_CLUSTER_KEY: the worker's API answers the machine's
    users, and refuses a function's own code trying to list, stop or start instances on it."""
    import subprocess

    import httpx

    from tests.conftest import REDIS_URL
    from tests.platform import dilu_executable, free_port, start_role

    env = {"DILU_DATABASE_URL": postgres_url, "DILU_REDIS_URL": REDIS_URL, "DILU_REDIS_PREFIX": redis_prefix,
           "DILU_HOME": str(tmp_path / "home"), "DILU_PROFILING": "false"}
    migrated = subprocess.run([dilu_executable(), "migrate"], env={**os.environ, **env}, capture_output=True,
                              text=True, timeout=120)
    assert migrated.returncode == 0, migrated.stderr
    worker_port = free_port()
    roles = [start_role(["worker"], {**env, "DILU_PORT": str(worker_port)}, tmp_path / "worker.log")]
    try:
        roles.append(start_role(["controller"], env, tmp_path / "controller.log", wait_for_url=False))
        gateway = start_role(["gateway"], {**env, "DILU_PORT": "0"}, tmp_path / "gateway.log")
        roles.append(gateway)
        source = shutil.copytree(FIXTURE_FUNCTIONS / "tenant", tmp_path / "tenant")
        deployed = subprocess.run([dilu_executable(), "deploy", str(source / "model.yaml")],
                                  env={**os.environ, **env, "DILU_URL": gateway.url}, capture_output=True, text=True,
                                  timeout=180)
        assert deployed.returncode == 0, deployed.stderr
        worker = f"http://127.0.0.1:{worker_port}"
        with httpx.Client(base_url=gateway.url, timeout=60) as http:
            (instance,) = http.get("/v1/functions/tenant/instances").json()
            calls = [("GET", f"{worker}/v1/instances"), ("DELETE", f"{worker}/v1/instances/{instance['id']}"),
                     ("POST", f"{worker}/v1/instances")]
            reply = http.post("/v1/functions/tenant/invoke", json={"attempt": "call", "calls": calls})
            assert reply.status_code == 200, reply.text
            for answer in reply.json()["calls"]:
                assert answer["status"] == 403 and "no cluster key" in answer["body"], answer
            assert http.post("/v1/functions/tenant/invoke", json={"attempt": "whoami"}).status_code == 200
        assert httpx.get(f"{worker}/v1/instances", timeout=10).status_code == 200   # the machine's users may
    finally:
        for role in roles:
            role.stop()
