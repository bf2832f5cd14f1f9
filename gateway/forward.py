"""Forwarding an invocation to an instance over pooled keep-alive connections.

All aiohttp use lives here. The gateway's hot path uses aiohttp rather than httpx because
httpx's connection pool collapses under concurrency: against one no-op instance, 32 concurrent
callers got about 330 req/s through httpx and about 5,800 req/s through aiohttp on the same
machine (see bench/gateway_overhead.py and the project notes).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

import aiohttp

from dilu.instance_protocol import LOADING_HEADER

PASSED_HEADERS = ("x-dilu-batch-size", "x-dilu-latency-ms", "x-dilu-instance", LOADING_HEADER)


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    content_type: str
    headers: dict[str, str]


class NotDelivered(Exception):
    """The connection could not be made: the instance never saw the request (safe to retry)."""


class InstanceFailed(Exception):
    """The connection broke after the request was sent: the instance may have seen it."""


class InstanceTimeout(Exception):
    """The instance did not answer in time."""


class Forwarder:
    def __init__(self, max_connections: int = 1024) -> None:
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=0,
                                         keepalive_timeout=60, enable_cleanup_closed=True,
                                         family=socket.AF_INET)
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                              skip_auto_headers=("User-Agent",))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def post(self, url: str, body: bytes, timeout_s: float, content_type: str = "application/json") -> Reply:
        assert self._session is not None, "Forwarder.start() was not awaited"
        try:
            async with self._session.post(url, data=body, headers={"content-type": content_type},
                                          timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
                content = await response.read()
                headers = {key: response.headers[key] for key in PASSED_HEADERS if key in response.headers}
                return Reply(response.status, content, response.headers.get("content-type", "application/json"),
                             headers)
        except aiohttp.ClientConnectorError as exc:
            raise NotDelivered(str(exc)) from exc
        except TimeoutError as exc:
            raise InstanceTimeout(str(exc)) from exc
        except aiohttp.ClientError as exc:
            raise InstanceFailed(type(exc).__name__) from exc
