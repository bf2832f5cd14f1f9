"""Weight artifacts: uploaded once per content digest into the store workers fetch from."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, HTTPException, Path, Request, Response
from pydantic import BaseModel

from dilu.artifacts import ArtifactError, ArtifactStore, ArtifactTooLarge, ArtifactWriter
from gateway.deps import ServicesDep
from gateway.docs import AUTH_ERRORS, SECURED, errors

router = APIRouter(prefix="/v1/artifacts", tags=["artifacts"], dependencies=SECURED, responses=AUTH_ERRORS)
DIGEST = Path(..., pattern=r"^sha256:[0-9a-f]{64}$", description="sha256:<64 hex digits> of the file's bytes")
WRITE_BATCH = 8 * 2**20   # bytes gathered before one write in a thread (the event loop never writes)


class ArtifactStored(BaseModel):
    digest: str
    size: int


def _store(services: ServicesDep) -> ArtifactStore:
    return ArtifactStore(services.settings.effective_artifact_store)


@router.put("/{digest}", status_code=201, response_model=ArtifactStored, responses={
    200: {"description": "The artifact was stored already (the body is not read)", "model": ArtifactStored},
    **errors(413, 422), 507: {"description": "The store cannot hold it now (disk full or failing)"}},
    openapi_extra={"requestBody": {"required": True, "description": "A safetensors file",
                                   "content": {"application/octet-stream": {"schema": {"type": "string",
                                                                                       "format": "binary"}}}}})
async def put_artifact(request: Request, response: Response, services: ServicesDep,
                       digest: str = DIGEST) -> ArtifactStored:
    """Stores a weights file under the digest of its bytes, streamed to disk as it arrives (a
    multi-GB file never sits in memory). 422 when the bytes hash to another digest or are not a
    safetensors file; nothing is stored then."""
    store, limit = _store(services), services.settings.max_artifact_bytes
    if await asyncio.to_thread(store.has, digest):
        response.status_code = 200
        return ArtifactStored(digest=digest, size=store.path(digest).stat().st_size)
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, f"the artifact is over the limit of {limit} bytes (DILU_MAX_ARTIFACT_BYTES)")
    writer = await asyncio.to_thread(store.writer, digest, limit)
    try:
        await _receive(request, writer)
        await asyncio.to_thread(writer.commit)
    except ArtifactError as exc:
        writer.discard()
        raise HTTPException(413 if isinstance(exc, ArtifactTooLarge) else 422, f"artifact {digest}: {exc}") from None
    except OSError as exc:   # the store's disk is full or failing: the caller may try again later
        writer.discard()
        raise HTTPException(507, f"artifact {digest} cannot be stored: {exc.strerror or exc}") from None
    except BaseException:
        writer.discard()
        raise
    return ArtifactStored(digest=digest, size=writer.size)


async def _receive(request: Request, writer: ArtifactWriter) -> None:
    pending: list[bytes] = []
    held = 0
    async for chunk in request.stream():
        pending.append(chunk)
        held += len(chunk)
        if held >= WRITE_BATCH:
            await asyncio.to_thread(writer.write, b"".join(pending))
            pending, held = [], 0
    if pending:
        await asyncio.to_thread(writer.write, b"".join(pending))


@router.head("/{digest}", responses={200: {"description": "The artifact is stored (no body)"},
                                     404: {"description": "No such artifact (no body)"}, **errors(422)})
async def has_artifact(services: ServicesDep, digest: str = DIGEST) -> Response:
    """200 when the artifact is stored (so an unchanged file is not uploaded again)."""
    return Response(status_code=200 if await asyncio.to_thread(_store(services).has, digest) else 404)
