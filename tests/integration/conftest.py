"""Fixtures shared by the integration tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import inspect

from dilu.db.engine import make_engine, make_session_factory, migrate
from dilu.state.memory import MemoryStore
from dilu.state.redis_store import RedisStore
from tests.conftest import REDIS_URL


@pytest.fixture(params=["sqlite", "postgresql"])
def sessions(request: pytest.FixtureRequest, tmp_path: Path):
    """Sessions on a migrated SQLite file, then on the migrated PostgreSQL test database."""
    url = f"sqlite:///{tmp_path / 'db' / 'dilu.db'}" if request.param == "sqlite" \
        else request.getfixturevalue("postgres_url")
    migrate(url)
    migrate(url)  # idempotent
    engine = make_engine(url)
    assert {"functions", "instances", "workers", "scaling_events"} <= set(inspect(engine).get_table_names())
    yield make_session_factory(engine)
    engine.dispose()


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest):
    """The state store contract's two implementations: the in-process one and the real Redis."""
    if request.param == "memory":
        instance = MemoryStore()
    else:
        instance = RedisStore(REDIS_URL, request.getfixturevalue("redis_prefix"))
        await instance.ping()
    yield instance
    await instance.close()
