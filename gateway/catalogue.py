"""The function catalogue: each deployed function's spec (typed) and status, as this gateway
knows them, refreshed on events and periodically by ``gateway.services``."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from dilu.db import repo
from dilu.messages import FunctionStatus
from dilu.spec import SpecModel
from gateway.routing import RoutingTable


@dataclass(frozen=True)
class FunctionEntry:
    name: str
    version: int
    status: str
    error: str | None
    spec: dict[str, Any]
    cold_start_s: float | None = None   # the current version's loading stages, summed (None: never started)

    @functools.cached_property
    def model(self) -> SpecModel:
        """The spec, typed; read once per version (entries are replaced, never changed)."""
        return SpecModel.model_validate(self.spec)



class FunctionCache:
    """Specs and statuses of deployed functions, refreshed on events and periodically."""

    def __init__(self, sessions: sessionmaker[Session], routing: RoutingTable) -> None:
        self._sessions = sessions
        self._routing = routing
        self._entries: dict[str, FunctionEntry] = {}
        self.on_gone: list[Callable[[str], None]] = []    # told of each function that is deleted

    def get(self, name: str) -> FunctionEntry | None:
        return self._entries.get(name)

    def names(self) -> list[str]:
        return list(self._entries)

    def _load(self, name: str | None) -> list[FunctionEntry]:
        with self._sessions() as session:
            rows = ([repo.get_function(session=session, name=name)] if name
                    else repo.list_functions(session=session))
            cold = repo.loading_totals(session=session)
            return [FunctionEntry(r.name, r.version, r.status, r.error, r.spec, cold.get((r.name, r.version)))
                    for r in rows if r is not None]

    async def refresh(self, name: str | None = None) -> None:
        """Reloads one function (or all) from the database."""
        entries = await asyncio.to_thread(self._load, name)
        found = {entry.name: entry for entry in entries}
        gone = ([name] if name and name not in found else
                [] if name else [n for n in self._entries if n not in found])
        for missing in gone:
            self._entries.pop(missing, None)
            self._routing.forget(missing)
            for tell in self.on_gone:
                tell(missing)
        for entry in entries:
            self._entries[entry.name] = entry
            self._routing.set_failure(entry.name, entry.error if entry.status == FunctionStatus.FAILED else None)
