"""The controllers' lease in the database: acquire, renew, release, read, and the fence check.

Times are the database's own clock (Unix seconds), so controllers on hosts whose clocks differ
agree on when a lease ends. Each statement is a single conditional UPDATE (or the INSERT of the
first lease): two candidates racing for an expired lease cannot both win, because the row is
locked by the first UPDATE and the second re-reads its condition after it commits.
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, literal_column, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from dilu.db.models import LeaseRow
from dilu.fencing import Deposed

CONTROLLER = "controller"


def _now(session: Session) -> ColumnElement[float]:
    """The database's clock in Unix seconds, as an SQL expression."""
    if session.get_bind().dialect.name == "postgresql":
        return literal_column("extract(epoch from clock_timestamp())::float8")
    return literal_column("((julianday('now') - 2440587.5) * 86400.0)")


def database_now(*, session: Session) -> float:
    return float(session.execute(select(_now(session))).scalar_one())


def try_acquire(*, session: Session, holder: str, ttl_s: float, name: str = CONTROLLER) -> int | None:
    """Takes the lease if it is free (released, expired or never held): the new term, else None."""
    now = _now(session)
    result = session.execute(
        update(LeaseRow).where(LeaseRow.name == name, (LeaseRow.expires_at <= now) | (LeaseRow.holder == ""))
        .values(holder=holder, term=LeaseRow.term + 1, acquired_at=now, expires_at=now + ttl_s)
        .returning(LeaseRow.term))
    term = result.scalar_one_or_none()
    if term is not None:
        session.commit()
        return int(term)
    if session.get(LeaseRow, name) is not None:
        session.rollback()
        return None
    at = database_now(session=session)
    session.add(LeaseRow(name=name, holder=holder, term=1, acquired_at=at, expires_at=at + ttl_s))
    try:
        session.commit()
    except IntegrityError:      # another candidate made the first lease
        session.rollback()
        return None
    return 1


def renew(*, session: Session, holder: str, term: int, ttl_s: float, name: str = CONTROLLER) -> bool:
    """Extends the lease held in ``term``; False if it is no longer this holder's."""
    now = _now(session)
    renewed = session.execute(
        update(LeaseRow).where(LeaseRow.name == name, LeaseRow.holder == holder, LeaseRow.term == term)
        .values(expires_at=now + ttl_s).returning(LeaseRow.term)).scalar_one_or_none()
    session.commit()
    return renewed is not None


def release(*, session: Session, holder: str, term: int, name: str = CONTROLLER) -> None:
    """Gives the lease up at once (a stopping leader), keeping its term for the next to raise."""
    session.execute(update(LeaseRow).where(LeaseRow.name == name, LeaseRow.holder == holder, LeaseRow.term == term)
                    .values(holder="", expires_at=0.0))
    session.commit()


def read(*, session: Session, name: str = CONTROLLER) -> tuple[LeaseRow | None, float]:
    """The lease row (None if never held) and the database's clock now."""
    return session.get(LeaseRow, name), database_now(session=session)


def check_term(session: Session, term: int, name: str = CONTROLLER) -> None:
    """Raises ``Deposed`` unless ``term`` is the lease's term. Run inside the transaction of a
    write, just before its commit: on PostgreSQL the row is share-locked until then, so a
    takeover waits for this write or this write sees the takeover, never both."""
    current = session.execute(select(LeaseRow.term).where(LeaseRow.name == name)
                              .with_for_update(read=True)).scalar_one_or_none()
    if current != term:
        raise Deposed(term, current)
