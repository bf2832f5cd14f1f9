"""What each surface of the gateway needs of its composition, as protocols: a surface names the
narrowest one, so it reaches nothing else (``gateway.services.GatewayServices`` satisfies them
all, and only the composition names it)."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, Protocol

from sqlalchemy.orm import Session, sessionmaker

from dilu.config import GatewaySettings
from dilu.state.base import Channel, StateStore
from dilu.worker_client import WorkerDirectory
from gateway.activity import ActivityRecorder
from gateway.auth import Authenticator
from gateway.catalogue import FunctionCache
from gateway.invocation import Invoker
from gateway.routing import RoutingTable
from gateway.streams import StreamTimes


class Stored(Protocol):
    """The database."""

    @property
    def sessions(self) -> sessionmaker[Session]: ...


class Models(Protocol):
    """What serves a model: the function catalogue and the invoker."""

    @property
    def functions(self) -> FunctionCache: ...

    @property
    def invoker(self) -> Invoker: ...


class StoredModels(Models, Stored, Protocol):
    """Models, and the database (a classifier's labels file lives in a function's code)."""


class GuardedModels(StoredModels, Protocol):
    """A protocol surface that checks keys and reads its own bodies (v2 over REST and gRPC, the
    OpenAI routes)."""

    @property
    def auth(self) -> Authenticator: ...

    @property
    def settings(self) -> GatewaySettings: ...


class Control(Stored, Protocol):
    """The platform's own API: functions, workflows, workers, the system's state."""

    @property
    def settings(self) -> GatewaySettings: ...

    @property
    def functions(self) -> FunctionCache: ...

    @property
    def routing(self) -> RoutingTable: ...

    @property
    def store(self) -> StateStore: ...

    @property
    def directory(self) -> WorkerDirectory: ...

    @property
    def scheduler(self) -> Any: ...

    @property
    def stream_times(self) -> StreamTimes: ...

    @property
    def gateway_id(self) -> str: ...

    async def notify(self, channel: Channel, message: dict[str, Any]) -> None: ...


class WorkflowHost(Models, Protocol):
    """What runs workflows in this gateway: invocations, routing, activity and demand."""

    @property
    def settings(self) -> GatewaySettings: ...

    @property
    def routing(self) -> RoutingTable: ...

    @property
    def activity(self) -> ActivityRecorder: ...

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> Any: ...

    async def demand(self, function: str) -> None: ...

    async def wake_controller(self) -> None: ...

    async def flush_activity(self) -> None: ...
