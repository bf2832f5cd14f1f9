"""Vertical control of one GPU worker: its token manager and what each instance is injected with."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from dilu.messages import DeviceInfo, StartInstance
from dilu.policy.isolation import IsolationParams
from dilu.slices import ComputeSlice
from worker.shimlib import ShimPaths
from worker.tokens.manager import TokenManager, socket_path_for
from worker.tokens.mps import MpsSetup, client_env
from worker.tokens.process import ManagerProcess

log = logging.getLogger(__name__)
UNCALIBRATED_CAPACITY = 1e7


def class_of(request: StartInstance) -> str:
    """An instance's class: latency (the default) or batch."""
    return request.spec.get("class", "latency")


class GpuControl:
    """Owns the GPU's token manager; tells the runtime what to inject into each instance."""

    def __init__(self, *, device: DeviceInfo, shim: ShimPaths, run_dir: Path,
                 capacity_per_s: float | None, fake_ns_per_block: int, in_process: bool = False,
                 feedback: bool = True, isolation: IsolationParams | None = IsolationParams(),
                 fake_sched: str = "timeslice", mps: MpsSetup | None = None) -> None:
        """``isolation``: the release rules of batch work beside latency work (None: token-rate
        control alone); ``fake_sched``: how a simulated GPU schedules its processes; ``mps``:
        instances are MPS clients (None: they are not)."""
        self.device = device
        self.shim = shim
        self.fake_ns_per_block = fake_ns_per_block
        self.fake_sched = fake_sched
        self.mps = mps
        self.clock_file = run_dir / f"{device.uuid}.clock"
        if device.fake:
            capacity_per_s = 1e9 / fake_ns_per_block
        elif capacity_per_s is None:
            log.warning("DILU_TOKEN_CAPACITY is not set for %s: compute shares are approximate until it is "
                        "calibrated (bench/gpu_check.sh prints it)", device.uuid)
            capacity_per_s = UNCALIBRATED_CAPACITY
        # Its own process by default (worker.tokens.process says why), closing the loop with
        # NVML (a simulated GPU's fake NVML reads its clock); a thread on request, open-loop.
        gpu_uuid, socket_path = device.uuid or f"gpu{device.index}", socket_path_for(run_dir, device.uuid or "gpu")
        self.manager: TokenManager | ManagerProcess
        if in_process:
            self.manager = TokenManager(gpu_uuid=gpu_uuid, socket_path=socket_path, capacity_per_s=capacity_per_s,
                                        isolation=isolation)
        else:
            fake_env = {"LD_LIBRARY_PATH": str(shim.fake_driver_dir), "DILU_FAKE_CLOCK": str(self.clock_file)}
            self.manager = ManagerProcess(gpu_uuid=gpu_uuid, socket_path=socket_path, capacity_per_s=capacity_per_s,
                                          measure=feedback, env=fake_env if device.fake else None, isolation=isolation)

    def start(self) -> None:
        self.clock_file.parent.mkdir(parents=True, exist_ok=True)
        if self.device.fake:
            # A fresh device (nothing queued by an earlier worker's instances), whose clock every
            # instance maps, whatever user it runs as.
            self.clock_file.write_bytes(b"")
            self.clock_file.chmod(0o666)
        self.manager.start()

    def stop(self) -> None:
        self.manager.stop()

    def admit(self, request: StartInstance, uid: int | None, cgroup: str | None = None) -> dict[str, str]:
        """Registers the instance's slice, opens its own registration socket (for processes of
        ``uid`` in ``cgroup``: ``worker.tokens.peers``) and returns the environment that injects
        the shim."""
        cls = class_of(request)
        self.set_slice(request.instance_id, cls, request.compute)
        socket_path = self.manager.admit(request.instance_id, uid, cgroup)
        env = {
            **self.injected_at_start(),
            "DILU_TOKEN_SOCKET": socket_path,
            "DILU_MEMORY_LIMIT": str(request.memory_bytes),
        }
        if self.device.fake:
            env.update({
                "DILU_FAKE_CLOCK": str(self.clock_file),
                "DILU_FAKE_NS_PER_BLOCK": str(self.fake_ns_per_block),
                "DILU_FAKE_MEMORY": str(self.device.memory_bytes),
                "DILU_FAKE_SCHED": self.fake_sched,
            })
        if self.mps is not None:
            env.update(client_env(self.mps, cls, request.compute.limit))
        return env

    def injected_at_start(self) -> dict[str, str]:
        """The part of the injection the dynamic loader must see when the process starts (the
        shim preloaded; a simulated GPU's fake driver on the search path): the same for every
        instance of this worker, so its runtime pool's spares start with it. The rest (token
        manager, memory slice, ...) is read by the shim at the first driver call."""
        env = {"LD_PRELOAD": str(self.shim.shim)}
        if self.device.fake:
            env["LD_LIBRARY_PATH"] = str(self.shim.fake_driver_dir)
        return env

    def release(self, instance_id: str) -> None:
        self.manager.remove_slice(instance_id)

    def set_slice(self, instance_id: str, cls: str, compute: ComputeSlice) -> None:
        self.manager.set_slice(instance_id, cls, compute.request, compute.limit)

    def telemetry(self) -> dict[str, Any]:
        return self.manager.telemetry()

    def period_stats(self) -> dict[str, Any]:
        """How regularly the manager's period loop runs (``TokenManager.period_stats``)."""
        return {"runs_in": "thread" if isinstance(self.manager, TokenManager) else "process",
                **self.manager.period_stats()}
