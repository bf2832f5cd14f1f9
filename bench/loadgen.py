"""A lean closed-loop HTTP/1.1 load generator for the benchmarks.

Each simulated client holds one keep-alive connection and sends its next request as soon as
the previous reply is complete. It parses only the status line and Content-Length (matched by
its whole name: ``Inference-Header-Content-Length`` is another header), so on a
small machine it leaves the CPU to the servers being measured (a full client library spent
more CPU per request than the no-op function it was measuring).
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from urllib.parse import urlsplit


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self._buffer = bytearray()
        self._waiter: asyncio.Future[int] | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self._buffer[:end])
        length = content_length(head)
        if len(self._buffer) < end + 4 + length:
            return
        status = int(head[9:12])
        del self._buffer[:end + 4 + length]
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(status)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionError(f"connection closed: {exc}"))

    async def send(self, request: bytes) -> int:
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return await self._waiter


def content_length(head: bytes) -> int:
    """The Content-Length of a reply's head (the header named exactly so, any case); 0 without one."""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0


def build_request(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[str, int, bytes]:
    """(host, port, the request's bytes): a POST of ``body``, JSON unless ``headers`` say otherwise."""
    parts = urlsplit(url)
    fields = {"Host": parts.netloc, "Content-Type": "application/json", **(headers or {}),
              "Content-Length": str(len(body))}
    head = f"POST {parts.path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items()) + "\r\n"
    return parts.hostname, parts.port or 80, head.encode() + body


async def closed_loop(url: str, body: bytes, clients: int, seconds: float,
                      headers: dict[str, str] | None = None) -> list[float]:
    """Latencies (s) of every request completed by ``clients`` callers within ``seconds``."""
    host, port, request = build_request(url, body, headers)
    loop = asyncio.get_running_loop()
    latencies: list[float] = []

    async def caller() -> None:
        _, connection = await loop.create_connection(_Connection, host, port)
        try:
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                status = await connection.send(request)
                if status != 200:
                    raise RuntimeError(f"{url} answered HTTP {status}")
                latencies.append(time.perf_counter() - started)
        finally:
            connection.transport.close()

    deadline = time.perf_counter() + seconds
    await asyncio.gather(*(caller() for _ in range(clients)))
    return latencies


async def fixed_count(url: str, body: bytes, clients: int, total: int, reply_timeout_s: float,
                      outcomes: list[tuple[float, float, int]]) -> None:
    """Sends ``total`` requests from ``clients`` closed-loop callers, appending (sent, answered,
    status) per request to ``outcomes`` as they complete (monotonic seconds). Status -1: no reply
    within ``reply_timeout_s`` or the connection broke; the caller then reconnects."""
    host, port, request = build_request(url, body)
    loop = asyncio.get_running_loop()
    left = [total]

    async def caller() -> None:
        connection = None
        while left[0] > 0:
            left[0] -= 1
            started = time.monotonic()
            try:
                if connection is None:
                    _, connection = await loop.create_connection(_Connection, host, port)
                status = await asyncio.wait_for(connection.send(request), reply_timeout_s)
            except (TimeoutError, OSError, ConnectionError):
                status = -1
                if connection is not None:
                    connection.transport.close()
                connection = None
            outcomes.append((started, time.monotonic(), status))
        if connection is not None:
            connection.transport.close()

    await asyncio.gather(*(caller() for _ in range(clients)))


NOOP_SPEC = ("name: noop\nhandler: handler:Echo\n"
             "resources:\n  memory: 128Mi\n  gpu: false\n  sm_request: 1.0\n  sm_limit: 1.0\n"
             "scaling:\n  min_instances: 1\n  max_instances: 1\n  keep_alive_s: 3600\n"
             "batching:\n  max_batch_size: 1\n")


def noop_function(examples: Path, workdir: Path) -> Path:
    """The no-op benches' function: examples/echo copied into ``workdir``, one warm instance
    pinned to the whole host, no batching; returns its model.yaml."""
    source = shutil.copytree(examples / "echo", workdir / "noop")
    (source / "model.yaml").write_text(NOOP_SPEC)
    return source / "model.yaml"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
