"""`dilu up` says what it kept from earlier runs (functions, failures, API keys), so state in
its home never carries over silently."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CarriedState:
    functions: int
    failed: tuple[str, ...]
    keys: int


def read_carried_state(database_url: str) -> CarriedState | None:
    """What the platform's database holds before this run starts; None when there is no database
    yet (a first run) or it cannot be read as it is (an older schema: migrating comes next)."""
    from sqlalchemy.exc import SQLAlchemyError

    from dilu.db import repo
    from dilu.db.engine import make_engine, make_session_factory

    if database_url.startswith("sqlite:///") and not Path(database_url.removeprefix("sqlite:///")).exists():
        return None
    engine = make_engine(database_url)
    try:
        with make_session_factory(engine)() as session:
            functions = repo.list_functions(session=session)
            keys = repo.list_keys(session=session)
    except SQLAlchemyError:
        return None
    finally:
        engine.dispose()
    return CarriedState(len(functions), tuple(sorted(f.name for f in functions if f.status == "failed")), len(keys))


MAX_NAMED = 5


def carried_state_lines(state: CarriedState | None, home: Path) -> list[str]:
    """The lines `dilu up` prints about ``state`` (none for a first or empty run)."""
    if state is None or (state.functions == 0 and state.keys == 0):
        return []
    parts = [f"{state.functions} function(s)"] if state.functions else []
    if state.failed:
        named = ", ".join(state.failed[:MAX_NAMED]) + (", ..." if len(state.failed) > MAX_NAMED else "")
        parts.append(f"{len(state.failed)} of them failed before ({named}): deployed again now")
    if state.keys:
        parts.append(f"{state.keys} API key(s): authentication is on, so the CLI needs DILU_API_KEY")
    return [f"kept from earlier runs in {home}: " + "; ".join(parts),
            f"to start afresh, stop Dilu and remove {home}, or run it with DILU_HOME=<another folder>"]
