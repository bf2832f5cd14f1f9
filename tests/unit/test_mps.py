"""MPS for GPU instances: what each instance is started with, when the worker is set to use it."""

from __future__ import annotations

from pathlib import Path

import pytest

from dilu.messages import DeviceInfo, StartInstance
from dilu.slices import ComputeSlice
from worker.shimlib import ShimPaths
from worker.tokens.control import GpuControl
from worker.tokens.mps import MpsSetup, client_env


@pytest.mark.parametrize(("label", "setup", "cls", "limit", "expect"), [
    ("latency work keeps normal priority and every SM", MpsSetup(), "latency", 0.5, {}),
    ("batch work below normal priority, capped at its limit", MpsSetup(), "batch", 0.75,
     {"CUDA_MPS_CLIENT_PRIORITY": "1", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "75"}),
    ("a tiny limit still leaves one percent", MpsSetup(), "batch", 0.001,
     {"CUDA_MPS_CLIENT_PRIORITY": "1", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "1"}),
    ("the daemon's pipe folder when it is not CUDA's default", MpsSetup(Path("/run/mps")), "latency", 1.0,
     {"CUDA_MPS_PIPE_DIRECTORY": "/run/mps"}),
])
def test_client_env(label: str, setup: MpsSetup, cls: str, limit: float, expect: dict[str, str]) -> None:
    assert client_env(setup, cls, limit) == expect, label


def _control(tmp_path: Path, mps: MpsSetup | None) -> GpuControl:
    device = DeviceInfo(kind="gpu", uuid="GPU-unit", name="unit", memory_bytes=1 << 30, fake=True)
    return GpuControl(device=device, shim=ShimPaths(tmp_path / "libdilu_shim.so", tmp_path / "fake"),
                      run_dir=tmp_path, capacity_per_s=None, fake_ns_per_block=1000, mps=mps, in_process=True)


def _start(cls: str) -> StartInstance:
    return StartInstance(instance_id="i-1", function="f", version=1, spec={"class": cls}, source_dir="/x",
                         memory_bytes=1 << 20, compute=ComputeSlice(0.25, 0.6))


def _admitted(control: GpuControl) -> dict[str, str]:
    try:
        return control.admit(_start("batch"), uid=None)
    finally:
        control.stop()


def test_an_instance_is_an_mps_client_only_when_the_worker_says_so(tmp_path: Path) -> None:
    off = _admitted(_control(tmp_path, None))
    assert not any(name.startswith("CUDA_MPS") for name in off)
    on = _admitted(_control(tmp_path, MpsSetup()))
    assert on["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "60" and on["CUDA_MPS_CLIENT_PRIORITY"] == "1"
    assert on["DILU_FAKE_SCHED"] == "timeslice", "a simulated GPU runs its processes time-sliced by default"
