"""Several hosts, simulated on loopback addresses: a controller, a gateway and two workers as
separate processes, each worker on its own address with its API on a free port (port 0) and its
own set of (simulated) GPUs. Instances advertise their worker's address, and one function's
instances are placed on both workers and served through the gateway."""

from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from tests.conftest import FIXTURE_FUNCTIONS, REDIS_URL
from tests.platform import dilu_executable, start_role
from tests.waiting import eventually

SPREAD_SPEC = """
name: spread
handler: handler:Echo
resources: {memory: 256Mi, gpu: true, sm_request: 0.6, sm_limit: 0.6}
scaling: {min_instances: 3, max_instances: 3, keep_alive_s: 600}
"""


def test_two_hosts(tmp_path: Path, postgres_url: str, redis_prefix: str) -> None:
    env = {"DILU_DATABASE_URL": postgres_url, "DILU_REDIS_URL": REDIS_URL, "DILU_REDIS_PREFIX": redis_prefix,
           "DILU_GPUS": "none", "DILU_CLUSTER_KEY": "cluster-secret-" + "x" * 16}
    migrated = subprocess.run([dilu_executable(), "migrate"], env={**os.environ, **env}, capture_output=True,
                              text=True, timeout=120)
    assert migrated.returncode == 0, migrated.stderr
    hosts = {"alpha": ("127.0.0.2", 1), "beta": ("127.0.0.3", 2)}   # address, simulated GPUs
    roles = []
    try:
        for name, (address, gpus) in hosts.items():
            roles.append(start_role(["worker"], {
                **env, "DILU_HOME": str(tmp_path / name), "DILU_HOST": address, "DILU_PORT": "0",
                "DILU_WORKER_NAME": name, "DILU_FAKE_GPUS": str(gpus)}, tmp_path / f"{name}.log"))
        for role, (address, _) in zip(roles, hosts.values(), strict=True):
            assert urlsplit(role.url).hostname == address and urlsplit(role.url).port not in (None, 0)
            # A worker takes orders only from callers with the cluster key.
            refused = httpx.get(f"{role.url}/v1/instances", timeout=10)
            assert refused.status_code == 401 and "DILU_CLUSTER_KEY" in refused.json()["error"]
        roles.append(start_role(["controller"], {**env, "DILU_HOME": str(tmp_path / "ctl")},
                                tmp_path / "controller.log", wait_for_url=False))
        gateway = start_role(["gateway"], {**env, "DILU_HOME": str(tmp_path / "gw"), "DILU_PORT": "0"},
                             tmp_path / "gateway.log")
        roles.append(gateway)

        folder = shutil.copytree(FIXTURE_FUNCTIONS / "ok", tmp_path / "spread")
        (folder / "model.yaml").write_text(SPREAD_SPEC)
        deployed = subprocess.run([dilu_executable(), "deploy", str(folder / "model.yaml")],
                                  env={**os.environ, **env, "DILU_URL": gateway.url},
                                  capture_output=True, text=True, timeout=180)
        assert deployed.returncode == 0, deployed.stderr
        with httpx.Client(base_url=gateway.url, timeout=60) as http:
            workers = {w["id"]: w for w in http.get("/v1/status").json()["workers"]}
            # Each host's simulated GPUs beside its CPU worker.
            assert set(workers) == {"alpha-cpu", "alpha-fakegpu0", "beta-cpu", "beta-fakegpu0", "beta-fakegpu1"}
            for worker_id, worker in workers.items():
                assert urlsplit(worker["url"]).hostname == hosts[worker_id.split("-")[0]][0]

            def spread() -> list[dict] | None:
                ready = [i for i in http.get("/v1/functions/spread/instances").json() if i["state"] == "ready"]
                return ready if len(ready) == 3 else None

            ready = eventually(spread, timeout=120, what="three ready instances")
            # 0.6 of a GPU each: one per GPU, so both hosts hold instances, each at its own address.
            placed = {(i["worker_id"].split("-")[0], urlsplit(i["endpoint"]).hostname) for i in ready}
            assert placed == {("alpha", "127.0.0.2"), ("beta", "127.0.0.3")}
            # Concurrent requests spread over the least-loaded instances: every host's are reached.
            with ThreadPoolExecutor(12) as pool:
                replies = list(pool.map(lambda n: http.post("/v1/functions/spread/invoke", json={"n": n}), range(240)))
            assert all(reply.status_code == 200 for reply in replies)
            assert {reply.headers["x-dilu-instance"] for reply in replies} == {i["id"] for i in ready}
    finally:
        for role in roles:
            role.stop()
