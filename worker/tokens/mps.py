"""MPS for GPU instances, when the worker is set to use it (``DILU_MPS=on``; off by default).

With a running MPS control daemon the driver makes every CUDA process a client of one server,
and clients' kernels run side by side instead of time-sliced. Dilu then also asks the daemon to
favour latency work: batch instances are clients of below-normal priority
(``CUDA_MPS_CLIENT_PRIORITY=1``) whose share of the SMs is capped at their slice's limit
(``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``: a cap, not a reservation). Latency instances keep normal
priority and every SM. Both are read by the driver at its initialisation, which in a spare process
happens only after the instance's environment was handed over.

Why off by default (docs/DECISIONS.md, "Isolation"): an MPS server serves one user at a time, and
a root worker runs each function as its own user; a fatal fault of one client ends every client
on the GPU; and the hold and window already keep background work out of a latency request's way
on a time-sliced GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

BELOW_NORMAL = "1"


@dataclass(frozen=True)
class MpsSetup:
    pipe_dir: Path | None = None     # the control daemon's pipes; CUDA's default when None


def client_env(setup: MpsSetup, cls: str, sm_limit: float) -> dict[str, str]:
    """What an instance of class ``cls`` with compute limit ``sm_limit`` is started with (pure)."""
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(setup.pipe_dir)} if setup.pipe_dir is not None else {}
    if cls != "latency":
        env["CUDA_MPS_CLIENT_PRIORITY"] = BELOW_NORMAL
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, min(100, round(sm_limit * 100))))
    return env
