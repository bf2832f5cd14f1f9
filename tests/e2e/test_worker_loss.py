"""A worker's death loses no request while a healthy worker elsewhere serves the function: a
request whose instance fails is retried on another worker, not on the dead worker's other
instance (separate roles sharing PostgreSQL and Redis, two workers)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.conftest import FIXTURE_FUNCTIONS, REDIS_URL
from tests.platform import dilu_executable, free_port, start_role
from tests.waiting import eventually
from worker.cgroups import InstanceGroups

REQUESTS, CLIENTS = 240, 6


def _migrated(tmp_path: Path, postgres_url: str, redis_prefix: str, **extra: str) -> dict[str, str]:
    """The roles' shared settings (PostgreSQL, Redis, one home), its database migrated."""
    env = {"DILU_DATABASE_URL": postgres_url, "DILU_REDIS_URL": REDIS_URL, "DILU_REDIS_PREFIX": redis_prefix,
           "DILU_HOME": str(tmp_path / "home"), "DILU_PROFILING": "false", **extra}
    migrated = subprocess.run([dilu_executable(), "migrate"], env={**os.environ, **env}, capture_output=True,
                              text=True, timeout=120)
    assert migrated.returncode == 0, migrated.stderr
    return env


def _deploy(source: Path, env: dict[str, str], url: str) -> None:
    deployed = subprocess.run([dilu_executable(), "deploy", str(source / "model.yaml")], capture_output=True,
                              env={**os.environ, **env, "DILU_URL": url}, text=True, timeout=180)
    assert deployed.returncode == 0, deployed.stderr


def _tree(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    return found


def test_a_worker_killed_with_two_instances_loses_no_request(tmp_path: Path, postgres_url: str,
                                                             redis_prefix: str) -> None:
    env = _migrated(tmp_path, postgres_url, redis_prefix)
    roles = []
    http = None
    try:
        workers = {}
        for name in ("first", "second"):
            workers[f"{name}-cpu"] = start_role(["worker"], {**env, "DILU_PORT": str(free_port()),
                                                             "DILU_WORKER_NAME": name}, tmp_path / f"{name}.log")
            roles.append(workers[f"{name}-cpu"])
        roles.append(start_role(["controller"], env, tmp_path / "controller.log", wait_for_url=False))
        gateway = start_role(["gateway"], {**env, "DILU_PORT": "0"}, tmp_path / "gateway.log")
        roles.append(gateway)
        http = httpx.Client(base_url=gateway.url, timeout=60)
        registered = eventually(lambda: len(status := http.get("/v1/status").json()["workers"]) == 2 and status,
                                timeout=60, what="both workers to register")
        # Memory for two instances per worker, not three: three instances are placed 2 + 1.
        memory_mib = min(w["memory_bytes"] for w in registered) * 2 // 5 // 2**20
        source = shutil.copytree(FIXTURE_FUNCTIONS / "step", tmp_path / "three")
        text = (source / "model.yaml").read_text().replace("name: step", "name: three")
        text = text.replace("memory: 128Mi", f"memory: {memory_mib}Mi")
        text = text.replace("min_instances: 0, max_instances: 1", "min_instances: 3, max_instances: 3")
        (source / "model.yaml").write_text(text + "model: {op: add, sleep_s: 0.05}\n")
        _deploy(source, env, gateway.url)

        def ready() -> list[dict]:
            return [i for i in http.get("/v1/functions/three/instances").json() if i["state"] == "ready"]

        placed = eventually(lambda: len(found := ready()) == 3 and found, timeout=120, what="three instances")
        doubled = max(workers, key=lambda w: sum(i["worker_id"] == w for i in placed))
        assert sum(i["worker_id"] == doubled for i in placed) == 2, placed

        sent = threading.Semaphore(0)

        def call(number: int) -> int:
            sent.release()
            return http.post("/v1/functions/three/invoke", json={"x": number}).status_code

        with ThreadPoolExecutor(CLIENTS) as pool:
            answers = [pool.submit(call, number) for number in range(REQUESTS)]
            for _ in range(REQUESTS // 3):
                sent.acquire()
            for pid in _tree(workers[doubled].process.pid):     # the host is gone: the worker and its instances
                os.kill(pid, signal.SIGKILL)
            codes = [answer.result(timeout=120) for answer in answers]
        lost = {code: codes.count(code) for code in set(codes) if code != 200}
        assert not lost, f"{sum(lost.values())} of {REQUESTS} requests failed: {lost}"
    finally:
        if http is not None:
            http.close()
        for role in roles:
            role.stop()


def test_a_stopped_worker_whose_instance_answers_keeps_its_routes(tmp_path: Path, postgres_url: str,
                                                                   redis_prefix: str) -> None:
    """The worker process stops (SIGSTOP): no heartbeat, no answer from its API. Its instance,
    a process of its own, still serves, so the worker is not judged lost at its TTL and the
    instance keeps taking requests (with one worker, losing it would leave nothing to serve)."""
    env = _migrated(tmp_path, postgres_url, redis_prefix)
    worker = start_role(["worker"], {**env, "DILU_PORT": str(free_port()), "DILU_WORKER_NAME": "only"},
                        tmp_path / "worker.log")
    controller = start_role(["controller"], env, tmp_path / "controller.log", wait_for_url=False)
    gateway = start_role(["gateway"], {**env, "DILU_PORT": "0"}, tmp_path / "gateway.log")
    roles = [worker, controller, gateway]
    try:
        source = shutil.copytree(FIXTURE_FUNCTIONS / "ok", tmp_path / "ok")
        _deploy(source, env, gateway.url)
        with httpx.Client(base_url=gateway.url, timeout=60) as http:
            worker.process.send_signal(signal.SIGSTOP)
            try:
                eventually(lambda: "or its instances answer: kept" in controller.log(), timeout=60,
                           what="the controller to weigh the silent worker")
                for number in range(20):
                    assert http.post("/v1/functions/ok/invoke", json={"n": number}).status_code == 200
                states = {i["state"] for i in http.get("/v1/functions/ok/instances").json()}
                assert states == {"ready"}
                assert {w["state"] for w in http.get("/v1/status").json()["workers"]} == {"alive"}
            finally:
                worker.process.send_signal(signal.SIGCONT)
    finally:
        for role in roles:
            role.stop()


def _left_on_host(instance_id: str) -> list[Path]:
    """The instance's cgroups and sandbox folder, where they exist."""
    groups = [path for hierarchy in Path("/sys/fs/cgroup").iterdir() if hierarchy.is_dir()
              for path in hierarchy.glob(f"**/dilu/{instance_id}")]
    return groups + [path for parent in (Path("/run"), Path("/tmp")) for path in parent.glob(f"dilu-instances-*/"
                                                                                              f"{instance_id}")]


@pytest.mark.skipif(not InstanceGroups().available, reason="no writable cgroups: instances make none")
def test_a_worker_started_after_a_killed_one_removes_what_its_instances_left(
        tmp_path: Path, postgres_url: str, redis_prefix: str) -> None:
    env = _migrated(tmp_path, postgres_url, redis_prefix)
    worker_env = {**env, "DILU_PORT": str(free_port()), "DILU_WORKER_NAME": "again"}
    roles = [start_role(["worker"], worker_env, tmp_path / "worker.log"),
             start_role(["controller"], env, tmp_path / "controller.log", wait_for_url=False)]
    gateway = start_role(["gateway"], {**env, "DILU_PORT": "0"}, tmp_path / "gateway.log")
    roles.append(gateway)
    try:
        source = shutil.copytree(FIXTURE_FUNCTIONS / "ok", tmp_path / "ok")
        _deploy(source, env, gateway.url)
        (instance,) = httpx.get(f"{gateway.url}/v1/functions/ok/instances", timeout=30).json()
        assert _left_on_host(instance["id"]), "the instance has cgroups and a sandbox folder"
        roles[0].process.kill()          # no cleanup runs; its instance ends with it (its death signal)
        roles[0].process.wait()
        roles[0].stop()                  # (its output files)
        eventually(lambda: not InstanceGroups().pids(instance["id"]), timeout=30, what="the instance to end")
        assert _left_on_host(instance["id"]), "a killed worker leaves its instance's cgroups and folder"
        roles[0] = start_role(["worker"], worker_env, tmp_path / "worker-again.log")
        assert not _left_on_host(instance["id"])
    finally:
        for role in roles:
            role.stop()


def test_a_stopping_worker_finishes_its_streams_and_hands_over_the_waiting_ones(
        tmp_path: Path, postgres_url: str, redis_prefix: str) -> None:
    """SIGINT to a worker whose one-slot instance streams (4 s) with a second stream waiting for
    the slot: the running stream ends with its terminator, well past the 1 s stop grace, and the
    waiting one is handed over and served whole by an instance on the other worker."""
    env = _migrated(tmp_path, postgres_url, redis_prefix, DILU_STOP_GRACE_S="1")
    first = start_role(["worker"], {**env, "DILU_PORT": str(free_port()), "DILU_WORKER_NAME": "first"},
                       tmp_path / "first.log")
    roles = [first, start_role(["controller"], env, tmp_path / "controller.log", wait_for_url=False)]
    gateway = start_role(["gateway"], {**env, "DILU_PORT": "0"}, tmp_path / "gateway.log")
    roles.append(gateway)
    try:
        source = shutil.copytree(FIXTURE_FUNCTIONS / "counter_stream", tmp_path / "counter")
        text = (source / "model.yaml").read_text().replace("max_instances: 1", "max_instances: 2")
        (source / "model.yaml").write_text(text)
        _deploy(source, env, gateway.url)
        (instance,) = httpx.get(f"{gateway.url}/v1/functions/counter/instances", timeout=30).json()
        roles.append(start_role(["worker"], {**env, "DILU_PORT": str(free_port()), "DILU_WORKER_NAME": "second"},
                                tmp_path / "second.log"))

        def stream(to: int) -> list[dict]:
            with httpx.stream("POST", f"{gateway.url}/v1/functions/counter/invoke", json={"to": to, "step_s": 0.1},
                              headers={"accept": "application/x-ndjson"}, timeout=120) as reply:
                assert reply.status_code == 200, reply.read()
                return [json.loads(line) for line in reply.iter_lines() if line]

        def waiting() -> bool:
            text = httpx.get(instance["endpoint"] + "/metrics", timeout=10).text
            return "dilu_instance_queued_requests 1.0" in text

        with ThreadPoolExecutor(2) as pool:
            running = pool.submit(stream, 40)
            eventually(lambda: httpx.get(f"{gateway.url}/v1/functions/counter", timeout=10).json()[
                "in_flight_requests"] == 1, timeout=30, what="the first stream at the instance")
            waits = pool.submit(stream, 3)
            eventually(waiting, timeout=30, what="the second stream waiting for the slot")
            first.process.send_signal(signal.SIGINT)
            assert running.result(timeout=120)[-1] == {"done": True, "chunks": 40}
            assert waits.result(timeout=120) == [{"n": 1}, {"n": 2}, {"n": 3}, {"done": True, "chunks": 3}]
        served = httpx.get(f"{gateway.url}/v1/functions/counter/instances", timeout=30).json()
        assert [i["worker_id"] for i in served] == ["second-cpu"], served
    finally:
        for role in roles:
            role.stop()
