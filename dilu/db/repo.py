"""Repository functions: every database write goes through one of these (keyword-only)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, delete, func, or_, select, true, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from dilu.db.models import (
    ApiKeyRow,
    BundleRow,
    FunctionRow,
    InstanceRow,
    LoadingStagesRow,
    ProfileRow,
    ScalingEventRow,
    WorkerRow,
    WorkflowRow,
    utcnow,
)
from dilu.messages import ACTIVE_STATES, FunctionStatus, WorkerInfo
from dilu.spec import NAME_FRAGMENT_PATTERN


def create_key(*, session: Session, key_id: str, name: str, secret_hash: str, scopes: list[str]) -> ApiKeyRow:
    row = ApiKeyRow(id=key_id, name=name, secret_hash=secret_hash, scopes=scopes, created_at=utcnow())
    session.add(row)
    session.commit()
    return row


def list_keys(*, session: Session, include_revoked: bool = False) -> list[ApiKeyRow]:
    query = select(ApiKeyRow).order_by(ApiKeyRow.created_at)
    if not include_revoked:
        query = query.where(ApiKeyRow.revoked_at.is_(None))
    return list(session.scalars(query))


def key_ever_made(*, session: Session) -> bool:
    """Whether any key exists or ever existed (revoked rows are kept): once true, the platform
    stays closed until ``forget_revoked_keys``."""
    return session.scalar(select(ApiKeyRow.id).limit(1)) is not None


def forget_revoked_keys(*, session: Session) -> int:
    """Deletes the revoked keys, reopening a platform that has no active key; how many went.
    ValueError while an active key exists (a platform in use is not reopened by accident)."""
    if list_keys(session=session):
        raise ValueError("active keys exist: revoke them first (`dilu keys ls`, `dilu keys revoke ID`)")
    result = session.execute(delete(ApiKeyRow).where(ApiKeyRow.revoked_at.is_not(None)))
    session.commit()
    return result.rowcount


def revoke_key(*, session: Session, key_id: str) -> bool:
    """Revokes a key at once; False when no such active key."""
    result = session.execute(update(ApiKeyRow).where(ApiKeyRow.id == key_id, ApiKeyRow.revoked_at.is_(None))
                             .values(revoked_at=utcnow()))
    session.commit()
    return result.rowcount > 0


def put_bundle(*, session: Session, digest: str, data: bytes) -> bool:
    """Stores a bundle once; True when it was new (the caller checked the digest)."""
    if session.get(BundleRow, digest) is not None:
        return False
    session.add(BundleRow(digest=digest, size=len(data), data=data))
    try:
        session.commit()
    except IntegrityError:   # uploaded by someone else at the same moment: same bytes
        session.rollback()
        return False
    return True


def bundle_exists(*, session: Session, digest: str) -> bool:
    return session.scalar(select(BundleRow.digest).where(BundleRow.digest == digest)) is not None


def get_bundle_data(*, session: Session, digest: str) -> bytes | None:
    return session.scalar(select(BundleRow.data).where(BundleRow.digest == digest))


def upsert_function(*, session: Session, spec: dict, source_dir: str,
                    bundle: str | None = None) -> tuple[FunctionRow, bool]:
    """Creates the function or replaces its spec with a new version; returns (row, created).

    Safe under concurrent deploys of one name: the version is incremented in the database by one
    atomic UPDATE (the row is locked until commit), and a create that loses the race to another
    create becomes an update, so every caller gets a version that exists and versions have no gaps."""
    for _ in range(5):
        now = utcnow()
        version = session.execute(
            update(FunctionRow).where(FunctionRow.name == spec["name"])
            .values(version=FunctionRow.version + 1, spec=spec, source_dir=source_dir, bundle=bundle,
                    status=FunctionStatus.DEPLOYING.value, error=None, updated_at=now)
            .returning(FunctionRow.version)).scalar_one_or_none()
        if version is not None:
            session.commit()
            return _as_written(session, spec["name"], version, spec), False
        session.add(FunctionRow(name=spec["name"], version=1, spec=spec, source_dir=source_dir, bundle=bundle,
                                status=FunctionStatus.DEPLOYING.value, created_at=now, updated_at=now,
                                requests_total=0))
        try:
            session.commit()
        except IntegrityError:   # created by a concurrent deploy: update it instead
            session.rollback()
            continue
        return _as_written(session, spec["name"], 1, spec), True
    raise RuntimeError(f"could not write function {spec['name']!r} (concurrent deploys kept colliding)")


def _as_written(session: Session, name: str, version: int, spec: dict) -> FunctionRow:
    """The row as this call wrote it (a concurrent deploy may already have written a newer
    version), detached so that nothing flushes it back."""
    row = session.get(FunctionRow, name, populate_existing=True)
    session.expunge(row)
    row.version, row.spec = version, spec
    return row


def set_function_slice(*, session: Session, name: str, sm_request: float, sm_limit: float) -> FunctionRow | None:
    """Pins the compute slice of a function in place (vertical scaling: no new version)."""
    row = session.get(FunctionRow, name)
    if row is None:
        return None
    spec = dict(row.spec)
    spec["resources"] = {**spec["resources"], "sm_request": sm_request, "sm_limit": sm_limit}
    row.spec = spec  # a new object, so the JSON column is written
    session.commit()
    return row


def get_function(*, session: Session, name: str) -> FunctionRow | None:
    return session.get(FunctionRow, name)


def list_functions(*, session: Session) -> list[FunctionRow]:
    return list(session.scalars(select(FunctionRow).order_by(FunctionRow.name)))


def functions_page(*, session: Session, after: str | None, limit: int | None,
                   containing: str = "") -> list[FunctionRow]:
    """Up to ``limit`` functions (None: all) by name, those after ``after`` (keyset paging: a
    function that exists from the first page to the last is listed exactly once, whatever is
    added or deleted), and with ``containing`` only those whose name holds it."""
    query = _named_like(select(FunctionRow), containing).order_by(FunctionRow.name).limit(limit)
    if after is not None:
        query = query.where(FunctionRow.name > after)
    return list(session.scalars(query))


def count_functions(*, session: Session, containing: str = "") -> int:
    """How many functions there are (whose name holds ``containing``)."""
    return session.scalar(_named_like(select(func.count()).select_from(FunctionRow), containing)) or 0


def unsettled_functions(*, session: Session, limit: int, containing: str = "") -> list[FunctionRow]:
    """Up to ``limit`` functions not ready (deploying, profiling, failed), by name."""
    query = _named_like(select(FunctionRow), containing).where(FunctionRow.status != "ready")
    return list(session.scalars(query.order_by(FunctionRow.name).limit(limit)))


NAME_FRAGMENT = re.compile(NAME_FRAGMENT_PATTERN)


def _named_like(query: Any, containing: str) -> Any:
    if not containing:
        return query
    if not NAME_FRAGMENT.fullmatch(containing):   # a name's own characters only
        raise ValueError(f"cannot match function names on {containing!r}")
    return query.where(FunctionRow.name.contains(containing, autoescape=True))   # "_" is not LIKE's wildcard


MAX_NAMES_IN_QUERY = 500


def functions_named(*, session: Session, names: set[str]) -> list[FunctionRow]:
    """The functions of ``names`` (those that exist), by name."""
    if not names:
        return []
    query = select(FunctionRow).order_by(FunctionRow.name)
    if len(names) <= MAX_NAMES_IN_QUERY:
        query = query.where(FunctionRow.name.in_(sorted(names)))
    return [row for row in session.scalars(query) if row.name in names]


@dataclass
class FunctionDetails:
    """What a function's public view adds to its row, read for a page of functions at once."""

    instances: dict[str, list[InstanceRow]]
    profiles: dict[tuple[str, int], ProfileRow]
    loading: dict[tuple[str, int], dict]


def details_of(*, session: Session, functions: list[FunctionRow]) -> FunctionDetails:
    """The active instances, profiles and loading stages of ``functions`` in three queries (a
    page's names in the query; past ``MAX_NAMES_IN_QUERY``, every row, sorted out here)."""
    names = [f.name for f in functions]
    few = len(names) <= MAX_NAMES_IN_QUERY

    def of_these(column):  # noqa: ANN001, ANN202 - a column of one of the three tables
        return column.in_(names) if few else true()

    instances: dict[str, list[InstanceRow]] = {name: [] for name in names}
    for row in session.scalars(select(InstanceRow).where(of_these(InstanceRow.function),
                                                         InstanceRow.state.in_(ACTIVE_STATES | {"stopping"}))
                               .order_by(InstanceRow.created_at)):
        if row.function in instances:
            instances[row.function].append(row)
    wanted = {(f.name, f.version) for f in functions}
    profiles = {(p.function, p.version): p
                for p in session.scalars(select(ProfileRow).where(of_these(ProfileRow.function)))
                if (p.function, p.version) in wanted}
    loading = {(r.function, r.version): r.stages
               for r in session.scalars(select(LoadingStagesRow).where(of_these(LoadingStagesRow.function)))
               if (r.function, r.version) in wanted}
    return FunctionDetails(instances, profiles, loading)


def delete_function(*, session: Session, name: str) -> bool:
    row = session.get(FunctionRow, name)
    if row is None:
        return False
    session.execute(delete(InstanceRow).where(InstanceRow.function == name))
    session.delete(row)
    session.commit()
    return True


def set_function_status(*, session: Session, name: str, version: int, status: str,
                        error: str | None = None) -> bool:
    """Sets the status only if ``version`` is still current (a redeploy wins over stale news)."""
    result = session.execute(
        update(FunctionRow)
        .where(FunctionRow.name == name, FunctionRow.version == version)
        .values(status=status, error=error, updated_at=utcnow())
    )
    session.commit()
    return result.rowcount > 0


def add_request_counts(*, session: Session, counts: dict[str, int]) -> None:
    for name, count in counts.items():
        session.execute(update(FunctionRow).where(FunctionRow.name == name)
                        .values(requests_total=FunctionRow.requests_total + count))
    session.commit()


def upsert_workers(*, session: Session, workers: Iterable[WorkerInfo], now: datetime) -> None:
    """Records live workers (from heartbeats) as alive."""
    for info in workers:
        row = session.get(WorkerRow, info.id)
        if row is None:
            row = WorkerRow(id=info.id)
            session.add(row)
        row.host, row.url = info.host, info.url
        row.device_kind, row.device_uuid = info.device.kind, info.device.uuid
        row.device_name, row.memory_bytes = info.device.name, info.device.memory_bytes
        row.state, row.last_seen = "alive", now
    session.commit()


def mark_workers_lost(*, session: Session, worker_ids: Iterable[str], now: datetime) -> None:
    """Marks workers lost and their active instances lost with them."""
    ids = list(worker_ids)
    if not ids:
        return
    session.execute(update(WorkerRow).where(WorkerRow.id.in_(ids)).values(state="lost"))
    session.execute(
        update(InstanceRow)
        .where(InstanceRow.worker_id.in_(ids), InstanceRow.state.in_(ACTIVE_STATES | {"stopping"}))
        .values(state="lost", ended_at=now, error="worker lost")
    )
    session.commit()


def list_workers(*, session: Session) -> list[WorkerRow]:
    return list(session.scalars(select(WorkerRow).order_by(WorkerRow.id)))


def create_instance(*, session: Session, row: InstanceRow) -> InstanceRow:
    session.add(row)
    session.commit()
    return row


def update_instance(*, session: Session, instance_id: str, **values: object) -> None:
    session.execute(update(InstanceRow).where(InstanceRow.id == instance_id).values(**values))
    session.commit()


def get_instance(*, session: Session, instance_id: str) -> InstanceRow | None:
    return session.get(InstanceRow, instance_id)


def list_instances(*, session: Session, function: str | None = None,
                   active_only: bool = False) -> list[InstanceRow]:
    query = select(InstanceRow).order_by(InstanceRow.created_at)
    if function is not None:
        query = query.where(InstanceRow.function == function)
    if active_only:
        query = query.where(InstanceRow.state.in_(ACTIVE_STATES | {"stopping"}))
    return list(session.scalars(query))


def instances_page(*, session: Session, function: str, active_only: bool, after: tuple[datetime, str] | None,
                   limit: int | None) -> list[InstanceRow]:
    """Up to ``limit`` instances of ``function`` (None: all), oldest first, those after ``after``
    (the creation time and id the previous page ended on)."""
    query = select(InstanceRow).where(InstanceRow.function == function).order_by(
        InstanceRow.created_at, InstanceRow.id).limit(limit)
    if active_only:
        query = query.where(InstanceRow.state.in_(ACTIVE_STATES | {"stopping"}))
    if after is not None:
        query = query.where(or_(InstanceRow.created_at > after[0],
                                and_(InstanceRow.created_at == after[0], InstanceRow.id > after[1])))
    return list(session.scalars(query))


def instances_of(*, session: Session, functions: list[str]) -> dict[str, list[InstanceRow]]:
    """Every instance row (ended ones too) of ``functions``, oldest first, by function."""
    rows: dict[str, list[InstanceRow]] = {name: [] for name in functions}
    query = select(InstanceRow).order_by(InstanceRow.created_at)
    if len(functions) <= MAX_NAMES_IN_QUERY:
        query = query.where(InstanceRow.function.in_(functions))
    for row in session.scalars(query):
        if row.function in rows:
            rows[row.function].append(row)
    return rows


def prune_instances(*, session: Session, keep_ended: int) -> None:
    """Keeps the newest ``keep_ended`` ended instances per function (their logs stay readable)."""
    ended = list(session.scalars(
        select(InstanceRow).where(InstanceRow.state.not_in(ACTIVE_STATES | {"stopping"}))
        .order_by(InstanceRow.function, InstanceRow.created_at.desc())))
    seen: dict[str, int] = {}
    for row in ended:
        seen[row.function] = seen.get(row.function, 0) + 1
        if seen[row.function] > keep_ended:
            session.delete(row)
    session.commit()


def record_event(*, session: Session, function: str, action: str, reason: str,
                 instance_id: str | None = None, term: int | None = None) -> None:
    session.add(ScalingEventRow(function=function, action=action, reason=reason,
                                instance_id=instance_id, at=utcnow(), term=term))
    session.commit()


def list_events(*, session: Session, function: str | None = None, limit: int = 100,
                before: int | None = None) -> list[ScalingEventRow]:
    """The newest ``limit`` events (of ``function``; older than the event ``before``), oldest first."""
    query = select(ScalingEventRow).order_by(ScalingEventRow.id.desc()).limit(limit)
    if function is not None:
        query = query.where(ScalingEventRow.function == function)
    if before is not None:
        query = query.where(ScalingEventRow.id < before)
    return list(reversed(list(session.scalars(query))))


def save_profile(*, session: Session, function: str, version: int, **values: object) -> ProfileRow:
    """Creates or updates the profile of one function version."""
    row = session.get(ProfileRow, (function, version))
    if row is None:
        row = ProfileRow(function=function, version=version, created_at=utcnow())
        session.add(row)
    for key, value in values.items():
        setattr(row, key, value)
    row.updated_at = utcnow()
    session.commit()
    return row


def forget_failed_profile(*, session: Session, function: str, version: int) -> None:
    """Removes the version's profile if it failed, so that a retry profiles it afresh."""
    row = session.get(ProfileRow, (function, version))
    if row is not None and row.status == "failed":
        session.delete(row)
        session.commit()


def get_profile(*, session: Session, function: str, version: int) -> ProfileRow | None:
    return session.get(ProfileRow, (function, version))


def list_profiles(*, session: Session) -> list[ProfileRow]:
    return list(session.scalars(select(ProfileRow)))


def profiles_of(*, session: Session, function: str) -> list[ProfileRow]:
    return list(session.scalars(select(ProfileRow).where(ProfileRow.function == function)))


def put_workflow(*, session: Session, name: str, spec: dict) -> tuple[WorkflowRow, bool]:
    """Creates the workflow, or stores a new version of it; (row, created)."""
    now = utcnow()
    result = session.execute(update(WorkflowRow).where(WorkflowRow.name == name)
                             .values(spec=spec, version=WorkflowRow.version + 1, updated_at=now))
    if result.rowcount == 0:
        session.add(WorkflowRow(name=name, version=1, spec=spec, created_at=now, updated_at=now))
        try:
            session.commit()
        except IntegrityError:   # created meanwhile by a concurrent deploy: update that one
            session.rollback()
            return put_workflow(session=session, name=name, spec=spec)
        return session.get(WorkflowRow, name), True
    session.commit()
    return session.get(WorkflowRow, name), False


def get_workflow(*, session: Session, name: str) -> WorkflowRow | None:
    return session.get(WorkflowRow, name)


def list_workflows(*, session: Session, after: str | None = None, limit: int | None = None) -> list[WorkflowRow]:
    """Up to ``limit`` workflows (None: all) by name, those after ``after`` (keyset paging)."""
    query = select(WorkflowRow).order_by(WorkflowRow.name).limit(limit)
    if after is not None:
        query = query.where(WorkflowRow.name > after)
    return list(session.scalars(query))


def delete_workflow(*, session: Session, name: str) -> bool:
    result = session.execute(delete(WorkflowRow).where(WorkflowRow.name == name))
    session.commit()
    return result.rowcount > 0


def record_loading(*, session: Session, function: str, version: int, sample: dict[str, float]) -> dict | None:
    """Folds one start's stage times into the version's running estimates; None if the function is gone."""
    from dilu.loading import update_estimates

    if session.get(FunctionRow, function) is None:
        return None
    row = session.get(LoadingStagesRow, (function, version))
    if row is None:
        row = LoadingStagesRow(function=function, version=version, stages=update_estimates(None, sample),
                               updated_at=utcnow())
        session.add(row)
    else:
        row.stages = update_estimates(row.stages, sample)
        row.updated_at = utcnow()
    try:
        session.commit()
    except IntegrityError:   # the function was deleted meanwhile
        session.rollback()
        return None
    return row.stages


def get_loading(*, session: Session, function: str, version: int) -> dict | None:
    row = session.get(LoadingStagesRow, (function, version))
    return row.stages if row is not None else None


def loading_totals(*, session: Session) -> dict[tuple[str, int], float]:
    """(function, version) -> its estimated cold start, the sum of its stages' running means."""
    from dilu.loading import total_s

    return {(row.function, row.version): total_s(row.stages) or 0.0
            for row in session.scalars(select(LoadingStagesRow))}
