"""Gateway, controller and worker as separate processes sharing PostgreSQL and Redis."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.conftest import FIXTURE_FUNCTIONS, REDIS_URL
from tests.platform import dilu_executable, free_port, start_role
from tests.waiting import eventually
from worker.cgroups import CpuLimiter


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
        worker_port = free_port()
        roles.append(start_role(["worker"], {**env, "DILU_PORT": str(worker_port), "DILU_WORKER_NAME": "first"},
                                tmp_path / "worker.log"))
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
            assert [(w["id"], w["url"]) for w in status["workers"]] == [("first-cpu", f"http://127.0.0.1:{worker_port}")]
            logs = http.get("/v1/functions/ok/logs").json()
            assert "ready" in logs["instances"][0]["log"]

            # A second worker joins; then the first dies. Its instance is marked lost and replaced
            # on the second worker, and requests keep working.
            second_port = free_port()
            roles.append(start_role(["worker"], {**env, "DILU_PORT": str(second_port), "DILU_WORKER_NAME": "second"},
                                    tmp_path / "worker2.log"))
            eventually(lambda: len(http.get("/v1/status").json()["workers"]) == 2, timeout=60,
                       what="the second worker to register")
            roles[0].process.kill()
            roles[0].process.wait()

            def worker_states() -> dict[str, str]:
                return {w["id"]: w["state"] for w in http.get("/v1/status").json()["workers"]}

            eventually(lambda: worker_states() == {"first-cpu": "lost", "second-cpu": "alive"}, timeout=60,
                       what="the first worker to be marked lost")
            reply = http.post("/v1/functions/ok/invoke", json={"after": "failover"})
            assert reply.status_code == 200 and reply.json()["input"] == {"after": "failover"}
            instances = http.get("/v1/functions/ok/instances", params={"all": True}).json()
            serving = {(i["worker_id"], i["state"]) for i in instances if i["role"] == "serve"}
            assert serving == {("first-cpu", "lost"), ("second-cpu", "ready")}
            # Profiling ran across processes too (slices resized through the worker's HTTP API).
            profile = http.get("/v1/functions/ok").json()["profile"]
            if CpuLimiter().available:
                assert profile["status"] == "done" and profile["trials"] > 0, profile
            else:
                assert profile["status"] == "failed" and "cannot resize" in profile["error"], profile
    finally:
        for role in roles:
            role.stop()
