"""What every role's process shares: binding its port up front, serving until told to stop, and
stopping within a bound."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn
from starlette.types import ASGIApp

from cli.roles.gathered_writes import GatheredWritesHttp

log = logging.getLogger(__name__)
OnReady = Callable[[str, str | None], Awaitable[None]]   # (HTTP URL, gRPC address or None)
# Starts a server beside the HTTP one once that one is up: (its stop, its address).
Beside = Callable[[], Awaitable[tuple[Callable[[], Awaitable[None]], str]]]
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


class Server(uvicorn.Server):
    """A uvicorn server that says when it starts stopping: ``on_stop`` (each in turn) runs as
    soon as it is told to stop, before it waits for the connections still open."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.on_stop: list[Callable[[], None]] = []

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for callback in self.on_stop:
            callback()
        await super().shutdown(sockets)


def http_server(app: ASGIApp, **options: Any) -> Server:
    """A uvicorn server for ``app``, quiet (the roles log what matters themselves), whose
    connections send an answer's head and body in one write (``GatheredWritesHttp``)."""
    options.setdefault("http", GatheredWritesHttp)
    return Server(uvicorn.Config(app, log_level="warning", access_log=False, **options))


async def serve(server: Server, sock: socket.socket, host: str, on_ready: OnReady | None,
                background: list[asyncio.Task], beside: Beside | None = None) -> None:
    """Runs uvicorn until it exits (Ctrl-C or SIGTERM), with ``background`` tasks beside it, and
    the server ``beside`` starts once it is up (the gateway's gRPC; it stops alongside)."""
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if serving.done():
            await serving  # re-raises a bind error
            return
        await asyncio.sleep(0.05)
    stop_beside, address = None, None
    if beside is not None:
        try:
            stop_beside, address = await beside()
        except StartupError:
            server.should_exit = True
            await serving
            raise
    stopping_beside: list[asyncio.Task] = []
    if stop_beside is not None:
        server.on_stop.append(lambda: stopping_beside.append(asyncio.create_task(stop_beside())))
    if on_ready is not None:
        await on_ready(f"http://{host}:{sock.getsockname()[1]}", address)
    try:
        await serving
    finally:
        if stop_beside is not None:
            await (stopping_beside[0] if stopping_beside else stop_beside())
        for task in background:
            task.cancel()
        for task in background:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
