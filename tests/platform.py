"""Runs `dilu up` (or single roles) as real child processes for end-to-end tests."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from tests.waiting import eventually

URL_PATTERN = re.compile(r"(?:Dilu is up at|Dilu gateway at|Dilu worker at) (http://\S+)")
GRPC_PATTERN = re.compile(r"over gRPC at (\S+?);")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def dilu_executable() -> str:
    found = shutil.which("dilu", path=str(Path(sys.executable).parent)) or shutil.which("dilu")
    assert found, "the dilu console script is not installed"
    return found


@dataclass
class Role:
    """One running `dilu ...` process."""

    process: subprocess.Popen
    log_path: Path
    log_file: Any = None
    lines: list[str] = field(default_factory=list)
    url: str | None = None
    grpc_address: str | None = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                _dump_stacks(self.process.pid, self.log_path)
                self.process.kill()
                self.process.wait()
        if self.process.stdout:
            self.process.stdout.close()
        if self.log_file:
            self.log_file.close()
        return self.process.returncode


def _dump_stacks(pid: int, log_path: Path) -> None:
    """Appends the stacks of a process that would not stop to its log (when py-spy is there)."""
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        return
    dump = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
    with open(log_path, "a") as log:
        log.write("\n==== stacks of a process that did not stop on SIGINT ====\n" + dump.stdout + dump.stderr)


def list_lines(stream):
    """Yields lines until the stream ends or is closed."""
    while True:
        try:
            line = stream.readline()
        except ValueError:
            return
        if not line:
            return
        yield line


def start_role(args: list[str], env: dict[str, str], log_path: Path, wait_for_url: bool = True,
               timeout: float = 60) -> Role:
    # Several gateways may run at once: each takes a free gRPC port unless the test names one.
    # Spares import no torch here (each platform would spend seconds of CPU on it); the pool's
    # preloading has its own test.
    full_env = {**os.environ, "DILU_GRPC_PORT": "0", "DILU_SPARE_PRELOAD": "", **env}
    log_file = open(log_path, "ab")  # closed with the process
    process = subprocess.Popen([dilu_executable(), *args], env=full_env, stdout=subprocess.PIPE,
                               stderr=log_file, stdin=subprocess.DEVNULL, text=True)
    role = Role(process=process, log_path=log_path, log_file=log_file)

    def pump() -> None:
        for line in list_lines(process.stdout):
            role.lines.append(line.rstrip("\n"))
            match = URL_PATTERN.search(line)
            if match and role.url is None:
                role.url = match.group(1)
            found = GRPC_PATTERN.search(line)
            if found and role.grpc_address is None:
                role.grpc_address = found.group(1)

    threading.Thread(target=pump, daemon=True).start()
    if wait_for_url:
        def has_url() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"dilu {' '.join(args)} exited early:\n{role.log()}")
            return role.url is not None

        eventually(has_url, timeout=timeout, what=f"dilu {' '.join(args)} to start")
    return role


class Platform:
    """`dilu up` in a child process plus helpers to drive it through the CLI and HTTP."""

    def __init__(self, home: Path, env: dict[str, str] | None = None, demo: bool = False) -> None:
        self.home = home
        # Profiling on deploy takes a few seconds of trials; tests that are about it turn it on.
        self.env = {"DILU_HOME": str(home), "DILU_PROFILING": "false",
                    # Deploys by path may name the test's own folder and the repository (examples, fixtures).
                    "DILU_LOCAL_ROOTS": f"{home.parent}:{Path(__file__).resolve().parent.parent}", **(env or {})}
        args = ["up", "--port", "0"] + (["--demo"] if demo else [])
        self.role = start_role(args, self.env, home.parent / f"{home.name}-up.log")
        self.url = self.role.url
        self.http = httpx.Client(base_url=self.url, timeout=120)

    @property
    def grpc_address(self) -> str:
        """host:port of the gateway's gRPC service (printed just after the URL)."""
        return eventually(lambda: self.role.grpc_address, timeout=30, what="the gRPC address")

    def cli(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        env = {**os.environ, **self.env, "DILU_URL": self.url, "COLUMNS": "200"}
        return subprocess.run([dilu_executable(), *args], env=env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def function(self, name: str) -> dict[str, Any]:
        return self.http.get(f"/v1/functions/{name}").json()

    def instances(self, name: str) -> list[dict[str, Any]]:
        return self.http.get(f"/v1/functions/{name}/instances").json()

    def invoke(self, name: str, payload: Any) -> httpx.Response:
        return self.http.post(f"/v1/functions/{name}/invoke", content=json.dumps(payload),
                              headers={"content-type": "application/json"})

    def send_unread(self, path: str, body: Any) -> socket.socket:
        """A JSON POST sent on a connection of its own, whose answer nobody reads yet; close the
        socket to leave, as a caller who gives up does."""
        address = urlsplit(self.url)
        connection = socket.create_connection((address.hostname, address.port), timeout=60)
        data = json.dumps(body).encode()
        connection.sendall(f"POST {path} HTTP/1.1\r\nhost: {address.netloc}\r\ncontent-type: application/json\r\n"
                           f"content-length: {len(data)}\r\n\r\n".encode() + data)
        return connection

    def deploy_file(self, spec_file: Path, yaml_text: str | None = None) -> httpx.Response:
        return self.http.post("/v1/functions", json={
            "yaml": yaml_text if yaml_text is not None else spec_file.read_text(),
            "source_dir": str(spec_file.parent)})

    def wait_ready(self, name: str, timeout: float = 120) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            function = self.function(name)
            assert function["status"] != "failed", function["error"]
            return function if function["status"] == "ready" and function["ready_instances"] > 0 else None

        return eventually(ready, timeout=timeout, what=f"{name} to be ready")

    def close(self) -> int:
        self.http.close()
        return self.role.stop()
