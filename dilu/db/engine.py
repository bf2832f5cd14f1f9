"""All SQLAlchemy engine and Session construction lives here, and the migration entry point."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from dilu.db import migrations

MIGRATIONS_DIR = Path(migrations.__file__).parent


def make_engine(url: str, idle_in_transaction_s: float | None = None) -> Engine:
    """An engine for ``url``; SQLite gets WAL and a busy timeout so roles can share one file.
    ``idle_in_transaction_s`` (PostgreSQL): the server ends a session that sits that long inside
    a transaction, releasing its locks (a controller paused mid-write must not hold up the one
    that takes over from it)."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:  # DBAPI types
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        return engine
    options = {}
    if idle_in_transaction_s is not None:
        options = {"options": f"-c idle_in_transaction_session_timeout={max(1, int(idle_in_transaction_s * 1000))}"}
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=10, connect_args=options)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def migrate(url: str) -> None:
    """Brings the schema at ``url`` to the newest migration (idempotent)."""
    if url.startswith("sqlite:///"):
        Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    command.upgrade(alembic_config(url), "head")
