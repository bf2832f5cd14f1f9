"""Fixtures that start the whole platform."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.platform import Platform


@pytest.fixture
def start_platform(tmp_path: Path):
    """Factory: ``start_platform(env=..., demo=...)``; every platform is stopped after the test."""
    started: list[Platform] = []

    def start(env: dict[str, str] | None = None, demo: bool = False, name: str = "home") -> Platform:
        platform = Platform(tmp_path / name, env=env, demo=demo)
        started.append(platform)
        return platform

    yield start
    for platform in started:
        platform.close()


def backend_env(kind: str, request: pytest.FixtureRequest) -> dict[str, str]:
    """The embedded default, or PostgreSQL + Redis (switching is configuration only)."""
    if kind == "embedded":
        return {}
    from tests.conftest import REDIS_URL

    return {"DILU_DATABASE_URL": request.getfixturevalue("postgres_url"),
            "DILU_REDIS_URL": REDIS_URL, "DILU_REDIS_PREFIX": request.getfixturevalue("redis_prefix")}
