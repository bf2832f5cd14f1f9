"""Code bundles: upload once per content digest, check before uploading."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, HTTPException, Request, Response

from dilu.bundles import digest_of, is_digest
from dilu.db import repo
from gateway.deps import ServicesDep

router = APIRouter(prefix="/v1/bundles", tags=["bundles"])


async def read_limited(request: Request, limit: int) -> bytes:
    """The request body, or 413 as soon as it passes ``limit`` bytes (never buffered past it)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, f"bundle of {int(declared)} bytes is over the limit of {limit} bytes "
                                 "(DILU_MAX_BUNDLE_BYTES)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPException(413, f"bundle is over the limit of {limit} bytes (DILU_MAX_BUNDLE_BYTES)")
        chunks.append(chunk)
    return b"".join(chunks)


@router.post("", status_code=201, responses={
    200: {"description": "The bundle was stored already"}, 413: {"description": "Over DILU_MAX_BUNDLE_BYTES"}})
async def upload_bundle(request: Request, response: Response, services: ServicesDep) -> dict:
    """Stores a function's packed folder (the raw .tar.gz as the body); answers its digest, which
    a deploy names as ``bundle``."""
    data = await read_limited(request, services.settings.max_bundle_bytes)
    if not data.startswith(b"\x1f\x8b"):
        raise HTTPException(400, "a bundle is a gzipped tar archive (dilu deploy packs one)")
    digest = digest_of(data)

    def store() -> bool:
        with services.sessions() as session:
            return repo.put_bundle(session=session, digest=digest, data=data)

    if not await asyncio.to_thread(store):
        response.status_code = 200
    return {"digest": digest, "size": len(data)}


@router.head("/{digest}", responses={404: {"description": "No such bundle"}})
async def has_bundle(digest: str, services: ServicesDep) -> Response:
    """200 when the bundle is stored (so an unchanged function's code is not uploaded again)."""
    if not is_digest(digest):
        raise HTTPException(400, "a bundle digest looks like sha256:<64 hex digits>")

    def exists() -> bool:
        with services.sessions() as session:
            return repo.bundle_exists(session=session, digest=digest)

    return Response(status_code=200 if await asyncio.to_thread(exists) else 404)
