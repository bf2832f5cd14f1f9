"""The servers users compare Dilu against: the v2 model servers, each in its own virtual
environment and process, and nginx as the reverse proxy.

``start_kserve``, ``start_mlserver`` and ``start_ray_serve`` create their environment on first use (a pinned
``pip install`` into the bench cache, ``$XDG_CACHE_HOME/dilu-bench``), start the bench's row-sum
model (Ray Serve: a no-op) on free loopback ports and wait until it answers ready. A peer that cannot be installed or
started is reported as skipped, with the reason, instead of failing the whole bench.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.process_memory import descendants

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dilu-bench"
KSERVE = "kserve==0.21.0"
MLSERVER = "mlserver==1.7.1"
RAY_SERVE = "ray[serve]==2.60.0"
GRPC_MESSAGE_BYTES = 64 * 2**20   # as Dilu's bench allows: a batch of images is past gRPC's 4 MiB default


class PeerUnavailable(Exception):
    """The peer could not be installed or started here; the message says why."""


@dataclass
class Peer:
    name: str
    http: str          # host:port of its REST server
    grpc: str          # host:port of its gRPC server
    binary_rest: bool  # whether its REST server takes the binary tensor extension
    process: subprocess.Popen
    workdir: Path

    def close(self) -> None:
        _stop(self.process, self.workdir)


def _stop(process: subprocess.Popen, workdir: Path) -> None:
    process.terminate()
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
    shutil.rmtree(workdir, ignore_errors=True)


def environment(name: str, requirement: str) -> Path:
    """The python of a virtual environment holding ``requirement``, created once."""
    folder = CACHE / name
    python = folder / "bin" / "python"
    marker = folder / ".installed"
    if marker.exists() and marker.read_text() == requirement:
        return python
    shutil.rmtree(folder, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", requirement], capture_output=True, text=True)
    if done.returncode != 0:
        raise PeerUnavailable(f"pip install {requirement} failed: {done.stderr.strip().splitlines()[-1:]}")
    marker.write_text(requirement)
    return python


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for each in sockets:
        each.bind(("127.0.0.1", 0))
    ports = [each.getsockname()[1] for each in sockets]
    for each in sockets:
        each.close()
    return ports


def _wait_ready(peer: Peer, log: Path, timeout_s: float = 120) -> Peer:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if peer.process.poll() is not None:
            raise PeerUnavailable(f"{peer.name} exited: {log.read_text()[-500:]}")
        try:
            if httpx.get(f"http://{peer.http}/v2/models/rowsums/ready", timeout=2).status_code == 200:
                return peer
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    peer.close()
    raise PeerUnavailable(f"{peer.name} was not ready within {timeout_s:g} s")


def start_kserve() -> Peer:
    python = environment("kserve", KSERVE)
    http, grpc = _free_ports(2)
    workdir = Path(tempfile.mkdtemp(prefix="dilu-bench-kserve-"))
    log = workdir / "log"
    process = subprocess.Popen([str(python), str(HERE / "kserve_rowsums.py"), f"--http_port={http}",
                                f"--grpc_port={grpc}", f"--grpc_max_send_message_length={GRPC_MESSAGE_BYTES}",
                                f"--grpc_max_receive_message_length={GRPC_MESSAGE_BYTES}"],
                               stdout=log.open("w"), stderr=subprocess.STDOUT)
    return _wait_ready(Peer("KServe", f"127.0.0.1:{http}", f"127.0.0.1:{grpc}", True, process, workdir), log)


def start_mlserver() -> Peer:
    python = environment("mlserver", MLSERVER)
    http, grpc, metrics = _free_ports(3)
    workdir = Path(tempfile.mkdtemp(prefix="dilu-bench-mlserver-"))
    for name in ("model.py", "model-settings.json"):
        shutil.copy(HERE / "mlserver_rowsums" / name, workdir / name)
    # Inference in the server's own process (parallel_workers 0): its fastest setting for one client.
    (workdir / "settings.json").write_text(json.dumps({
        "host": "127.0.0.1", "http_port": http, "grpc_port": grpc, "metrics_port": metrics,
        "parallel_workers": 0, "grpc_max_message_length": GRPC_MESSAGE_BYTES}))
    log = workdir / "log"
    process = subprocess.Popen([str(python.parent / "mlserver"), "start", str(workdir)], cwd=workdir,
                               stdout=log.open("w"), stderr=subprocess.STDOUT)
    return _wait_ready(Peer("MLServer", f"127.0.0.1:{http}", f"127.0.0.1:{grpc}", False, process, workdir), log)


@dataclass
class RayServe:
    url: str
    process: subprocess.Popen
    workdir: Path

    def close(self) -> None:
        """Ends the driver and every process Ray started below it (raylet, GCS, workers)."""
        below = descendants(self.process.pid)[1:]
        _stop(self.process, self.workdir)
        for pid in below:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def start_ray_serve(timeout_s: float = 180) -> RayServe:
    """Ray Serve with the no-op application (``ray_noop.py``) on a free loopback port."""
    python = environment("ray", RAY_SERVE)
    (port,) = _free_ports(1)
    workdir = Path(tempfile.mkdtemp(prefix="dilu-bench-ray-"))
    log = workdir / "log"
    process = subprocess.Popen([str(python), str(HERE / "ray_noop.py"), f"--port={port}"], cwd=workdir,
                               stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
                               env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            shutil.rmtree(workdir, ignore_errors=True)
            raise PeerUnavailable(f"Ray Serve exited: {log.read_text()[-500:]}")
        if "READY" in log.read_text(errors="replace"):
            return RayServe(f"http://127.0.0.1:{port}/", process, workdir)
        time.sleep(0.5)
    _stop(process, workdir)
    raise PeerUnavailable(f"Ray Serve was not ready within {timeout_s:g} s")


NGINX_CONF = """worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    keepalive_requests 10000000;   # the load generator's clients keep one connection each
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    upstream instance {{ server {host}:{port}; keepalive 256; keepalive_requests 10000000; }}
    server {{
        listen 127.0.0.1:{listen};
        client_max_body_size 64m;
        location / {{
            proxy_pass http://instance{prefix}/;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"""


@dataclass
class Proxy:
    url: str
    process: subprocess.Popen
    workdir: Path

    def close(self) -> None:
        _stop(self.process, self.workdir)


def start_nginx(upstream: str) -> Proxy:
    """nginx (one worker process, as the gateway is one process) proxying to ``upstream``
    (``http://host:port/prefix``) over kept-alive connections, without access logs."""
    binary = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if binary is None:
        raise PeerUnavailable("nginx is not installed (apt-get install nginx-light)")
    parsed = httpx.URL(upstream)
    (listen,) = _free_ports(1)
    workdir = Path(tempfile.mkdtemp(prefix="dilu-bench-nginx-"))
    workdir.chmod(0o777)    # a master started as root runs its worker as nobody, who writes temp files here
    conf = workdir / "nginx.conf"
    conf.write_text(NGINX_CONF.format(dir=workdir, host=parsed.host, port=parsed.port, listen=listen,
                                      prefix=parsed.path.rstrip("/")))
    process = subprocess.Popen([binary, "-c", str(conf), "-e", str(workdir / "error.log")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise PeerUnavailable(f"nginx exited: {(workdir / 'error.log').read_text()[-300:]}")
        try:
            socket.create_connection(("127.0.0.1", listen), 1).close()
            return Proxy(f"http://127.0.0.1:{listen}", process, workdir)
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise PeerUnavailable("nginx did not listen within 20 s")
