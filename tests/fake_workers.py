"""A stand-in worker for controller tests: it starts nothing, and reports the instances it was
asked to start as starting until told to stop them."""

from __future__ import annotations

from dilu.messages import STARTING, InstanceStatus, StartInstance
from dilu.slices import ComputeSlice


class RecordingWorker:
    """A worker that starts nothing and reports what it was asked to start."""

    def __init__(self) -> None:
        self.statuses: dict[str, InstanceStatus] = {}

    async def start_instance(self, request: StartInstance) -> InstanceStatus:
        status = InstanceStatus(request.instance_id, request.function, request.version, STARTING,
                                endpoint=f"http://127.0.0.1:9/{request.instance_id}")
        self.statuses[request.instance_id] = status
        return status

    async def stop_instance(self, instance_id: str) -> None:
        self.statuses.pop(instance_id, None)

    async def list_instances(self) -> list[InstanceStatus]:
        return list(self.statuses.values())

    async def read_logs(self, instance_id: str, tail: int = 200) -> str:
        return ""

    async def set_slice(self, instance_id: str, compute: ComputeSlice) -> bool:
        return False

    async def info(self) -> dict:
        return {"runtime_pool": None}
