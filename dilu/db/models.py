"""Database tables (the schema itself is created only by Alembic migrations)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, DateTime, Float, ForeignKey, Integer, LargeBinary, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from dilu.spec import FunctionSpec, spec_from_dict


def utcnow() -> datetime:
    return datetime.now(UTC)


class UtcDateTime(TypeDecorator):
    """Aware UTC datetimes on every backend (SQLite hands back naive values otherwise)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value


class Base(DeclarativeBase):
    pass


class FunctionRow(Base):
    """A deployed function; ``version`` grows with every redeploy."""

    __tablename__ = "functions"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, default=1)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)   # the canonical dict; ``typed_spec`` reads it
    source_dir: Mapped[str] = mapped_column(Text)   # a local folder (dilu up); "" for a bundle or an image
    bundle: Mapped[str | None] = mapped_column(String(71), ForeignKey("bundles.digest"), nullable=True)
    status: Mapped[str] = mapped_column(String(16), default="deploying")  # a dilu.messages.FunctionStatus
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    requests_total: Mapped[int] = mapped_column(BigInteger, default=0)

    @property
    def typed_spec(self) -> FunctionSpec:
        """The stored spec as the typed ``FunctionSpec`` it was validated into at deploy time
        (validated again once per spec object read, then cached on the row)."""
        cached = self.__dict__.get("_typed_spec")
        if cached is None or cached[0] is not self.spec:
            cached = (self.spec, spec_from_dict(self.spec))
            self.__dict__["_typed_spec"] = cached
        return cached[1]


class BundleRow(Base):
    """A function's code as uploaded (a .tar.gz), stored once per content digest."""

    __tablename__ = "bundles"

    digest: Mapped[str] = mapped_column(String(71), primary_key=True)   # "sha256:<64 hex>"
    size: Mapped[int] = mapped_column(BigInteger)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class ApiKeyRow(Base):
    """An API key: its id, a SHA-256 of its secret (the key itself is shown once) and its scopes."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    name: Mapped[str] = mapped_column(String(63))
    secret_hash: Mapped[str] = mapped_column(String(64))
    scopes: Mapped[list[str]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)


class LoadingStagesRow(Base):
    """Running estimates of a function version's loading stages (``dilu.loading``)."""

    __tablename__ = "loading_stages"

    function: Mapped[str] = mapped_column(String(63), ForeignKey("functions.name", ondelete="CASCADE"),
                                          primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    stages: Mapped[dict[str, Any]] = mapped_column(JSON)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class WorkflowRow(Base):
    """A workflow: a DAG of functions (``dilu.workflows.spec``), stored as written."""

    __tablename__ = "workflows"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, default=1)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class WorkerRow(Base):
    """A worker agent and the device it owns."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    url: Mapped[str | None] = mapped_column(Text, nullable=True)
    device_kind: Mapped[str] = mapped_column(String(8))  # gpu | cpu
    device_uuid: Mapped[str | None] = mapped_column(String(128), nullable=True)
    device_name: Mapped[str | None] = mapped_column(String(255), nullable=True)
    memory_bytes: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(16), default="alive")  # alive | lost
    last_seen: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class InstanceRow(Base):
    """One running (or finished) copy of a function on a worker."""

    __tablename__ = "instances"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    function: Mapped[str] = mapped_column(String(63), ForeignKey("functions.name", ondelete="CASCADE"), index=True)
    function_version: Mapped[int] = mapped_column(Integer)
    worker_id: Mapped[str] = mapped_column(String(128), index=True)
    # starting -> ready -> stopping -> stopped; failed (crashed or never loaded); lost (worker lost)
    state: Mapped[str] = mapped_column(String(16), default="starting")
    endpoint: Mapped[str | None] = mapped_column(Text, nullable=True)
    memory_bytes: Mapped[int] = mapped_column(BigInteger)
    sm_request: Mapped[float | None] = mapped_column(Float, nullable=True)
    sm_limit: Mapped[float | None] = mapped_column(Float, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    ready_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    ended_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    role: Mapped[str] = mapped_column(String(16), default="serve")  # serve | profile
    term: Mapped[int | None] = mapped_column(BigInteger, nullable=True)   # the leading controller's, when placed


class ProfileRow(Base):
    """What profiling found for one version of a function (or that it is still running)."""

    __tablename__ = "profiles"

    function: Mapped[str] = mapped_column(String(63), ForeignKey("functions.name", ondelete="CASCADE"),
                                          primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    status: Mapped[str] = mapped_column(String(16), default="running")  # running | done | failed
    kind: Mapped[str] = mapped_column(String(16), default="inference")
    sm_request: Mapped[float | None] = mapped_column(Float, nullable=True)
    sm_limit: Mapped[float | None] = mapped_column(Float, nullable=True)
    batch: Mapped[int | None] = mapped_column(Integer, nullable=True)
    throughput_per_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    latency_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    meets_slo: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    trials: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    batch_note: Mapped[str | None] = mapped_column(Text, nullable=True)   # why the batch is below the spec's bound
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class ScalingEventRow(Base):
    """Audit trail of every scaling decision, with its reason."""

    __tablename__ = "scaling_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    function: Mapped[str] = mapped_column(String(63), index=True)
    at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    action: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(Text)
    instance_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    term: Mapped[int | None] = mapped_column(BigInteger, nullable=True)   # the controller's term; None: a gateway's


class LeaseRow(Base):
    """Who leads the controllers (``dilu.db.lease``): the holder acts while ``expires_at`` (the
    database's clock, Unix seconds) is ahead; every takeover raises ``term``."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    holder: Mapped[str] = mapped_column(String(200))   # "" once released
    term: Mapped[int] = mapped_column(BigInteger)
    acquired_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)
