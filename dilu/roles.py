"""Running the roles: all in one process (`dilu up`) or each alone (gateway, controller, worker)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import uvicorn

from dilu.config import AllInOneSettings, ControllerSettings, GatewaySettings, WorkerSettings
from dilu.controller.reconciler import Reconciler
from dilu.db.engine import make_engine, make_session_factory, migrate
from dilu.default_impl import create_backend, create_http_client, create_scheduler, create_store, worker_id
from dilu.messages import WorkerInfo
from dilu.policy.isolation import IsolationParams
from gateway.app import create_asgi
from gateway.origin import is_loopback
from gateway.services import GatewayServices
from worker.agent import WorkerAgent
from worker.backends.base import endpoint_url
from worker.bundles import BundleCache
from worker.api import create_worker_api
from dilu.worker_client import InProcessWorkerClient, WorkerDirectory
from worker.devices import discover_devices
from worker.shimlib import ShimUnavailable, shim_paths
from worker.tokens.control import GpuControl
from worker.tokens.mps import MpsSetup

log = logging.getLogger(__name__)
OnReady = Callable[[str, str | None], Awaitable[None]]   # (HTTP URL, gRPC address or None)
# Idle client connections are kept longer than clients keep them (httpx and many others: 5 s), so
# a client never sends on a connection the gateway is closing at that moment (the request would
# fail with no reply); 75 s as common proxies do.
KEEP_ALIVE_S = 75
CLOSE_TIMEOUT_S = 5.0     # closing a client (HTTP, state store) while stopping
STOP_WITHIN_S = 15.0      # a stopping controller ends within this, whatever is still in flight


def exit_within(seconds: float) -> None:
    """Ends the process ``seconds`` from now if it has not ended by then: a role told to stop
    must stop, even with a call stuck in a thread that cancelling cannot reach (the event loop
    waits for those threads when it closes). Says so in the log."""
    def watchdog() -> None:
        time.sleep(seconds)
        log.warning("still stopping after %.0f s (a call in flight has not returned); exiting", seconds)
        logging.shutdown()
        os._exit(0)

    threading.Thread(target=watchdog, name="stop-watchdog", daemon=True).start()


class StartupError(Exception):
    """A role cannot start (for example, its port is taken); the message is for the user."""


def listen(host: str, port: int) -> socket.socket:
    """Binds the listening socket up front, so a taken port is a clear error, not a traceback."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family = infos[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


async def _serve(server: uvicorn.Server, sock: socket.socket, host: str, on_ready: OnReady | None,
                 background: list[asyncio.Task], services_of: Callable[[], GatewayServices] | None = None,
                 settings: GatewaySettings | None = None) -> None:
    """Runs uvicorn until it exits (Ctrl-C or SIGTERM), with ``background`` tasks beside it; a
    gateway (``services_of`` and ``settings`` given) also serves the inference protocol over gRPC."""
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if serving.done():
            await serving  # re-raises a bind error
            return
        await asyncio.sleep(0.05)
    grpc_server, grpc_address = None, None
    if services_of is not None and settings is not None and settings.grpc_port >= 0:
        from gateway.v2.grpc_service import start_grpc

        try:
            grpc_server, port = await start_grpc(settings.host, settings.grpc_port, services_of,
                                                 settings.max_request_bytes)
        except OSError as exc:
            server.should_exit = True
            await serving
            raise StartupError(f"{exc}; set DILU_GRPC_PORT to a free port, 0 for any, or -1 for no gRPC") from None
        grpc_address = f"{host}:{port}"
    if on_ready is not None:
        await on_ready(f"http://{host}:{sock.getsockname()[1]}", grpc_address)
    try:
        await serving
    finally:
        if grpc_server is not None:
            await grpc_server.stop(grace=5)
        for task in background:
            task.cancel()
        for task in background:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def _gpu_control(settings: WorkerSettings, device, run_dir: Path) -> GpuControl | None:  # noqa: ANN001
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


def _make_agents(settings: WorkerSettings, store, sessions, url_for=None) -> list[WorkerAgent]:  # noqa: ANN001
    try:
        backend = create_backend(settings)
    except RuntimeError as exc:
        raise StartupError(str(exc)) from None
    bundles = BundleCache(sessions=sessions, cache_dir=settings.home / "bundles", max_bytes=settings.max_bundle_bytes)
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
            health_poll_s=settings.health_poll_s, stop_grace_s=settings.stop_grace_s,
            startup_timeout_s=settings.startup_timeout_s, gpu=_gpu_control(settings, device, run_dir), bundles=bundles))
    return agents


def check_exposure(settings: GatewaySettings, sessions) -> None:  # noqa: ANN001
    """A gateway on which no key was ever made is open: allowed on a loopback address (said in
    the log), refused on any other (anyone who reaches it could run code on the workers). A
    platform whose keys were all revoked stays closed (``dilu keys reopen`` opens it)."""
    from dilu.db import repo

    with sessions() as session:
        keys = bool(settings.admin_key) or repo.key_ever_made(session=session)
    if keys:
        return
    if not is_loopback(settings.host):
        raise StartupError(f"the gateway would listen on {settings.host}, reachable from other machines, and "
                           "no API key exists: set DILU_ADMIN_KEY (24+ characters), or create a key with "
                           "`dilu keys create NAME --scope admin` against a gateway on 127.0.0.1 first")
    log.warning("no API keys: the gateway is open to anyone who can reach %s (loopback only); "
                "`dilu keys create admin --scope admin` turns authentication on", settings.host)


async def run_all_in_one(settings: AllInOneSettings, on_ready: OnReady | None = None) -> None:
    """`dilu up`: gateway, controller and one worker per device in this process."""
    sock = listen(settings.host, settings.port)
    settings.home.mkdir(parents=True, exist_ok=True)
    url = settings.effective_database_url
    await asyncio.to_thread(migrate, url)
    engine = make_engine(url)
    sessions = make_session_factory(engine)
    await asyncio.to_thread(check_exposure, settings, sessions)
    store = create_store(settings)
    http = create_http_client()
    directory = WorkerDirectory(http, settings.cluster_key)
    agents = _make_agents(settings, store, sessions)
    await asyncio.gather(*(agent.adopt() for agent in agents))
    for agent in agents:
        directory.register_local(agent.info.id, InProcessWorkerClient(agent))
    reconciler = Reconciler(sessions=sessions, store=store, directory=directory,
                            scheduler=create_scheduler(settings.scheduler), settings=settings)

    async def build() -> GatewayServices:
        return GatewayServices(settings=settings, sessions=sessions, store=store, directory=directory, http=http)

    app = create_asgi(build)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False,
                                           timeout_graceful_shutdown=10, timeout_keep_alive=KEEP_ALIVE_S))
    background = [asyncio.create_task(agent.run()) for agent in agents]
    background.append(asyncio.create_task(reconciler.run()))
    try:
        await _serve(server, sock, settings.host, on_ready, background, app.services_of, settings)
    finally:
        await reconciler.shutdown()
        await asyncio.gather(*(agent.shutdown() for agent in agents), return_exceptions=True)
        await http.aclose()
        await store.close()
        engine.dispose()


async def run_gateway(settings: GatewaySettings, on_ready: OnReady | None = None) -> None:
    sock = listen(settings.host, settings.port)
    engine = make_engine(settings.effective_database_url)
    sessions = make_session_factory(engine)
    try:
        await asyncio.to_thread(check_exposure, settings, sessions)
    except StartupError:
        engine.dispose()
        raise
    store = create_store(settings)
    http = create_http_client()

    async def build() -> GatewayServices:
        return GatewayServices(settings=settings, sessions=sessions, store=store,
                               directory=WorkerDirectory(http, settings.cluster_key), http=http)

    app = create_asgi(build)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False,
                                           timeout_graceful_shutdown=10, timeout_keep_alive=KEEP_ALIVE_S))
    try:
        await _serve(server, sock, settings.host, on_ready, [], app.services_of, settings)
    finally:
        await http.aclose()
        await store.close()
        engine.dispose()


async def run_controller(settings: ControllerSettings) -> None:
    engine = make_engine(settings.effective_database_url)
    store = create_store(settings)
    http = create_http_client()
    reconciler = Reconciler(sessions=make_session_factory(engine), store=store,
                            directory=WorkerDirectory(http, settings.cluster_key),
                            scheduler=create_scheduler(settings.scheduler), settings=settings)
    try:
        await reconciler.run()
    finally:
        exit_within(STOP_WITHIN_S)
        await reconciler.shutdown()
        # Bounded: a connection left half-open by a state store outage must not keep a stopping
        # controller alive.
        for closing in (http.aclose(), store.close()):
            with contextlib.suppress(Exception, asyncio.TimeoutError):
                await asyncio.wait_for(closing, CLOSE_TIMEOUT_S)
        engine.dispose()


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
    agents = _make_agents(settings, store, sessions,
                          url_for=lambda i: endpoint_url(advertised, socks[i].getsockname()[1]))
    await asyncio.gather(*(agent.adopt() for agent in agents))
    try:
        await asyncio.to_thread(_register, sessions, [agent.info for agent in agents])
    except Exception as exc:  # noqa: BLE001 - the controller registers it from heartbeats too
        log.warning("could not register the worker in the database: %s", exc)
    servers = [uvicorn.Server(uvicorn.Config(create_worker_api(agent, settings.cluster_key), log_level="warning",
                                             access_log=False))
               for agent in agents]
    background = [asyncio.create_task(agent.run()) for agent in agents]
    background += [asyncio.create_task(server.serve(sockets=[sock])) for server, sock in zip(servers[1:], socks[1:])]
    try:
        await _serve(servers[0], socks[0], advertised, on_ready, background)
    finally:
        await asyncio.gather(*(agent.shutdown() for agent in agents), return_exceptions=True)
        await store.close()
        engine.dispose()


def _register(sessions, infos: list[WorkerInfo]) -> None:  # noqa: ANN001
    """Records the workers and their devices at once (the controller keeps them alive from
    heartbeats), so placement sees a new host before its first heartbeat is read."""
    from dilu.db import repo
    from dilu.db.models import utcnow

    with sessions() as session:
        repo.upsert_workers(session=session, workers=infos, now=utcnow())


def examples_dir() -> Path | None:
    """The repository's examples folder (present in a clone or an editable install)."""
    candidate = Path(__file__).resolve().parent.parent / "examples"
    return candidate if candidate.is_dir() else None
