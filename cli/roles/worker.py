"""The worker role: one agent per device of this host, each starting and watching instances."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from cli.roles.serving import OnReady, StartupError, http_server, listen, serve
from dilu.addresses import is_loopback
from dilu.artifacts import ArtifactStore
from dilu.config import WorkerSettings, parse_range
from dilu.db.engine import make_engine, make_session_factory
from dilu.default_impl import create_store
from dilu.messages import DeviceInfo, WorkerInfo
from dilu.policy.isolation import IsolationParams
from dilu.state.base import StateStore
from worker.agent import WorkerAgent
from worker.api import create_worker_api
from worker.artifacts import ArtifactCache
from worker.backends.base import endpoint_url
from worker.bundles import BundleCache
from worker.devices import discover_devices, worker_id
from worker.runtime import create_backend
from worker.shimlib import ShimUnavailable, shim_paths
from worker.tokens.control import GpuControl
from worker.tokens.mps import MpsSetup

log = logging.getLogger(__name__)


def _gpu_control(settings: WorkerSettings, device: DeviceInfo, run_dir: Path) -> GpuControl | None:
    """The token manager and shim injection of a GPU worker; None on the CPU."""
    if device.kind != "gpu":
        return None
    try:
        shim = shim_paths(settings.shim_dir)
    except ShimUnavailable as exc:
        log.warning("%s: instances on %s run without the kernel-token shim", exc, device.uuid)
        return None
    control = GpuControl(device=device, shim=shim, run_dir=run_dir,
                         capacity_per_s=settings.token_capacity, fake_ns_per_block=settings.fake_ns_per_block,
                         in_process=settings.token_manager == "thread", feedback=settings.token_feedback,
                         isolation=IsolationParams(window_s=settings.isolation_window_us / 1e6)
                         if settings.isolation else None,
                         fake_sched=settings.fake_gpu_sched,
                         mps=MpsSetup(settings.mps_pipe_dir) if settings.mps == "on" else None)
    control.start()
    return control


def make_agents(settings: WorkerSettings, store: StateStore, sessions: sessionmaker[Session],
                url_for: Callable[[int], str] | None = None) -> list[WorkerAgent]:
    """One agent per device, sharing one runtime backend and bundle cache."""
    try:
        backend = create_backend(settings)
    except RuntimeError as exc:
        raise StartupError(str(exc)) from None
    bundles = BundleCache(sessions=sessions, cache_dir=settings.home / "bundles", max_bytes=settings.max_bundle_bytes)
    artifacts = ArtifactCache(store=ArtifactStore(settings.effective_artifact_store),
                              cache_dir=settings.home / "artifact-cache")
    several_users = backend.shared_dir is not None or (settings.runtime == "docker" and settings.docker_user == "auto")
    if settings.mps == "on" and several_users:
        raise StartupError("DILU_MPS=on, but this worker runs each function as a user of its own, and an MPS "
                           "server serves one user at a time (another user's instance would wait for every "
                           "client of the first to exit): run the worker as an ordinary user (or docker "
                           "instances as one DILU_DOCKER_USER), or leave DILU_MPS off")
    # Token-manager sockets where every instance can reach them (instances of a root worker run
    # as another user, who cannot enter the worker's home).
    run_dir = backend.shared_dir or settings.home / "run"
    agents = []
    for position, device in enumerate(discover_devices(settings.gpus, settings.fake_gpus)):
        info = WorkerInfo(id=worker_id(device, settings.worker_name), host=settings.effective_advertise_host,
                          url=url_for(position) if url_for else None, device=device)
        agents.append(WorkerAgent(
            info=info, backend=backend, store=store, logs_dir=settings.logs_dir,
            heartbeat_s=settings.heartbeat_s, worker_ttl_s=settings.worker_ttl_s,
            health_poll_s=settings.health_poll_s, stop_grace_s=settings.stop_grace_s, drain_s=settings.drain_s,
            stop_drain_s=settings.stop_drain_s,
            startup_timeout_s=settings.startup_timeout_s, gpu=_gpu_control(settings, device, run_dir), bundles=bundles,
            artifacts=artifacts))
    return agents


async def run_worker(settings: WorkerSettings, on_ready: OnReady | None = None) -> None:
    """One agent per device, each with its HTTP API on ``port``, ``port + 1``, ... (or each on a
    free port with ``port`` 0), registered in the database with the address others reach it at."""
    if not settings.cluster_key and not is_loopback(settings.host):
        raise StartupError(f"the worker would listen on {settings.host}, reachable from other machines, without "
                           "DILU_CLUSTER_KEY: anyone could start code on it. Set the same DILU_CLUSTER_KEY "
                           "(24+ characters) on every role")
    devices = len(discover_devices(settings.gpus, settings.fake_gpus))
    socks = [listen(settings.host, settings.port + i if settings.port else 0) for i in range(devices)]
    engine = make_engine(settings.effective_database_url)
    sessions = make_session_factory(engine)
    store = create_store(settings)
    advertised = settings.effective_advertise_host
    agents = make_agents(settings, store, sessions,
                         url_for=lambda i: endpoint_url(advertised, socks[i].getsockname()[1]))
    await asyncio.gather(*(agent.adopt() for agent in agents))
    try:
        await asyncio.to_thread(_register, sessions, [agent.info for agent in agents])
    except Exception as exc:  # noqa: BLE001 - the controller registers it from heartbeats too
        log.warning("could not register the worker in the database: %s", exc)
    # Its instances run as these uids only when it is root; then an open API refuses them.
    instance_uids = parse_range(settings.instance_uids) if os.geteuid() == 0 else None
    servers = [http_server(create_worker_api(agent, settings.cluster_key, instance_uids)) for agent in agents]
    background = [asyncio.create_task(agent.run()) for agent in agents]
    background += [asyncio.create_task(server.serve(sockets=[sock])) for server, sock in zip(servers[1:], socks[1:],
                                                                                             strict=True)]
    try:
        await serve(servers[0], socks[0], advertised, on_ready, background)
    finally:
        await asyncio.gather(*(agent.shutdown() for agent in agents), return_exceptions=True)
        await store.close()
        engine.dispose()


def _register(sessions: sessionmaker[Session], infos: list[WorkerInfo]) -> None:
    """Records the workers and their devices at once (the controller keeps them alive from
    heartbeats), so placement sees a new host before its first heartbeat is read."""
    from dilu.db import repo
    from dilu.db.models import utcnow

    with sessions() as session:
        repo.upsert_workers(session=session, workers=infos, now=utcnow())
