"""Builds the shim and the fake driver, and runs driver-API clients under them."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker.tokens.manager import TokenManager, socket_path_for

ROOT = Path(__file__).resolve().parent.parent
SHIM_DIR = ROOT / "shim"
BUILD = SHIM_DIR / "build"
CLIENT = Path(__file__).resolve().parent / "fixtures" / "shim_client.py"
NS_PER_BLOCK = 1000
CAPACITY = 1e9 / NS_PER_BLOCK  # tokens (blocks) per second of the fake device


@contextlib.contextmanager
def running_manager(tmp_path: Path, name: str = "GPU-test", capacity_per_s: float = CAPACITY,
                    **options: Any) -> Iterator[TokenManager]:
    """A token manager whose period loop runs in this (test) process. That heap holds every
    module the test session imported: a full garbage collection there could stall the loop for
    tens of ms, which is not what the tests measure, so what is there now is frozen meanwhile."""
    gc.collect()
    gc.freeze()
    manager = TokenManager(gpu_uuid=name, socket_path=socket_path_for(tmp_path, name), capacity_per_s=capacity_per_s,
                           **options)
    manager.start()
    try:
        yield manager
    finally:
        manager.stop()
        gc.unfreeze()


def build_shim() -> None:
    subprocess.run(["make", "-s", "-C", str(SHIM_DIR)], check=True, capture_output=True, timeout=300)


@dataclass
class Client:
    process: subprocess.Popen

    def next_line(self) -> dict:
        """The next JSON line, as soon as the client prints it."""
        while True:
            line = self.process.stdout.readline()
            assert line, f"client ended early: {self.process.stderr.read()}"
            if line.startswith("{"):
                return json.loads(line)

    def kill(self) -> None:
        """Ends a client that would run on (a background load), reaping it."""
        self.process.kill()
        self.process.communicate(timeout=30)

    def lines(self, timeout: float = 120) -> list[dict]:
        stdout, stderr = self.process.communicate(timeout=timeout)
        assert self.process.returncode == 0, stderr
        self.stderr = stderr
        return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def client_env(tmp: Path, *, socket: Path | None = None, instance: str = "-", shim: bool = True,
               memory_limit: int | None = None, clock: str = "clock", extra: dict | None = None) -> dict[str, str]:
    env = {**os.environ, "LD_LIBRARY_PATH": str(BUILD / "fake"), "DILU_FAKE_NS_PER_BLOCK": str(NS_PER_BLOCK),
           "DILU_FAKE_CLOCK": str(tmp / clock), "DILU_INSTANCE_ID": instance, "DILU_SHIM_LOG": "2",
           "PYTHONPATH": str(ROOT)}
    if shim:
        env["LD_PRELOAD"] = str(BUILD / "libdilu_shim.so")
    if socket is not None:
        env["DILU_TOKEN_SOCKET"] = str(socket)
    if memory_limit is not None:
        env["DILU_MEMORY_LIMIT"] = str(memory_limit)
    env.update(extra or {})
    return env


def start_client(env: dict[str, str], *args: object) -> Client:
    process = subprocess.Popen([sys.executable, str(CLIENT), *map(str, args)], env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return Client(process)
