"""Shared pieces of the shim benchmarks: build, a token manager, launcher processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from worker.tokens.manager import TokenManager, socket_path_for

BUILD = ROOT / "shim" / "build"
LAUNCHER = BUILD / "launcher"
NS_PER_BLOCK = 1000


def build() -> None:
    subprocess.run(["make", "-s", "-C", str(ROOT / "shim")], check=True)


def workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="dilu-shim-bench-"))


def manager(tmp: Path, capacity_per_s: float = 1e9 / NS_PER_BLOCK) -> TokenManager:
    started = TokenManager(gpu_uuid="GPU-bench", socket_path=socket_path_for(tmp, "GPU-bench"),
                           capacity_per_s=capacity_per_s)
    started.start()
    return started


def env(tmp: Path, *, shim: bool, socket: Path | None = None, instance: str = "-",
        ns_per_block: int = NS_PER_BLOCK) -> dict[str, str]:
    result = {**os.environ, "LD_LIBRARY_PATH": str(BUILD / "fake"), "DILU_FAKE_NS_PER_BLOCK": str(ns_per_block),
              "DILU_FAKE_CLOCK": str(tmp / "clock"), "DILU_INSTANCE_ID": instance, "DILU_SHIM_LOG": "0"}
    if shim:
        result["LD_PRELOAD"] = str(BUILD / "libdilu_shim.so")
    if socket is not None:
        result["DILU_TOKEN_SOCKET"] = str(socket)
    return result


def launcher(environment: dict[str, str], *args: object) -> subprocess.Popen:
    return subprocess.Popen([str(LAUNCHER), *map(str, args)], env=environment, stdout=subprocess.PIPE, text=True)


def results(process: subprocess.Popen) -> list[dict]:
    stdout, _ = process.communicate(timeout=600)
    if process.returncode != 0:
        raise RuntimeError(f"launcher failed with {process.returncode}")
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
