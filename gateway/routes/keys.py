"""API keys: create (the key is shown once), list, revoke. Admin scope only (see gateway.auth)."""

from __future__ import annotations

import asyncio
from datetime import datetime

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, Field, field_validator

from dilu.db import repo
from dilu.keys import SCOPE_PATTERN, check_scopes, new_key
from gateway.deps import ServicesDep
from gateway.docs import AUTH_ERRORS, SECURED, errors

router = APIRouter(prefix="/v1/keys", tags=["keys"], dependencies=SECURED, responses=AUTH_ERRORS)


class KeyRequest(BaseModel):
    name: str = Field(..., min_length=1, max_length=63, pattern=r"^[A-Za-z0-9_.@-]+$")
    # The schema states the scope rule; the validator below enforces it with a readable message.
    scopes: list[str] = Field(
        ..., min_length=1, max_length=64, description="admin, read, invoke, or invoke:<function> (repeatable)",
        json_schema_extra={"items": {"type": "string", "pattern": f"^({SCOPE_PATTERN.pattern})$"}})

    @field_validator("scopes")
    @classmethod
    def _known(cls, value: list[str]) -> list[str]:
        return check_scopes(value)


class KeyPublic(BaseModel):
    id: str
    name: str
    scopes: list[str]
    created_at: datetime


class KeyCreated(KeyPublic):
    key: str = Field(description="The key itself: shown this once, stored only as a hash")


@router.post("", response_model=KeyCreated, status_code=201, responses=errors(400, 413, 422))
async def create_key(body: KeyRequest, services: ServicesDep) -> KeyCreated:
    """Creates a key. The first key turns authentication on for every gateway."""
    key_id, secret_hash, key = new_key()

    def write() -> KeyCreated:
        with services.sessions() as session:
            row = repo.create_key(session=session, key_id=key_id, name=body.name, secret_hash=secret_hash,
                                  scopes=body.scopes)
            return KeyCreated(id=row.id, name=row.name, scopes=row.scopes, created_at=row.created_at, key=key)

    created = await asyncio.to_thread(write)
    await services.auth.refresh()
    return created


@router.get("", response_model=list[KeyPublic])
async def list_keys(services: ServicesDep) -> list[KeyPublic]:
    def read() -> list[KeyPublic]:
        with services.sessions() as session:
            return [KeyPublic(id=r.id, name=r.name, scopes=r.scopes, created_at=r.created_at)
                    for r in repo.list_keys(session=session)]

    return await asyncio.to_thread(read)


@router.delete("/{key_id}", responses=errors(404, 422))
async def revoke_key(key_id: str, services: ServicesDep) -> dict[str, str]:
    """Revokes a key at once on this gateway (on others within their refresh period)."""
    def write() -> bool:
        with services.sessions() as session:
            return repo.revoke_key(session=session, key_id=key_id)

    if not await asyncio.to_thread(write):
        raise HTTPException(404, f"no active key {key_id!r}")
    await services.auth.refresh()
    return {"revoked": key_id}
