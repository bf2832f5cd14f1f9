"""Gateway, controller and worker as separate processes sharing PostgreSQL and Redis."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

from tests.conftest import FIXTURE_FUNCTIONS, REDIS_URL
from tests.platform import dilu_executable, start_role
from tests.waiting import eventually


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_roles_in_separate_processes(tmp_path: Path, postgres_url: str, redis_prefix: str) -> None:
    import os

    import httpx

    env = {"DILU_DATABASE_URL": postgres_url, "DILU_REDIS_URL": REDIS_URL, "DILU_REDIS_PREFIX": redis_prefix,
           "DILU_HOME": str(tmp_path / "home")}
    migrated = subprocess.run([dilu_executable(), "migrate"], env={**os.environ, **env}, capture_output=True,
                              text=True, timeout=120)
    assert migrated.returncode == 0, migrated.stderr
    roles = []
    try:
        worker_port = _free_port()
        roles.append(start_role(["worker"], {**env, "DILU_PORT": str(worker_port)}, tmp_path / "worker.log"))
        roles.append(start_role(["controller"], env, tmp_path / "controller.log", wait_for_url=False))
        gateway = start_role(["gateway"], {**env, "DILU_PORT": "0"}, tmp_path / "gateway.log")
        roles.append(gateway)

        source = shutil.copytree(FIXTURE_FUNCTIONS / "ok", tmp_path / "ok")
        cli_env = {**os.environ, **env, "DILU_URL": gateway.url}
        deployed = subprocess.run([dilu_executable(), "deploy", str(source / "model.yaml")], env=cli_env,
                                  capture_output=True, text=True, timeout=180)
        assert deployed.returncode == 0, (deployed.stderr, roles[1].log())
        with httpx.Client(base_url=gateway.url, timeout=60) as http:
            reply = http.post("/v1/functions/ok/invoke", json={"across": "processes"})
            assert reply.status_code == 200 and reply.json()["input"] == {"across": "processes"}
            status = http.get("/v1/status").json()
            assert status["state_store"] == "redis" and status["database"].startswith("postgresql")
            assert status["workers"][0]["url"] == f"http://127.0.0.1:{worker_port}"
            logs = http.get("/v1/functions/ok/logs").json()
            assert "ready" in logs["instances"][0]["log"]

            # The worker dies: the controller marks it lost and its instance with it.
            roles[0].process.kill()
            roles[0].process.wait()
            eventually(lambda: http.get("/v1/status").json()["workers"][0]["state"] == "lost", timeout=60,
                       what="the worker to be marked lost")
            instances = http.get("/v1/functions/ok/instances", params={"all": True}).json()
            assert [i["state"] for i in instances] == ["lost"]
    finally:
        for role in roles:
            role.stop()
