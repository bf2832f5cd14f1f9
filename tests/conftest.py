"""Shared fixtures: tier markers by folder, real PostgreSQL and Redis for the tiers that use them."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURE_FUNCTIONS = Path(__file__).resolve().parent / "fixtures" / "functions"
POSTGRES_ADMIN_URL = os.environ.get("DILU_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("DILU_TEST_REDIS", "redis://127.0.0.1:6379/0")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = Path(str(item.fspath)).relative_to(Path(__file__).parent).parts[0]
        if tier in {"unit", "integration", "e2e", "gpu"}:
            item.add_marker(getattr(pytest.mark, tier))


@pytest.fixture
def postgres_url() -> str:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    from sqlalchemy import create_engine, text

    name = f"dilu_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    url = POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    yield url
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def redis_prefix() -> str:
    """A key prefix no other test uses; its keys are removed afterwards."""
    import redis

    prefix = f"dilu-test-{uuid.uuid4().hex[:10]}:"
    yield prefix
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(match=prefix + "*"))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def instance_visible_dir():
    """A folder instance processes can read and write (pytest's own temp folders are 0700, a
    root worker's instances run as other users, and each has a /tmp of its own, so the folder
    lives under /run when the tests run as root): for files a test shares with functions."""
    import os
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="dilu-test-shared-", dir="/run" if os.geteuid() == 0 else None))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
