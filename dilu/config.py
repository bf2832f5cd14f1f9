"""Settings for every role: one pydantic-settings class each; nothing else reads os.environ.

All variables start with ``DILU_``. Settings are built in the app factory or CLI command,
never at import time, so tests can pass their own values.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, computed_field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from dilu.spec import parse_memory


def default_home() -> Path:
    return Path.home() / ".dilu"


class CommonSettings(BaseSettings):
    """What every role shares: where state lives."""

    model_config = SettingsConfigDict(env_prefix="DILU_", extra="ignore")

    home: Path = Field(default_factory=default_home, description="State folder for the embedded default")
    database_url: str | None = Field(None, description="SQLAlchemy URL; SQLite under home when unset")
    redis_url: str | None = Field(None, description="Redis URL; in-process store when unset")
    redis_prefix: str = Field("dilu:", description="Prefix of every Redis key and channel")
    scheduler: str = Field("dilu",
                           description="dilu | exclusive | static-limits | request-only | time-sharing (placement "
                                               "and the admission of resizes)")
    max_bundle_bytes: int = Field(200 * 1024 * 1024, gt=0, description="Largest code bundle (compressed) the "
                                                                       "gateway accepts and a worker unpacks")
    artifact_store: Path | None = Field(None, description="Folder of weight artifacts, shared by the gateways "
                                                          "(which write it) and the workers (which read it); "
                                                          "<home>/artifacts when unset")
    instance_sockets: str = Field("auto", max_length=500, description=(
        "Folder of the Unix sockets a host's process instances also listen on, through which a gateway on the "
        "same host reaches them without loopback TCP (it falls back to TCP where a socket is not there): "
        "auto: <home>/sockets; off: TCP only"))
    max_artifact_bytes: int = Field(64 * 2**30, gt=0, description="Largest weights artifact the gateway accepts")
    cluster_key: str | None = Field(None, min_length=24, description="Shared secret of the roles: workers take "
                                                                     "orders only from callers that send it")
    instance_uids: str = Field("300000-999999", description="Worker running as root: the uids (FIRST-LAST) its "
                                                            "functions' instances run as, one per function on a "
                                                            "host; an open gateway refuses callers of them")
    stats_flush_s: float = Field(0.5, gt=0, description="How often the gateways' request counters reach the state "
                                                        "store (the controller reads a second once it is flushed)")
    stop_drain_s: float = Field(30.0, ge=0, le=86400,
                                description="When a role stops (SIGINT, SIGTERM): the most a worker's instances may "
                                            "finish their streams (their max_stream_s, else drain_s, within this), "
                                            "and a gateway's answers in flight; requests still waiting for an "
                                            "instance go elsewhere at once (a gateway answers them 503)")

    @field_validator("instance_uids")
    @classmethod
    def _uid_range(cls, value: str) -> str:
        parse_range(value)
        return value

    @field_validator("cluster_key", mode="before")
    @classmethod
    def _unset_when_empty(cls, value: str | None) -> str | None:
        return value or None   # compose passes unset variables as empty strings

    @field_validator("database_url")
    @classmethod
    def _normalise_postgres_driver(cls, value: str | None) -> str | None:
        # Users write postgresql://...; the installed driver is psycopg 3.
        if value and value.startswith("postgresql://"):
            return "postgresql+psycopg://" + value[len("postgresql://"):]
        if value and value.startswith("postgres://"):
            return "postgresql+psycopg://" + value[len("postgres://"):]
        return value

    @field_validator("scheduler")
    @classmethod
    def _known_scheduler(cls, value: str) -> str:
        from dilu.policy.scheduler.profiles import Policy

        if value not in {p.value for p in Policy}:
            raise ValueError(f"unknown scheduler {value!r}; known: {', '.join(p.value for p in Policy)}")
        return value

    @computed_field  # type: ignore[prop-decorator]
    @property
    def effective_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'dilu.db'}"

    @property
    def effective_artifact_store(self) -> Path:
        return self.artifact_store or self.home / "artifacts"

    @property
    def instance_sockets_folder(self) -> Path | None:
        """Where instances' Unix sockets live on this host; None: instances are reached over TCP."""
        if self.instance_sockets == "off":
            return None
        return self.home / "sockets" if self.instance_sockets == "auto" else Path(self.instance_sockets)

    @property
    def logs_dir(self) -> Path:
        return self.home / "logs"


class GatewaySettings(CommonSettings):
    """The public HTTP API."""

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    max_request_bytes: int = Field(10 * 1024 * 1024, gt=0, description="Largest accepted invoke body")
    workflow_memory_price: float = Field(
        0.01, ge=0, le=1000, description="Per-node keep-alive of workflows: seconds of one request's latency that "
                                         "holding 1 GiB for 1 s is worth (higher: hold less, save memory)")
    grpc_port: int = Field(8001, ge=-1, le=65535, description="Port of the inference protocol's gRPC service "
                                                              "(0: any free port; -1: off)")
    local_roots: str = Field("", description="Folders (':'-separated) that deploys by local path may name; "
                                             "empty: deploying by path is off (upload bundles)")
    max_api_body_bytes: int = Field(1024 * 1024, gt=0,
                                    description="Largest body of the other API calls (deploys, keys)")
    admin_key: str | None = Field(None, min_length=24, description="A bootstrap key with the admin scope (not stored); "
                                                                   "any key turns authentication on")
    @field_validator("admin_key", mode="before")
    @classmethod
    def _no_empty_key(cls, value: str | None) -> str | None:
        return value or None

    metrics_public: bool = Field(True, description="Serve /metrics without a key (for scrapers inside the network); "
                                                   "false: it needs the read scope")
    queue_size: int = Field(64, gt=0, description="Requests that may wait per function during a cold start")
    queue_timeout_s: float = Field(60.0, gt=0, description="How long a queued request waits for an instance")
    request_timeout_s: float = Field(300.0, gt=0, description="Upper bound on one forwarded request; for a "
                                                            "stream, on its start and on each silence within it")
    max_stream_s: float = Field(3600.0, gt=0, description="Upper bound on one streamed answer, start to end")
    routes_refresh_s: float = Field(2.0, gt=0, description="Full routing-table refresh, beside events")
    share_sample_s: float = Field(1.0, gt=0, description="How often the dashboard's share history is sampled")


def path_roots(value: str) -> list[Path]:
    """The resolved folders of a ':'-separated list."""
    return [Path(part).expanduser().resolve() for part in value.split(":") if part.strip()]


class ControllerSettings(CommonSettings):
    """The control loops."""

    reconcile_interval_s: float = Field(0.5, gt=0)
    leader_lease_s: float = Field(3.0, ge=0.5, le=60, description="Controllers: the lease the leader renews every "
                                                                  "third of; a standby takes over within it (and a "
                                                                  "sixth more) of the leader's death or partition")
    controller_id: str | None = Field(None, min_length=1, max_length=200,
                                      description="This controller's name in the lease and in dilu status "
                                                  "(default: host:pid:nonce)")
    quiet_interval_s: float = Field(2.0, gt=0, description="The pass interval while nothing happens (no requests "
                                                           "lately, nothing starting, stopping or deploying); "
                                                           "events still wake the controller at once")
    resync_interval_s: float = Field(300.0, gt=0, description="Every function is reconciled at least this often; "
                                                             "between resyncs only those where something may be "
                                                             "decided (dilu/policy/visits.py)")
    worker_ttl_s: float = Field(5.0, gt=0, description="A worker silent this long is lost, unless it or one of its "
                                                       "instances still answers (dilu/policy/worker_loss.py)")
    worker_lost_after_s: float = Field(60.0, gt=0, le=3600, description="A worker silent this long is lost even "
                                                                        "though it or its instances answer")
    cold_start_default_s: float = Field(2.0, ge=0, description="Assumed cold start of a version never started yet")
    profiling: bool = Field(True, description="Profile functions whose spec does not pin a slice")
    profile_trial_s: float = Field(0.5, gt=0, description="Least time per profiling trial (inference trials "
                                                          "also run at least 100 requests)")
    horizontal_interval_s: float = Field(1.0, gt=0)
    horizontal_window: int = Field(60, ge=1)
    horizontal_out_samples: int = Field(20, ge=1)
    horizontal_in_samples: int = Field(60, ge=1)
    horizontal_trend: bool = Field(True, description="Scale out at once when a second is over capacity and "
                                                    "the backlog grew (false: only after out_samples)")
    keepalive_min_samples: int = Field(10, ge=1, description="Idle times before the histogram is trusted")
    keepalive_min_unload_s: float = Field(10.0, ge=0, description="Unload only if the instance would stay "
                                                                   "unloaded this long (shorter is not worth a start)")
    keepalive_request_worth_gb_s: float = Field(50.0, ge=0, description="Idle memory (GB x s) worth one request "
                                                "not delayed by a cold start: an idle instance is held while "
                                                "its memory until the expected next request is worth less "
                                                "than the requests a cold start would delay (0: off)")


def parse_range(text: str) -> tuple[int, int]:
    """``FIRST-LAST`` (inclusive); ValueError naming the problem (root, or an empty range)."""
    first_text, _, last_text = text.partition("-")
    if not (first_text.strip().isdigit() and last_text.strip().isdigit()):
        raise ValueError(f"uid range {text!r}: use FIRST-LAST, such as 300000-999999")
    first, last = int(first_text), int(last_text)
    if first < 1000 or last < first or last >= 2**31 - 1:
        raise ValueError(f"uid range {text!r}: needs 1000 <= FIRST <= LAST < 2147483647 (never root or "
                         "a system user)")
    return first, last


class WorkerSettings(CommonSettings):
    """One worker agent (one GPU, or the CPU)."""

    host: str = Field("127.0.0.1", description="Address the worker API and its instances listen on")
    port: int = Field(8081, ge=0, le=65535, description="Worker API port of the first device (0: any free port)")
    advertise_host: str | None = Field(
        None, description="Address other hosts reach this worker and its instances at; the listen address "
                          "when it is a specific one, else this host's name")
    runtime: str = Field("process", description="Runtime backend: process (child processes) or docker "
                                                "(one container per instance)")
    docker_image: str = Field("dilu/runtime-cpu:latest", description="Function runtime image of CPU instances")
    docker_gpu_image: str = Field("dilu/runtime-cuda:latest", description="Function runtime image of GPU instances")
    docker_user: str = Field("auto", description="uid:gid every instance container runs as (never root); auto: "
                                                 "one uid per function, from DILU_INSTANCE_UIDS")
    uid_registry: Path | None = Field(None, description="Where a host records which uid each function has "
                                                        "(/var/lib/dilu/instance-uids.json when unset)")
    instance_env_pass: str = Field("", max_length=2000, description="Names (comma-separated) of worker environment "
                                                                    "variables instances may also see (beyond the "
                                                                    "allow-list: PATH, locale, CUDA_*, ...)")
    instance_runtime_memory: int = Field(256 * 2**20, ge=0, le=2**40, description=(
        "Memory an instance may hold beyond its resources.memory, for the interpreter and its libraries "
        "(bytes, or 256Mi, 1Gi): past both the kernel kills it, and its error names the limit"))
    instance_pids: int = Field(1024, ge=16, le=1_000_000, description="Processes and threads one instance may "
                                                                     "have at once")
    stream_stall_s: float = Field(30.0, gt=0, le=3600, description="A stream whose caller reads none of its "
                                                                   "waiting chunks for this long is ended at the "
                                                                   "instance (it stops being stepped sooner)")
    docker_read_only: bool = Field(True, description="Read-only root filesystem for instance containers "
                                                     "(a tmpfs at /tmp)")
    heartbeat_s: float = Field(1.0, gt=0)
    worker_ttl_s: float = Field(5.0, gt=0)
    health_poll_s: float = Field(0.02, gt=0,
                                 description="Health-check period of starting instances (on the cold-start path)")
    stop_grace_s: float = Field(5.0, ge=0, description="SIGTERM to SIGKILL delay: the least an instance being "
                                                       "stopped is given")
    drain_s: float = Field(120.0, ge=0, le=86400,
                           description="How long an instance being scaled in, updated or deleted may finish the "
                                       "requests and streams it serves (it ends at once when it serves none); a "
                                       "function's max_stream_s replaces it")
    startup_timeout_s: float = Field(300.0, gt=0, description="Instance load must finish within this")
    python: str | None = Field(None, description="Interpreter for instances; this one when unset")
    spare_processes: int = Field(1, ge=0, le=16, description="Runtime pool: the least instance processes kept "
                                                              "started and imported, so CPU cold starts skip "
                                                              "interpreter start-up and common imports")
    spare_max: int = Field(3, ge=0, le=16, description="Runtime pool: the most spares (one more per spare taken "
                                                       "in the last minute)")
    spare_preload: str = Field("torch", max_length=500, description="Modules (comma-separated) spares may import "
                                                                    "while they wait, each only while a function "
                                                                    "whose code imports it runs here; empty: none")
    spare_preload_keep_s: float = Field(900.0, ge=0, le=86400,
                                        description="How long spares that preload a module (torch) are kept after "
                                                    "the last instance that needed it ended")
    gpus: str | None = Field(None, description="'none' forces a CPU worker; otherwise all GPUs found")
    worker_name: str | None = Field(None, description="Prefix of this host's worker ids; the hostname when unset")
    fake_gpus: int = Field(0, ge=0, le=16,
                           description="Simulated GPUs (fake driver + real shim), for machines without one")
    fake_ns_per_block: int = Field(1000, gt=0, description="Device time of one block on a simulated GPU")
    fake_gpu_sched: Literal["timeslice", "fifo"] = Field(
        "timeslice", description="How a simulated GPU runs its processes' kernels: timeslice (one process at a "
                                 "time, as a GPU without MPS) or fifo (one queue for all)")
    isolation: bool = Field(True, description="Hold batch instances' launches on a GPU while a latency instance "
                                              "serves a request, and bound their unfinished work (false: "
                                              "token-rate control alone)")
    isolation_window_us: float = Field(300.0, gt=0, le=100_000, description="Device time a batch instance may "
                                                                          "have queued beside latency work")
    mps: Literal["off", "on"] = Field(
        "off", description="on: GPU instances are clients of the host's running MPS control daemon; batch "
                           "instances at below-normal priority with their limit as active-thread percentage")
    mps_pipe_dir: Path | None = Field(None, description="The MPS control daemon's pipe folder "
                                                        "(CUDA's default, /tmp/nvidia-mps, when unset)")
    token_feedback: bool = Field(True, description="Correct each instance's token rate from the device time NVML "
                                                  "measures per process (closed loop); false: open-loop on the "
                                                  "calibrated capacity")
    token_manager: Literal["process", "thread"] = Field(
        "process", description="Where each GPU's token manager runs: its own process (no other work can stall "
                               "its period loop), or a thread of the worker (for comparison)")
    token_capacity: float | None = Field(
        None, gt=0, description="Blocks per second a whole GPU runs (token budget at share 1.0); "
                                "exact for simulated GPUs, calibrate for real ones")
    shim_dir: Path | None = Field(None, description="Folder with the built libdilu_shim.so; shim/build when unset")

    @field_validator("runtime")
    @classmethod
    def _known_runtime(cls, value: str) -> str:
        if value not in {"process", "docker"}:
            raise ValueError(f"unknown runtime {value!r}; known: process, docker")
        return value

    @field_validator("instance_runtime_memory", mode="before")
    @classmethod
    def _runtime_memory(cls, value: Any) -> int:
        return 0 if value in (0, "0") else parse_memory(value)

    @field_validator("docker_user")
    @classmethod
    def _not_root(cls, value: str) -> str:
        uid = value.partition(":")[0]
        if uid in ("", "0", "root"):
            raise ValueError("instances never run as root: set a user or uid:gid other than root")
        return value

    @property
    def effective_advertise_host(self) -> str:
        """Where other hosts reach this worker: never a wildcard address."""
        if self.advertise_host:
            return self.advertise_host
        if self.host in ("0.0.0.0", "::", ""):
            return socket.getfqdn()
        return self.host


def _default_local_roots() -> str:
    """`dilu up` accepts local paths under the folder it was started in and the examples."""
    examples = Path(__file__).resolve().parent.parent / "examples"
    return ":".join(str(p) for p in (Path.cwd(), examples) if p.is_dir())


class AllInOneSettings(GatewaySettings, ControllerSettings, WorkerSettings):
    """`dilu up`: every role in one process. The gateway's host and port win."""

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    local_roots: str = Field(default_factory=_default_local_roots,
                             description="Folders deploys by local path may name (default: the current "
                                         "folder and the examples)")


class CliSettings(BaseSettings):
    """The CLI only needs to know where the gateway is."""

    model_config = SettingsConfigDict(env_prefix="DILU_", extra="ignore")

    url: str = "http://127.0.0.1:8080"
    api_key: str | None = Field(None, description="Sent as 'Authorization: Bearer <key>' to the gateway")
    max_bundle_bytes: int = Field(200 * 1024 * 1024, gt=0, description="Largest code bundle dilu deploy uploads")
