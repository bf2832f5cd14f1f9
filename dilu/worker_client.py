"""How the controller and gateway reach a worker: one protocol, in-process or over HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import httpx

from dilu.failures import describe
from dilu.fencing import TERM_HEADER
from dilu.messages import InstanceStatus, StartInstance
from dilu.slices import ComputeSlice

T = TypeVar("T")
# Calls a healthy worker answers in milliseconds (lists, slices): a hung one must not hold callers.
QUICK_CALL_S = 2.0


class WorkerUnavailable(Exception):
    """The worker could not be reached or refused the call."""


class WorkerClient(Protocol):
    async def start_instance(self, request: StartInstance) -> InstanceStatus:
        """Starts the instance; idempotent per instance id."""

    async def stop_instance(self, instance_id: str) -> None:
        """Stops the instance gracefully; idempotent, unknown ids are ignored."""

    async def list_instances(self) -> list[InstanceStatus]:
        """Every instance the worker knows, including recently ended ones."""

    async def read_logs(self, instance_id: str, tail: int = 200) -> str:
        """The last ``tail`` lines of the instance's log ('' if none)."""

    async def set_slice(self, instance_id: str, compute: ComputeSlice) -> bool:
        """Resizes a running GPU instance's compute slice; False if it is not running there."""

    async def info(self) -> dict:
        """The worker's identity and its runtime pool (``runtime_pool``: None without one)."""


class InProcessWorkerClient:
    """For `dilu up`: calls the agent directly, on the event loop the agent runs on (``loop``;
    None: the caller's own). The gateway's loop reaches an agent on the control thread's loop
    this way, and a caller that is cancelled cancels the call there."""

    def __init__(self, agent: WorkerClient, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._agent = agent   # a WorkerAgent: it answers as a client does
        self._loop = loop

    async def _on_agent_loop(self, call: Callable[[], Awaitable[T]]) -> T:
        if self._loop is None or self._loop is asyncio.get_running_loop():
            return await call()
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_awaited(call), self._loop))

    async def start_instance(self, request: StartInstance) -> InstanceStatus:
        return await self._on_agent_loop(lambda: self._agent.start_instance(request))

    async def stop_instance(self, instance_id: str) -> None:
        await self._on_agent_loop(lambda: self._agent.stop_instance(instance_id))

    async def list_instances(self) -> list[InstanceStatus]:
        return await self._on_agent_loop(self._agent.list_instances)

    async def read_logs(self, instance_id: str, tail: int = 200) -> str:
        return await self._on_agent_loop(lambda: self._agent.read_logs(instance_id, tail))

    async def set_slice(self, instance_id: str, compute: ComputeSlice) -> bool:
        return await self._on_agent_loop(lambda: self._agent.set_slice(instance_id, compute))

    async def info(self) -> dict:
        async def describe_agent() -> dict:
            return self._agent.describe()   # a WorkerAgent's own view

        return await self._on_agent_loop(describe_agent)


async def _awaited(call: Callable[[], Awaitable[T]]) -> T:
    return await call()


class HttpWorkerClient:
    """For roles on different hosts: the worker's HTTP API (worker/api.py)."""

    def __init__(self, base_url: str, http: httpx.AsyncClient, cluster_key: str | None = None,
                 term: int | None = None) -> None:
        self._base = base_url.rstrip("/")
        self._http = http
        # Sent per call, never as the shared client's default: that client also reaches instances.
        self._headers = {"authorization": f"Bearer {cluster_key}"} if cluster_key else {}
        if term is not None:      # a leading controller's calls (dilu.fencing)
            self._headers[TERM_HEADER] = str(term)

    async def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = await self._http.request(method, self._base + path, headers=self._headers, **kwargs)
        except httpx.HTTPError as exc:   # a timeout's own message is empty: its type says what happened
            raise WorkerUnavailable(f"worker at {self._base} unreachable: {describe(exc)}") from exc
        if response.status_code >= 400:
            raise WorkerUnavailable(f"worker at {self._base} answered {response.status_code}: {response.text}")
        return response

    async def info(self) -> dict:
        return (await self._call("GET", "/v1/info")).json()

    async def start_instance(self, request: StartInstance) -> InstanceStatus:
        response = await self._call("POST", "/v1/instances", json=request.to_dict())
        return InstanceStatus.from_dict(response.json())

    async def stop_instance(self, instance_id: str) -> None:
        # Stopping waits for the grace period, so allow for it.
        await self._call("DELETE", f"/v1/instances/{instance_id}", timeout=60.0)

    async def list_instances(self) -> list[InstanceStatus]:
        response = await self._call("GET", "/v1/instances", timeout=QUICK_CALL_S)
        return [InstanceStatus.from_dict(item) for item in response.json()]

    async def read_logs(self, instance_id: str, tail: int = 200) -> str:
        response = await self._call("GET", f"/v1/instances/{instance_id}/logs", params={"tail": tail})
        return response.text

    async def set_slice(self, instance_id: str, compute: ComputeSlice) -> bool:
        response = await self._call("PUT", f"/v1/instances/{instance_id}/slice",
                                    json=compute.to_wire(), timeout=QUICK_CALL_S)
        return bool(response.json()["applied"])


class WorkerDirectory:
    """Finds the client for a worker: the in-process agent when local, else its HTTP API."""

    def __init__(self, http: httpx.AsyncClient, cluster_key: str | None = None, term: int | None = None) -> None:
        self._http = http
        self._cluster_key = cluster_key
        self._local: dict[str, WorkerClient] = {}
        self.term = term   # a leading controller's: its calls to workers carry it

    def with_term(self, term: int) -> WorkerDirectory:
        """The same workers, reached by the controller leading in ``term``."""
        directory = WorkerDirectory(self._http, self._cluster_key, term)
        directory._local = self._local
        return directory

    def register_local(self, worker_id: str, client: WorkerClient) -> None:
        self._local[worker_id] = client

    @property
    def local(self) -> frozenset[str]:
        """The workers in this process (``dilu up``'s own)."""
        return frozenset(self._local)

    @property
    def http(self) -> httpx.AsyncClient:
        """The shared client for workers and instances (no credentials of its own)."""
        return self._http

    def client_for(self, worker_id: str, url: str | None) -> WorkerClient | None:
        if worker_id in self._local:
            return self._local[worker_id]
        if url:
            return HttpWorkerClient(url, self._http, self._cluster_key, self.term)
        return None
