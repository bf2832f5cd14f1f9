"""Where the built shim and fake driver are, building them from source when needed."""

from __future__ import annotations

import logging
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
    """The built artefacts; runs ``make -C shim`` once if they are missing."""
    build = build_dir or SHIM_SOURCE / "build"
    paths = ShimPaths(build / "libdilu_shim.so", build / "fake")
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
