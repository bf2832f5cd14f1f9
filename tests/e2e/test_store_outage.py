"""Redis restarted under load: no request goes unanswered, the routing table comes back in Redis,
events flow again, no request is lost from the counters, and every role still stops on SIGINT."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path

import httpx
import redis

from tests.conftest import FIXTURE_FUNCTIONS
from tests.platform import dilu_executable, free_port, start_role
from tests.waiting import eventually


class PrivateRedis:
    """A redis-server child process of this test (restartable on the same port)."""

    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.folder = folder
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.folder)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port)
        eventually(lambda: client.ping(), timeout=20, what="redis-server to answer")
        client.close()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)


def test_redis_restart_under_load(tmp_path: Path, postgres_url: str) -> None:
    store = PrivateRedis(tmp_path)
    store.start()
    env = {"DILU_DATABASE_URL": postgres_url, "DILU_REDIS_URL": f"redis://127.0.0.1:{store.port}/0",
           "DILU_HOME": str(tmp_path / "home")}
    assert subprocess.run([dilu_executable(), "migrate"], env={**os.environ, **env}, capture_output=True,
                          timeout=120).returncode == 0
    roles = []
    try:
        roles.append(start_role(["worker"], {**env, "DILU_PORT": "0", "DILU_GPUS": "none"}, tmp_path / "worker.log"))
        controller = start_role(["controller"], env, tmp_path / "controller.log", wait_for_url=False)
        roles.append(controller)
        gateway = start_role(["gateway"], {**env, "DILU_PORT": "0"}, tmp_path / "gateway.log")
        roles.append(gateway)
        folder = shutil.copytree(FIXTURE_FUNCTIONS / "ok", tmp_path / "ok")
        cli_env = {**os.environ, **env, "DILU_URL": gateway.url}
        deploy = [dilu_executable(), "deploy", str(folder / "model.yaml")]
        assert subprocess.run(deploy, env=cli_env, capture_output=True, timeout=180).returncode == 0

        statuses: list[int] = []
        stop = threading.Event()

        def load() -> None:
            with httpx.Client(base_url=gateway.url, timeout=30) as http:
                while not stop.is_set() and len(statuses) < 3000:
                    try:
                        statuses.append(http.post("/v1/functions/ok/invoke", json={"n": 1}).status_code)
                    except httpx.HTTPError:
                        statuses.append(-1)      # never answered

        sender = threading.Thread(target=load)
        sender.start()
        eventually(lambda: len(statuses) >= 100, timeout=60, what="load before the fault")
        store.stop()
        at_fault = len(statuses)
        eventually(lambda: len(statuses) >= at_fault + 50, timeout=60, what="requests while Redis is down")
        store.start()
        client = redis.Redis(port=store.port, decode_responses=True)
        eventually(lambda: client.hget("dilu:routes", "ok"), timeout=30, what="the routes to be republished")
        after = len(statuses)
        eventually(lambda: len(statuses) >= after + 100, timeout=60, what="requests after the restart")
        stop.set()
        sender.join(60)
        assert statuses.count(-1) == 0 and set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}

        # Events flow again: a redeploy (a new version) becomes ready through pub/sub and polling.
        (folder / "model.yaml").write_text((folder / "model.yaml").read_text().replace("plain", "fresh"))
        assert subprocess.run(deploy, env=cli_env, capture_output=True, timeout=180).returncode == 0
        with httpx.Client(base_url=gateway.url, timeout=30) as http:
            eventually(lambda: http.get("/v1/functions/ok").json()["requests_total"] >= len(statuses),
                       timeout=30, what="every request to be counted")
            assert http.get("/v1/functions/ok").json()["version"] == 2
        client.close()
    finally:
        codes = [role.stop(timeout=20) for role in reversed(roles)]
        store.stop()
    assert all(code is not None and code >= 0 for code in codes), codes   # none needed SIGKILL
