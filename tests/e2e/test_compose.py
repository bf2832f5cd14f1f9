"""`docker-compose up` of the whole docker-compose.yml on this machine (CPU profile, stand-in
PostgreSQL and Redis images, every port moved off the machine's own services): every service
comes up healthy, a function deployed through the gateway runs in a container, and
`docker-compose down` leaves nothing behind.

Needs a Docker engine, docker-compose and the images `scripts/ci-images` builds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import httpx
import pytest

from tests.conftest import FIXTURE_FUNCTIONS, ROOT
from tests.platform import dilu_executable, free_port
from tests.waiting import eventually

IMAGES = ("dilu/platform:latest", "dilu/runtime-cpu:latest", "dilu-ci/postgres:latest", "dilu-ci/redis:latest")


def _missing() -> str | None:
    if not (shutil.which("docker") and shutil.which("docker-compose")):
        return "docker or docker-compose is not installed"
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        return "no Docker engine answers"
    absent = [i for i in IMAGES if subprocess.run(["docker", "image", "inspect", i], capture_output=True).returncode]
    return f"images not built (scripts/ci-images): {', '.join(absent)}" if absent else None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))



def test_compose_up_deploy_invoke_down(tmp_path: Path) -> None:
    project = f"dilu-test-{uuid.uuid4().hex[:8]}"
    gateway_port = free_port()
    env = {**os.environ, "COMPOSE_PROFILES": "cpu",
           "DILU_POSTGRES_IMAGE": "dilu-ci/postgres", "DILU_REDIS_IMAGE": "dilu-ci/redis",
           "DILU_POSTGRES_PORT": str(free_port()), "DILU_REDIS_PORT": str(free_port()),
           "DILU_GATEWAY_PORT": str(gateway_port), "DILU_WORKER_PORT": str(free_port()),
           "DILU_WORKER_HOME": str(tmp_path / "worker-home")}
    compose = ["docker-compose", "-p", project, "-f", str(ROOT / "docker-compose.yml")]

    def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([*compose, *args], env=env, capture_output=True, text=True, timeout=timeout)

    def project_containers() -> list[str]:
        return subprocess.run(["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={project}"],
                              capture_output=True, text=True).stdout.split()

    try:
        up = run("up", "-d")
        assert up.returncode == 0, up.stderr
        url = f"http://127.0.0.1:{gateway_port}"

        def healthy() -> bool:
            states = run("ps").stdout
            return "Up (healthy)" in states and states.count("(healthy)") == 3 and "Exit 1" not in states

        eventually(healthy, timeout=120, interval=0.5, what="postgres, redis and the gateway to be healthy")
        with httpx.Client(base_url=url, timeout=30) as http:
            eventually(lambda: http.get("/v1/status").json()["workers"], timeout=60, what="the worker to register")
            status = http.get("/v1/status").json()
            assert status["database"].startswith("postgresql") and status["state_store"] == "redis"

            folder = shutil.copytree(FIXTURE_FUNCTIONS / "whoami", tmp_path / "whoami")
            deployed = subprocess.run([dilu_executable(), "deploy", str(folder / "model.yaml")],
                                      env={**os.environ, "DILU_URL": url}, capture_output=True, text=True, timeout=180)
            assert deployed.returncode == 0, (deployed.stderr, run("logs", "--tail", "50").stdout[-3000:])
            reply = http.post("/v1/functions/whoami/invoke", json={"via": "compose"})
            assert reply.status_code == 200 and reply.json()["echo"] == {"via": "compose"}
            assert reply.json()["uid"] != 0
        migrate_state = subprocess.run(["docker", "ps", "-a", "--filter", f"label=com.docker.compose.project={project}",
                                        "--filter", "label=com.docker.compose.service=migrate",
                                        "--format", "{{.Status}}"], capture_output=True, text=True).stdout
        assert migrate_state.startswith("Exited (0)"), migrate_state

        down = run("down", "-v")
        assert down.returncode == 0, down.stderr
        assert project_containers() == []
        leftovers = subprocess.run(["docker", "ps", "-aq", "--filter", "label=dev.dilu.function=whoami"],
                                   capture_output=True, text=True).stdout.split()
        assert leftovers == []          # the worker removed its function containers on its way out
    finally:
        run("down", "-v")
        for leftover in subprocess.run(["docker", "ps", "-aq", "--filter", "label=dev.dilu.function=whoami"],
                                       capture_output=True, text=True).stdout.split():
            subprocess.run(["docker", "rm", "-f", leftover], capture_output=True)
