"""Every table comes from Alembic: the migrated schema equals the models (an empty autogenerate
diff) on SQLite and on PostgreSQL, and migrating twice changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine

from dilu.db.engine import migrate
from dilu.db.models import Base


def schema_diff(url: str) -> list:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True,
                                                                   "compare_server_default": False})
            return compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_migrated_schema_matches_the_models(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    url = f"sqlite:///{tmp_path / 'dilu.db'}" if backend == "sqlite" else request.getfixturevalue("postgres_url")
    migrate(url)
    migrate(url)   # idempotent
    assert schema_diff(url) == []
