"""Where the built shim and fake driver are, building them from source when needed."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
SHIM_SOURCE = Path(__file__).resolve().parent.parent / "shim"
_build_lock = threading.Lock()


class ShimUnavailable(RuntimeError):
    """The shim is not built and cannot be built here (no compiler or CUDA headers)."""


@dataclass(frozen=True)
class ShimPaths:
    shim: Path          # libdilu_shim.so, for LD_PRELOAD
    fake_driver_dir: Path  # holds the fake libcuda.so.1, for LD_LIBRARY_PATH on simulated GPUs


def shim_paths(build_dir: Path | None = None) -> ShimPaths:
    """The built artefacts; runs ``make -C shim`` once if they are missing. With ``build_dir``
    (``DILU_SHIM_DIR``), the shim instances load is there: the worker installs its own build
    into it when that is newer (a worker in a container puts it on a folder the Docker engine can
    mount into function containers)."""
    build = build_dir or SHIM_SOURCE / "build"
    paths = ShimPaths(build / "libdilu_shim.so", build / "fake")
    if build_dir is not None:
        _install(SHIM_SOURCE / "build", build_dir)
    if paths.shim.exists() and (paths.fake_driver_dir / "libcuda.so.1").exists():
        return paths
    if build_dir is not None:
        raise ShimUnavailable(f"no libdilu_shim.so in {build_dir}")
    with _build_lock:
        if not paths.shim.exists():
            log.info("building the shim (make -C %s)", SHIM_SOURCE)
            result = subprocess.run(["make", "-s", "-C", str(SHIM_SOURCE)], capture_output=True, text=True)
            if result.returncode != 0:
                raise ShimUnavailable(f"building the shim failed: {result.stderr.strip()[-500:]}")
    return paths


def _install(source: Path, target: Path) -> None:
    """Copies the shim and the fake driver from ``source`` into ``target`` where they differ
    (replacing files atomically, so a running instance keeps the library it mapped)."""
    for relative in ("libdilu_shim.so", "fake/libcuda.so.1"):
        origin, destination = source / relative, target / relative
        if not origin.is_file() or origin.resolve() == destination.resolve():
            continue
        if destination.is_file() and destination.read_bytes() == origin.read_bytes():
            continue
        destination.parent.mkdir(parents=True, exist_ok=True)
        staging = destination.with_name(destination.name + ".new")
        shutil.copyfile(origin, staging)
        staging.chmod(0o755)
        os.replace(staging, destination)
