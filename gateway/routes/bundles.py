"""Code bundles: upload once per content digest, check before uploading."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, HTTPException, Path, Request, Response
from pydantic import BaseModel

from dilu.bundles import BundleError, check_members, digest_of
from dilu.db import repo
from gateway.deps import ServicesDep
from gateway.docs import AUTH_ERRORS, SECURED, errors
from gateway.limits import BodyTooLarge, read_capped


class BundleStored(BaseModel):
    digest: str
    size: int


router = APIRouter(prefix="/v1/bundles", tags=["bundles"], dependencies=SECURED, responses=AUTH_ERRORS)
DIGEST = Path(..., pattern=r"^sha256:[0-9a-f]{64}$", description="sha256:<64 hex digits>")


async def read_limited(request: Request, limit: int) -> bytes:
    """The request body, or 413 as soon as it passes ``limit`` bytes (never buffered past it)."""
    try:
        return await read_capped(request.stream(), request.headers.get("content-length"), limit)
    except BodyTooLarge:
        raise HTTPException(413, f"bundle is over the limit of {limit} bytes (DILU_MAX_BUNDLE_BYTES)") from None


@router.post("", status_code=201, response_model=BundleStored, responses={
    200: {"description": "The bundle was stored already", "model": BundleStored}, **errors(400, 413, 422)},
    openapi_extra={"requestBody": {"required": True, "description": "The function's folder as a .tar.gz",
                                   "content": {"application/octet-stream": {"schema": {"type": "string",
                                                                                       "format": "binary"}}}}})
async def upload_bundle(request: Request, response: Response, services: ServicesDep) -> BundleStored:
    """Stores a function's packed folder (the raw .tar.gz as the body); answers its digest, which
    a deploy names as ``bundle``. Every member is checked first (422 names the first bad one)."""
    limit = services.settings.max_bundle_bytes
    data = await read_limited(request, limit)
    if not data.startswith(b"\x1f\x8b"):
        raise HTTPException(400, "a bundle is a gzipped tar archive (dilu deploy packs one)")
    try:
        await asyncio.to_thread(check_members, data, limit)
    except BundleError as exc:
        raise HTTPException(422, str(exc)) from None
    digest = digest_of(data)

    def store() -> bool:
        with services.sessions() as session:
            return repo.put_bundle(session=session, digest=digest, data=data)

    if not await asyncio.to_thread(store):
        response.status_code = 200
    return BundleStored(digest=digest, size=len(data))


@router.head("/{digest}", responses={200: {"description": "The bundle is stored (no body)"},
                                     404: {"description": "No such bundle (no body)"}, **errors(422)})
async def has_bundle(services: ServicesDep, digest: str = DIGEST) -> Response:
    """200 when the bundle is stored (so an unchanged function's code is not uploaded again)."""

    def exists() -> bool:
        with services.sessions() as session:
            return repo.bundle_exists(session=session, digest=digest)

    return Response(status_code=200 if await asyncio.to_thread(exists) else 404)
