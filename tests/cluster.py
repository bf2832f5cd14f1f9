"""Platforms of separate roles on PostgreSQL and Redis (worker, gateways, controllers as real
processes) and a load of concurrent clients, for the failover tests."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path

import httpx
from sqlalchemy import create_engine, select

from dilu.db import lease
from dilu.db.engine import make_session_factory
from dilu.db.models import InstanceRow
from tests.conftest import FIXTURE_FUNCTIONS, REDIS_URL
from tests.platform import Role, dilu_executable, free_port, start_role

CLIENTS = 16


class Load:
    """``CLIENTS`` threads invoking a function back to back until stopped; every answer kept."""

    def __init__(self, url: str, function: str) -> None:
        self.answers: list[int | str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(url, function, i), daemon=True)
                         for i in range(CLIENTS)]
        for thread in self._threads:
            thread.start()

    def _client(self, url: str, function: str, index: int) -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            n = 0
            while not self._stop.is_set():
                n += 1
                try:
                    reply = http.post(f"/v1/functions/{function}/invoke", json={"client": index, "n": n})
                    ok = reply.status_code == 200 and reply.json()["input"] == {"client": index, "n": n}
                    self.answers.append(200 if ok else f"{reply.status_code} {reply.text[:200]}")
                except httpx.HTTPError as exc:
                    self.answers.append(f"{type(exc).__name__}: {exc}")

    def stop(self) -> list[int | str]:
        self._stop.set()
        for thread in self._threads:
            thread.join(90)
        return self.answers


class Cluster:
    def __init__(self, tmp_path: Path, postgres_url: str, redis_prefix: str) -> None:
        self.tmp, self.database_url = tmp_path, postgres_url
        self.env = {"DILU_DATABASE_URL": postgres_url, "DILU_REDIS_URL": REDIS_URL, "DILU_REDIS_PREFIX": redis_prefix,
                    "DILU_HOME": str(tmp_path / "home"), "DILU_PROFILING": "false"}
        migrated = subprocess.run([dilu_executable(), "migrate"], env={**os.environ, **self.env},
                                  capture_output=True, text=True, timeout=120)
        assert migrated.returncode == 0, migrated.stderr
        self.engine = create_engine(postgres_url)
        self.sessions = make_session_factory(self.engine)
        self.roles: list[Role] = []
        self.worker_url = f"http://127.0.0.1:{free_port()}"
        self._start(["worker"], "worker", {"DILU_PORT": self.worker_url.rsplit(":", 1)[1], "DILU_WORKER_NAME": "w"})
        self.gateway = self.add_gateway("gateway")
        self.http = httpx.Client(base_url=self.gateway.url, timeout=60)

    def add_gateway(self, name: str) -> Role:
        return self._start(["gateway"], name, {"DILU_PORT": "0"})

    def deploy(self, source: Path) -> None:
        """Deploys the model.yaml in ``source`` through the CLI and waits until it is ready."""
        deployed = subprocess.run([dilu_executable(), "deploy", str(source / "model.yaml")], capture_output=True,
                                  text=True, timeout=180,
                                  env={**os.environ, **self.env, "DILU_URL": self.gateway.url})
        assert deployed.returncode == 0, deployed.stderr

    def _start(self, args: list[str], name: str, env: dict[str, str], wait_for_url: bool = True) -> Role:
        role = start_role(args, {**self.env, **env}, self.tmp / f"{name}.log", wait_for_url=wait_for_url)
        self.roles.append(role)
        return role

    def controller(self, name: str) -> Role:
        return self._start(["controller"], f"controller-{name}", {"DILU_CONTROLLER_ID": name}, wait_for_url=False)

    def lease(self) -> tuple[str | None, int | None, float, float]:
        """The holder (None once expired or released), term, acquired_at and the database's clock."""
        with self.sessions() as session:
            held, now = lease.read(session=session)
        leading = held is not None and held.holder and held.expires_at > now
        return (held.holder if leading else None, held.term if held else None,
                held.acquired_at if held else 0.0, now)

    def database_now(self) -> float:
        with self.sessions() as session:
            return lease.database_now(session=session)

    def deploy_in_background(self, name: str, release: Path) -> subprocess.Popen:
        source = shutil.copytree(FIXTURE_FUNCTIONS / "slow_load", self.tmp / name)
        (source / "model.yaml").write_text(
            f"name: {name}\nhandler: handler:SlowLoad\nresources:\n  memory: 64Mi\n  gpu: false\n"
            f"  sm_request: 0.5\n  sm_limit: 0.5\nscaling:\n  min_instances: 1\n  max_instances: 1\n"
            f"model:\n  release_file: {release}\n")
        return subprocess.Popen([dilu_executable(), "deploy", str(source / "model.yaml")],
                                env={**os.environ, **self.env, "DILU_URL": self.gateway.url},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def worker_runs(self, function: str) -> list[str]:
        """The ids of every instance of ``function`` the worker was given (ended ones too)."""
        known = httpx.get(self.worker_url + "/v1/instances", timeout=10).json()
        return [i["instance_id"] for i in known if i["function"] == function]

    def rows(self, function: str) -> list[InstanceRow]:
        with self.sessions() as session:
            return list(session.scalars(select(InstanceRow).where(InstanceRow.function == function)))

    def close(self) -> None:
        self.http.close()
        for role in self.roles:
            if role.process.poll() is None:
                os.kill(role.process.pid, signal.SIGCONT)
            role.stop()
        self.engine.dispose()
