"""Two gateways behind nginx (the recipe in deploy/nginx/dilu.conf, as shipped), one killed -9
under 16 clients' invokes: the other serves everything after, and the only requests that fail
are those the dead gateway had already received, answered 502 by nginx (which never repeats a
POST on its own): retried by the client, each of them succeeds."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import httpx
import pytest

from tests.cluster import CLIENTS, Cluster, Load
from tests.conftest import FIXTURE_FUNCTIONS, ROOT
from tests.platform import free_port
from tests.waiting import eventually

# It counts every request that fails while a gateway dies under load: another test's load beside it
# adds failures of its own. It runs with no other test beside it (scripts/test).
pytestmark = pytest.mark.alone

RECIPE = ROOT / "deploy" / "nginx" / "dilu.conf"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
MAIN = """worker_processes 2;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    include {dir}/dilu.conf;
}}
"""


def _nginx(workdir: Path, first: str, second: str) -> tuple[subprocess.Popen, str]:
    """nginx running the recipe with the two gateways' addresses and a free port put in."""
    recipe = RECIPE.read_text()
    for placeholder in ("server gateway-1:8080", "server gateway-2:8080", "listen 80;"):
        assert placeholder in recipe, f"the recipe lost {placeholder!r}"
    port = free_port()
    workdir.chmod(0o777)     # a master started as root runs its workers as nobody, who write temp files here
    (workdir / "dilu.conf").write_text(recipe.replace("server gateway-1:8080", f"server {first}")
                                       .replace("server gateway-2:8080", f"server {second}")
                                       .replace("listen 80;", f"listen 127.0.0.1:{port};"))
    (workdir / "nginx.conf").write_text(MAIN.format(dir=workdir))
    process = subprocess.Popen([NGINX, "-c", str(workdir / "nginx.conf"), "-e", str(workdir / "error.log")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"

    def listening() -> bool:
        assert process.poll() is None, (workdir / "error.log").read_text()
        try:
            return httpx.get(url + "/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    eventually(listening, timeout=30, what="nginx to serve")
    return process, url


@pytest.mark.skipif(not Path(NGINX).exists(), reason="nginx is not installed (apt-get install nginx-light)")
def test_a_gateway_killed_behind_nginx_loses_only_requests_a_client_retry_recovers(
        tmp_path: Path, postgres_url: str, redis_prefix: str) -> None:
    cluster = Cluster(tmp_path, postgres_url, redis_prefix)
    proxy = load = None
    workdir = Path(tempfile.mkdtemp(prefix="dilu-test-nginx-"))
    try:
        cluster.controller("only")
        doomed = cluster.add_gateway("gateway-2")
        ok = shutil.copytree(FIXTURE_FUNCTIONS / "ok", tmp_path / "ok")
        (ok / "model.yaml").write_text((ok / "model.yaml").read_text().replace(
            "scaling:\n", "scaling:\n  min_instances: 1\n  max_instances: 1\n"))
        cluster.deploy(ok)
        proxy, url = _nginx(workdir, cluster.gateway.url.split("//")[1], doomed.url.split("//")[1])
        eventually(lambda: httpx.post(f"{doomed.url}/v1/functions/ok/invoke", json={}).status_code == 200,
                   timeout=30, what="the second gateway to route ok")

        load = Load(url, "ok")
        eventually(lambda: len(load.answers) >= 20 * CLIENTS, timeout=60, what="load through both gateways")
        os.kill(doomed.process.pid, signal.SIGKILL)
        killed_after = len(load.answers)
        eventually(lambda: len(load.answers) >= killed_after + 40 * CLIENTS, timeout=60,
                   what="load after the kill")
        answers = load.stop()
        load = None

        failed = [a for a in answers if a != 200]
        assert all(a.startswith("502 ") for a in failed), [a for a in failed if not a.startswith("502 ")][:5]
        assert len(failed) <= CLIENTS, "more requests failed than were in flight at the dead gateway"
        with httpx.Client(base_url=url, timeout=30) as http:      # each client's retry of its failed one
            for n in range(len(failed)):
                reply = http.post("/v1/functions/ok/invoke", json={"retry": n})
                assert reply.status_code == 200 and reply.json()["input"] == {"retry": n}
    finally:
        if load is not None:
            load.stop()
        if proxy is not None:
            proxy.terminate()
            proxy.wait(30)
        cluster.close()
        shutil.rmtree(workdir, ignore_errors=True)
