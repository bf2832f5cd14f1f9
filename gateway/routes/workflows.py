"""Workflows: deploy, list, describe, delete and invoke a DAG of deployed functions."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime
from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from dilu.db import repo
from dilu.db.models import WorkflowRow
from dilu.limits import LimitExceeded, check_json_depth, load_finite_json
from dilu.workflows.run import WorkflowFailed
from dilu.workflows.spec import WorkflowError, check_functions, make_workflow, workflow_from_dict, workflow_to_dict
from gateway.deps import ServicesDep, WorkflowsDep
from gateway.docs import AUTH_ERRORS, SECURED, ErrorBody, errors
from gateway.errors import error_response
from gateway.limits import BodyTooLarge, read_capped
from gateway.needs import Control
from gateway.paging import MAX_PAGE, NEXT_PAGE_DOC, one_page

router = APIRouter(prefix="/v1/workflows", tags=["workflows"], dependencies=SECURED, responses=AUTH_ERRORS)


class WorkflowDeploy(BaseModel):
    yaml: str | None = Field(None, description="workflow.yaml text")
    spec: dict[str, Any] | None = Field(None, description="The workflow as JSON, instead of yaml")


class WorkflowPublic(BaseModel):
    name: str
    version: int
    nodes: int
    spec: dict[str, Any]
    invoke_url: str
    created_at: datetime
    updated_at: datetime
    keep: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="loading: slack: the latest keep decision per node (any gateway's) "
                                          "({verdict: hold|prewarm|release|default, exposed_s, reason})")


def _public(row: WorkflowRow, request: Request, keep: dict[str, dict[str, Any]] | None = None) -> WorkflowPublic:
    base = str(request.base_url).rstrip("/")
    return WorkflowPublic(name=row.name, version=row.version, nodes=len(row.spec.get("nodes", [])), spec=row.spec,
                          invoke_url=f"{base}/v1/workflows/{row.name}/invoke", created_at=row.created_at,
                          updated_at=row.updated_at, keep=keep or {})


@router.post("", response_model=WorkflowPublic, status_code=201, responses={
    200: {"model": WorkflowPublic, "description": "A new version of an existing workflow"}, **errors(400, 422)})
async def deploy_workflow(body: WorkflowDeploy, request: Request, services: ServicesDep) -> Any:
    """Validates the DAG (cycles, unknown nodes, nodes that do not lead to the output, functions
    that are not deployed: each error names the node) and stores it."""
    try:
        if body.yaml is not None:
            spec = make_workflow(body.yaml)
        elif body.spec is not None:
            spec = workflow_from_dict(body.spec)
        else:
            raise WorkflowError(["body: give the workflow as 'yaml' (text) or 'spec' (object)"])
    except WorkflowError as exc:
        raise HTTPException(422, f"invalid workflow: {exc}") from None

    def write() -> tuple[WorkflowPublic, bool]:
        with services.sessions() as session:
            check_functions(spec, {f.name for f in repo.list_functions(session=session)})
            row, created = repo.put_workflow(session=session, name=spec.name, spec=workflow_to_dict(spec))
            return _public(row, request), created

    try:
        public, created = await asyncio.to_thread(write)
    except WorkflowError as exc:
        raise HTTPException(422, f"invalid workflow: {exc}") from None
    return JSONResponse(public.model_dump(mode="json"), status_code=201 if created else 200)


@router.get("", response_model=list[WorkflowPublic], responses={
    200: {"description": f"Workflows by name. {NEXT_PAGE_DOC}"}, **errors(422)})
async def list_workflows(request: Request, response: Response, services: ServicesDep,
                         limit: int | None = Query(None, ge=1, le=MAX_PAGE, description="Workflows per page (all "
                                                                                        "when unset)"),
                         cursor: str | None = Query(None, max_length=128, pattern=r"^[a-z0-9_-]+$",
                                                    description="x-next-cursor of the previous page")
                         ) -> list[WorkflowPublic]:
    def read() -> list[WorkflowRow]:
        with services.sessions() as session:
            return repo.list_workflows(session=session, after=cursor, limit=limit + 1 if limit else None)

    rows = one_page(await asyncio.to_thread(read), limit, request, response, lambda row: row.name)
    return [_public(row, request) for row in rows]


async def _load(services: Control, name: str) -> WorkflowRow:
    def read() -> WorkflowRow | None:
        with services.sessions() as session:
            return repo.get_workflow(session=session, name=name)

    row = await asyncio.to_thread(read)
    if row is None:
        raise HTTPException(404, f"workflow {name!r} not found")
    return row


@router.get("/{name}", response_model=WorkflowPublic, responses=errors(404))
async def get_workflow(name: str, request: Request, services: ServicesDep,
                       workflows: WorkflowsDep) -> WorkflowPublic:
    return _public(await _load(services, name), request, await workflows.decisions(name))


@router.delete("/{name}", responses=errors(404))
async def delete_workflow(name: str, services: ServicesDep) -> dict[str, str]:
    def remove() -> bool:
        with services.sessions() as session:
            return repo.delete_workflow(session=session, name=name)

    if not await asyncio.to_thread(remove):
        raise HTTPException(404, f"workflow {name!r} not found")
    return {"deleted": name}


@router.post("/{name}/invoke", responses={
    200: {"description": "The output node's result; with timings=true, {output, nodes: {name: {status, "
                         "started_ms, ended_ms}}, total_ms}", "content": {"application/json": {"schema": {}}}},
    **errors(400, 404, 413),
    422: {"model": ErrorBody, "description": "No output node ran (their conditions skipped them)"},
    502: {"model": ErrorBody, "description": "A node failed: the message names it, its function and why"},
    504: {"model": ErrorBody, "description": "A node, or the whole workflow, ran past its limit"}},
    openapi_extra={"requestBody": {"required": True, "description": "The JSON input of the workflow's root nodes",
                                   "content": {"application/json": {"schema": {}}}}})
async def invoke_workflow(name: str, request: Request, services: ServicesDep, workflows: WorkflowsDep,
                          timings: bool = Query(False, description="Answer with each node's timings")) -> Any:
    """Runs the workflow on one JSON input: each node through the same queue, batching and scaling
    as a direct invocation of its function, siblings in parallel."""
    row = await _load(services, name)
    limit = services.settings.max_request_bytes
    try:
        body = await read_capped(request.stream(), request.headers.get("content-length"), limit)
        check_json_depth(body)
        payload = load_finite_json(body)
    except BodyTooLarge:
        return error_response(413, f"request body exceeds the limit of {limit} bytes (DILU_MAX_REQUEST_BYTES)")
    except LimitExceeded as exc:
        return error_response(400, f"request body: {exc}")
    except (ValueError, RecursionError) as exc:
        return error_response(400, f"request body is not valid JSON: {exc}")

    spec = workflow_from_dict(row.spec)
    started = time.perf_counter()   # the executor's clock, so the total covers every node's times
    try:
        output, runs = await workflows.invoke(name, spec, payload)
    except WorkflowFailed as failure:
        content: dict[str, Any] = {"error": failure.message, "node": failure.node}
        if timings:
            content["nodes"] = {n: r.to_dict() for n, r in failure.runs.items()}
        return JSONResponse(content, status_code=failure.status)
    if timings:
        output = {"output": output, "nodes": {n: r.to_dict() for n, r in runs.items()},
                  "total_ms": round((time.perf_counter() - started) * 1000, 3)}
    # As a direct invocation passes its function's JSON through, so does the workflow.
    return Response(json.dumps(output).encode(), media_type="application/json")
