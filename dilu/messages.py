"""Plain dataclasses that cross role and process boundaries (never live handles)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Self

from dilu.slices import DEFAULT_SLICE, ComputeSlice
from dilu.workflows.hints import WorkflowHint

# Instance states as the worker observes them.
STARTING, READY, STOPPING, STOPPED, FAILED, LOST = "starting", "ready", "stopping", "stopped", "failed", "lost"
ACTIVE_STATES = frozenset({STARTING, READY})


class FunctionStatus(StrEnum):
    """A function version's life: deploying -> (profiling -> deploying ->) ready | failed.

    Only ``ControllerContext.set_status`` changes it (and tells the gateways)."""

    DEPLOYING = "deploying"
    PROFILING = "profiling"
    READY = "ready"
    FAILED = "failed"


class InstanceRole(StrEnum):
    SERVE = "serve"       # serves requests through the gateway
    PROFILE = "profile"   # driven by a profiling job only, never routed to


class _Wire:
    """JSON-ready conversion for flat message dataclasses."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        return cls(**data)


@dataclass(frozen=True)
class DeviceInfo:
    """The device a worker owns: one GPU, or the host CPU."""

    kind: str  # "gpu" | "cpu"
    uuid: str | None
    name: str
    memory_bytes: int
    index: int | None = None
    fake: bool = False  # a GPU simulated by shim/'s fake driver (tests and demos without a GPU)


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker announces in each heartbeat."""

    id: str
    host: str
    url: str | None
    device: DeviceInfo

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkerInfo:
        return cls(id=data["id"], host=data["host"], url=data.get("url"), device=DeviceInfo(**data["device"]))


@dataclass(frozen=True)
class StartInstance(_Wire):
    """The controller's order to start one instance of a function on a worker."""

    instance_id: str
    function: str
    version: int
    spec: dict[str, Any]
    source_dir: str
    memory_bytes: int
    compute: ComputeSlice = DEFAULT_SLICE
    bundle: str | None = None   # "sha256:<hex>" of the uploaded code; else ``source_dir`` or the spec's image
    weights_path: str = ""   # the host's copy of the spec's weights artifact (the worker fills it in)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["compute"] = self.compute.to_wire()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StartInstance:
        data = dict(data)
        # An order recorded by an earlier release (an adopted instance) names the two shares alone.
        request, limit = data.pop("sm_request", None), data.pop("sm_limit", None)
        wire = data.pop("compute", None) or {"sm_request": DEFAULT_SLICE.request if request is None else request,
                                              "sm_limit": DEFAULT_SLICE.limit if limit is None else limit}
        return cls(**data, compute=ComputeSlice(float(wire["sm_request"]), float(wire["sm_limit"])))


@dataclass(frozen=True)
class InstanceStatus(_Wire):
    """An instance as its worker sees it now."""

    instance_id: str
    function: str
    version: int
    state: str
    endpoint: str | None = None
    error: str | None = None
    pid: int | None = None
    exit_code: int | None = None
    was_ready: bool = False
    startup: dict[str, float] | None = None   # seconds per loading stage, once ready (dilu.loading)
    changed_at: float | None = None            # unix time the worker saw this state begin


@dataclass(frozen=True)
class Endpoint(_Wire):
    """A ready instance the gateway may route to, and the worker it runs on."""

    instance_id: str
    url: str
    worker_id: str = ""


@dataclass(frozen=True)
class FunctionActivity:
    """Per-function load as the gateways last reported it (summed over gateways)."""

    in_flight: int = 0
    queued: int = 0
    last_request_at: float | None = None   # the latest a request began or was answered: idle since then
    requests: dict[int, int] = field(default_factory=dict)  # unix second -> count
    workflow: WorkflowHint = field(default_factory=WorkflowHint)   # what its workflows need of it
