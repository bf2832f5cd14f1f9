"""Waiting on a condition (polling with a deadline), never on a fixed sleep."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(check: Callable[[], T], timeout: float = 60.0, interval: float = 0.05, what: str = "") -> T:
    """Calls ``check`` until it returns a truthy value; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except AssertionError as exc:
            last_error = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or check}: {last_error}")


async def async_eventually(check: Callable[[], Awaitable[T]], timeout: float = 60.0, interval: float = 0.05,
                           what: str = "") -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await check()
        if value:
            return value
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or check}")
