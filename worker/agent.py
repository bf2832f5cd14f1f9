"""The worker agent: owns one device, starts and stops instances, watches them, heartbeats.

It reports what it observes (instance states) and never decides how many instances a function
should have; that is the controller's job.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from dilu.failures import FailureLog
from dilu.instance_protocol import ERROR_MARKER, EXIT_LOAD_FAILED
from dilu.loading import stages_from_marks
from dilu.messages import FAILED, READY, STARTING, STOPPED, STOPPING, InstanceStatus, StartInstance, WorkerInfo
from dilu.slices import ComputeSlice
from dilu.state.base import Channel, StateStore
from worker.backends.base import RunningInstance, RuntimeBackend

if TYPE_CHECKING:   # built by the role that runs the agent, passed in
    from worker.artifacts import ArtifactCache
    from worker.bundles import BundleCache
    from worker.tokens.control import GpuControl

log = logging.getLogger(__name__)
ENDED_RETENTION_S = 600.0
STOP_WAIT_S = 20.0   # a stop call returns after this; a longer drain goes on (the instance shows as stopping)
PROGRESS_TIMEOUT_S = 0.5


@dataclass
class _Instance:
    request: StartInstance
    running: RunningInstance | None
    state: str = STARTING
    error: str | None = None
    exit_code: int | None = None
    was_ready: bool = False
    started_at: float = field(default_factory=time.monotonic)
    requested_at: float = field(default_factory=time.time)   # wall clock, to compare with the instance's marks
    startup: dict[str, float] | None = None   # seconds per loading stage (dilu.loading), once ready
    fetched_at: float | None = None   # wall clock: when the weights artifact was in the host's cache
    ended_at: float | None = None
    state_since: float = field(default_factory=time.time)   # wall clock: when the worker saw the state begin
    slice: ComputeSlice = ComputeSlice(0.0, 1.0)   # what applies once the instance is ready
    progress: tuple[float, float] | None = None   # (units, at) last read from a batch-class instance
    progress_per_s: float | None = None

    @property
    def cls(self) -> str:
        return self.request.spec.get("class", "latency")

    def status(self) -> InstanceStatus:
        return InstanceStatus(
            instance_id=self.request.instance_id, function=self.request.function,
            version=self.request.version, state=self.state,
            endpoint=self.running.endpoint if self.running else None, error=self.error,
            pid=self.running.pid if self.running else None, exit_code=self.exit_code,
            was_ready=self.was_ready, startup=self.startup, changed_at=self.state_since)


def read_log_tail(path: Path, lines: int) -> str:
    """The last ``lines`` lines of a log file ('' if it does not exist)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - 256 * 1024))
            data = handle.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(data.splitlines()[-lines:]) if lines > 0 else data


def describe_exit(code: int, log_tail: str) -> str:
    """A user-readable reason for an instance that ended by itself."""
    for line in reversed(log_tail.splitlines()):
        if line.startswith(ERROR_MARKER):
            return line[len(ERROR_MARKER):]
    if code == EXIT_LOAD_FAILED:
        return "handler failed to load (see dilu logs)"
    if code < 0:
        return f"instance process was killed by signal {-code}"
    return f"instance process exited with status {code}"


class WorkerAgent:
    """Implements the worker side of WorkerClient for one device."""

    def __init__(self, *, info: WorkerInfo, backend: RuntimeBackend, store: StateStore, logs_dir: Path,
                 heartbeat_s: float = 1.0, worker_ttl_s: float = 5.0, health_poll_s: float = 0.1,
                 stop_grace_s: float = 5.0, drain_s: float = 0.0, stop_drain_s: float = 0.0,
                 startup_timeout_s: float = 300.0,
                 gpu: GpuControl | None = None, bundles: BundleCache | None = None,
                 artifacts: ArtifactCache | None = None) -> None:
        self.info = info
        self._bundles = bundles  # BundleCache: where uploaded code is fetched from (None: local paths only)
        self._artifacts = artifacts   # ArtifactCache: where weights come from (None: functions without them)
        self._gpu = gpu  # GpuControl on GPU workers: token manager and shim injection
        self._backend = backend
        self._store = store
        self._logs_dir = logs_dir
        self._heartbeat_s = heartbeat_s
        self._ttl_s = worker_ttl_s
        self._poll_s = health_poll_s
        self._grace_s = stop_grace_s
        self._drain_s = drain_s
        self._stop_drain_s = stop_drain_s
        self._draining: set[asyncio.Task[None]] = set()
        self._startup_timeout_s = startup_timeout_s
        self._instances: dict[str, _Instance] = {}
        self._http = httpx.AsyncClient(timeout=2.0)
        self._publish_failures = FailureLog(log, "publishing instance changes")
        # The runtime pool this device's instances start from (plain, or under the shim).
        self._pool_env = gpu.injected_at_start() if gpu is not None else {}
        backend.prepare_pool(self._pool_env)

    def log_path(self, instance_id: str) -> Path:
        return self._logs_dir / f"{instance_id}.log"

    async def start_instance(self, request: StartInstance) -> InstanceStatus:
        """Starts an instance; idempotent for an instance id it already knows."""
        known = self._instances.get(request.instance_id)
        if known is not None:
            return known.status()
        record = _Instance(request=request, running=None, slice=request.compute)
        self._instances[request.instance_id] = record
        try:
            if request.bundle:
                request = record.request = dataclasses.replace(request,
                                                               source_dir=str(await self._code_folder(request)))
            if request.spec.get("weights"):
                request = record.request = dataclasses.replace(request,
                                                               weights_path=str(await self._weights(request)))
                # The startup timeout bounds the instance's own load; a large first fetch is its own stage.
                record.fetched_at, record.started_at = time.time(), time.monotonic()
            extra_env = None
            if self._gpu is not None:
                extra_env = self._gpu.admit(request, *self._backend.token_peer(request))
                # Loading (imports, weights, warm-up) runs unthrottled: the slice applies once ready.
                self._gpu.set_slice(request.instance_id, record.cls, ComputeSlice(record.slice.request, 1.0))
            record.running = await self._backend.start(request, self.info.device,
                                                       self.log_path(request.instance_id), extra_env,
                                                       owner=self.info.id)
        except RuntimeError as exc:
            self._end(record, FAILED, str(exc))
        except Exception as exc:  # a bug here must fail the instance, not the order
            log.exception("starting %s failed", request.instance_id)
            self._end(record, FAILED, f"the worker could not start the instance: {type(exc).__name__}: {exc}")
        log.info("instance %s of %s starting at %s", request.instance_id, request.function,
                 record.running.endpoint if record.running else "-")
        await self._changed(record)
        return record.status()

    async def _code_folder(self, request: StartInstance) -> str:
        if self._bundles is None:
            raise RuntimeError("this worker has no database to fetch code bundles from")
        return await self._bundles.folder(request.bundle)

    async def _weights(self, request: StartInstance) -> Path:
        if self._artifacts is None:
            raise RuntimeError("this worker has no artifact store to fetch weights from")
        return await self._artifacts.path(request.spec["weights"])

    async def adopt(self) -> int:
        """Takes over the instances a previous run of this worker left running (containers);
        they are probed like starting ones and reported ready again. Returns how many. Called
        before the worker serves or heartbeats, so the controller never sees it without them."""
        try:
            adopted = await self._backend.adopt(self.info.id, self.log_path)
        except Exception:
            log.exception("could not adopt the instances of an earlier run")
            return 0
        for request, running in adopted:
            record = _Instance(request=request, running=running, was_ready=True,
                               slice=request.compute)
            self._instances[request.instance_id] = record
            if self._gpu is not None:
                # The shim re-registers with the new token manager, at the same socket path.
                self._gpu.admit(request, *self._backend.token_peer(request))
            log.info("adopted instance %s of %s at %s", request.instance_id, request.function, running.endpoint)
        # Probed at once, so a serving instance is reported ready from the first listing on
        # (reporting it as starting would take it out of the routes until the next probe).
        await asyncio.gather(*(self._probe_startup(self._instances[r.instance_id], time.monotonic())
                               for r, _ in adopted))
        return len(adopted)

    def _log_tail(self, record: _Instance, lines: int) -> str:
        kept = self._backend.logs(record.running, lines) if record.running is not None else None
        return kept if kept is not None else read_log_tail(self.log_path(record.request.instance_id), lines)

    async def stop_instance(self, instance_id: str, drain: bool = True, bound_s: float | None = None) -> None:
        """Stops gracefully: SIGTERM, on which the instance takes no new connection and ends once
        what it serves is done, then SIGKILL after the grace time. With ``drain`` (scale-in,
        updates, deletes) the grace is the function's ``max_stream_s`` or the worker's
        ``drain_s``, so streams in flight can finish; returns after at most STOP_WAIT_S while
        the drain goes on; ``bound_s`` caps that drain (the worker itself stopping). Idempotent."""
        record = self._instances.get(instance_id)
        if record is None or record.state in (STOPPED, FAILED, STOPPING):
            return
        record.state, record.state_since = STOPPING, time.time()
        await self._changed(record)
        drain_s = (record.request.spec.get("max_stream_s") or self._drain_s) if drain else 0.0
        grace = max(self._grace_s, drain_s if bound_s is None else min(drain_s, bound_s))
        task = asyncio.create_task(self._stop(record, grace))
        self._draining.add(task)
        task.add_done_callback(self._draining.discard)
        await asyncio.wait({task}, timeout=STOP_WAIT_S if drain and bound_s is None else None)

    async def _stop(self, record: _Instance, grace_s: float) -> None:
        if record.running is not None:
            await self._backend.stop(record.running, grace_s)
        self._end(record, STOPPED, None)
        await self._changed(record)

    async def list_instances(self) -> list[InstanceStatus]:
        return [record.status() for record in self._instances.values()]

    async def set_slice(self, instance_id: str, compute: ComputeSlice) -> bool:
        """Resizes an instance's compute slice (effective within two token periods); a starting
        instance keeps loading unthrottled and gets the new slice when it is ready."""
        record = self._instances.get(instance_id)
        if record is None or record.state not in (STARTING, READY):
            return False
        if self._gpu is None and not self._backend.enforces_shares:
            return False  # nothing can enforce a CPU share here
        record.slice = compute
        return record.state == STARTING or self._apply_slice(record)

    def _apply_slice(self, record: _Instance) -> bool:
        if self._gpu is None:
            return self._backend.set_share(record.request.instance_id,
                                           record.slice.limit)  # CPU workers: a share of the cores
        self._gpu.set_slice(record.request.instance_id, record.cls, record.slice)
        return True

    def telemetry(self) -> dict:
        """Per instance: the token manager's view (GPU workers) and the progress rate of
        batch-class instances (any worker)."""
        views = self._gpu.telemetry() if self._gpu is not None else {}
        for instance_id, record in self._instances.items():
            if record.progress_per_s is not None and record.state == READY:
                views[instance_id] = {**views.get(instance_id, {}), "progress_per_s": record.progress_per_s,
                                      "progress_units": record.progress[0]}
        return views

    async def _read_progress(self) -> None:
        """Samples each ready batch-class instance's reported progress (once per heartbeat), all
        at once and briefly, so a stuck instance cannot delay the worker's heartbeats."""
        async def one(record: _Instance) -> None:
            try:
                reply = (await self._http.get(record.running.endpoint + "/progress", timeout=PROGRESS_TIMEOUT_S)).json()
                sample = (float(reply["units"]), float(reply["at"]))
            except (httpx.HTTPError, ValueError, KeyError, TypeError):
                return
            if record.progress is not None and sample[1] > record.progress[1]:
                record.progress_per_s = max(0.0, (sample[0] - record.progress[0]) / (sample[1] - record.progress[1]))
            record.progress = sample

        await asyncio.gather(*(one(r) for r in list(self._instances.values())
                               if r.state == READY and r.cls == "batch" and r.running is not None))

    async def read_logs(self, instance_id: str, tail: int = 200) -> str:
        record = self._instances.get(instance_id)
        if record is not None and record.state not in (STOPPED, FAILED):
            return await asyncio.to_thread(self._log_tail, record, tail)
        return read_log_tail(self.log_path(instance_id), tail)

    async def run(self) -> None:
        """Heartbeats and watches instances until cancelled. A failing heartbeat is retried at
        the heartbeat period (not every poll) and logged once, then as a count."""
        last_beat = 0.0
        loop = asyncio.get_running_loop()
        beats, checks = FailureLog(log, f"heartbeat of {self.info.id}"), FailureLog(log, "checking instances")
        while True:
            if loop.time() - last_beat >= self._heartbeat_s:
                last_beat = loop.time()
                try:
                    await self._store.heartbeat(self.info, self._ttl_s)
                    await self._read_progress()
                    await self._store.report_telemetry(self.info.id, self.telemetry(), self._ttl_s)
                    self._backend.maintain()
                    beats.succeeded()
                except Exception as exc:  # noqa: BLE001 - retried at the next period
                    beats.failed(exc)
            try:   # one failed pass must not end the loop: the worker would stop heartbeating for good
                await self.check_instances()
                checks.succeeded()
            except Exception as exc:  # noqa: BLE001 - one failed pass must not end the loop
                checks.failed(exc)
            await asyncio.sleep(self._poll_s)

    async def check_instances(self) -> None:
        """One pass over every instance: exits, readiness, start-up timeouts."""
        now = time.monotonic()
        starting: list[_Instance] = []
        for record in list(self._instances.values()):
            if record.state in (STOPPED, FAILED):
                if record.ended_at is not None and now - record.ended_at > ENDED_RETENTION_S:
                    del self._instances[record.request.instance_id]
                continue
            if record.running is None or record.state == STOPPING:
                continue
            code = self._backend.exit_code(record.running)
            if code is not None:
                tail = await asyncio.to_thread(self._log_tail, record, 50)
                record.exit_code = code
                reason = self._backend.exit_reason(record.running, record.request.memory_bytes)
                self._end(record, FAILED, reason or describe_exit(code, tail))
                log.warning("instance %s of %s ended: %s", record.request.instance_id,
                            record.request.function, record.error)
                await self._changed(record)
            elif record.state == STARTING:
                starting.append(record)
        # All at once: each probe may wait up to the client's timeout for a server still coming
        # up, and probing one after another would hold the heartbeat back for all of them.
        await asyncio.gather(*(self._probe_startup(record, now) for record in starting))

    async def _probe_startup(self, record: _Instance, now: float) -> None:
        try:
            response = await self._http.get(record.running.endpoint + "/health")
            healthy = response.status_code == 200
        except httpx.HTTPError:
            healthy = False
        if healthy:
            try:
                marks = response.json().get("startup") or {}
                if isinstance(marks, dict) and record.fetched_at is not None:
                    marks["fetched"] = record.fetched_at
                record.startup = stages_from_marks(record.requested_at, marks) if isinstance(marks, dict) else None
            except (ValueError, AttributeError):
                record.startup = None   # an instance that answers no marks still serves
            record.state, record.was_ready, record.state_since = READY, True, time.time()
            self._apply_slice(record)
            await self._changed(record)
        elif now - record.started_at > self._startup_timeout_s:
            await self._backend.stop(record.running, self._grace_s)
            self._end(record, FAILED, f"instance did not become ready within {self._startup_timeout_s:.0f}s")
            await self._changed(record)

    def _end(self, record: _Instance, state: str, error: str | None) -> None:
        record.state, record.error, record.ended_at, record.state_since = state, error, time.monotonic(), time.time()
        if self._gpu is not None:
            self._gpu.release(record.request.instance_id)
        self._backend.release(record.request.instance_id)

    async def _changed(self, record: _Instance) -> None:
        try:
            await self._store.publish(Channel.INSTANCES, {
                "worker": self.info.id, "instance": record.request.instance_id, "state": record.state})
        except Exception as exc:  # noqa: BLE001 - the controller's pass sees the change anyway
            self._publish_failures.failed(exc)
        else:
            self._publish_failures.succeeded()

    async def _hurry(self, record: _Instance) -> None:
        if record.running is not None:
            await self._backend.stop(record.running, max(self._grace_s, self._stop_drain_s))

    def describe(self) -> dict:
        """The worker as ``/v1/info`` shows it: its identity, its runtime pool and (on a GPU) how
        regularly its token manager runs."""
        return {**self.info.to_dict(), "runtime_pool": self._backend.pool_status(self._pool_env),
                "token_manager": self._gpu.period_stats() if self._gpu is not None else None}

    async def shutdown(self) -> None:
        """Stops every instance (used when the worker itself stops): each takes no new request,
        hands the ones waiting for a slot to other instances, and finishes those it runs (its
        streams) for up to its ``max_stream_s`` (else ``drain_s``), within ``stop_drain_s``;
        the drains under way end within ``stop_drain_s`` too."""
        await asyncio.gather(*(self.stop_instance(iid, bound_s=self._stop_drain_s) for iid in list(self._instances)),
                             *(self._hurry(record) for record in self._instances.values() if record.state == STOPPING),
                             return_exceptions=True)
        await self._http.aclose()
        self._backend.close()
        if self._gpu is not None:
            self._gpu.stop()
