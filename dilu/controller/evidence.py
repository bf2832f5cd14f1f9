"""Whether a worker that missed its heartbeats still shows signs of life: its API or any of its
instances answers within a short deadline (asked in parallel)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import httpx


async def _answers(http: httpx.AsyncClient, url: str, timeout_s: float) -> bool:
    try:
        reply = await http.get(url, timeout=timeout_s)
    except httpx.HTTPError:
        return False
    return reply.status_code < 500 or reply.status_code == 503     # 503: loading, alive all the same


async def answering(http: httpx.AsyncClient, probes: dict[str, Iterable[str]], timeout_s: float) -> set[str]:
    """The workers (keys of ``probes``: worker id -> health URLs of it and its instances) of which
    at least one URL answers within ``timeout_s``."""
    async def alive(urls: Iterable[str]) -> bool:
        checks = [asyncio.ensure_future(_answers(http, url, timeout_s)) for url in urls]
        try:
            for check in asyncio.as_completed(checks):
                if await check:
                    return True
            return False
        finally:
            for check in checks:
                check.cancel()

    workers = list(probes)
    found = await asyncio.gather(*(alive(probes[w]) for w in workers))
    return {worker for worker, yes in zip(workers, found, strict=True) if yes}
