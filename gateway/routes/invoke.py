"""Invocation: pick the least-loaded ready instance, or wait in the bounded cold-start queue."""

from __future__ import annotations

import json
import time

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.errors import error_response
from gateway.metrics import LATENCY, REQUESTS
from gateway.routing import NoInstance, QueueFull
from gateway.services import GatewayServices

router = APIRouter(prefix="/v1/functions", tags=["invoke"])
PASSED_HEADERS = ("x-dilu-batch-size", "x-dilu-latency-ms", "x-dilu-instance")


class _TooLarge(Exception):
    pass


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _TooLarge
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


@router.post("/{name}/invoke", responses={
    400: {"description": "Body is not JSON"}, 404: {"description": "Unknown function"},
    413: {"description": "Body too large"}, 429: {"description": "Cold-start queue full"},
    502: {"description": "The instance failed"}, 503: {"description": "The function cannot start"},
    504: {"description": "No instance in time"}})
async def invoke(name: str, request: Request) -> Response:
    """Runs the function on one JSON input and returns its JSON result."""
    services: GatewayServices = request.app.state.services
    started = time.perf_counter()
    response = await _invoke(services, name, request)
    REQUESTS.labels(name, str(response.status_code)).inc()
    LATENCY.labels(name).observe(time.perf_counter() - started)
    return response


async def _invoke(services: GatewayServices, name: str, request: Request) -> Response:
    settings = services.settings
    function = services.functions.get(name)
    if function is None:
        await services.functions.refresh(name)
        function = services.functions.get(name)
        if function is None:
            return error_response(404, f"function {name!r} not found")
    try:
        body = await _read_body(request, settings.max_request_bytes)
    except _TooLarge:
        return error_response(413, f"request body exceeds the limit of {settings.max_request_bytes} bytes")
    try:
        json.loads(body)
    except ValueError as exc:
        return error_response(400, f"request body is not valid JSON: {exc}")

    services.activity.started(name)
    routing = services.routing
    tried: frozenset[str] = frozenset()
    retried = False
    while True:
        try:
            endpoint = await routing.wait_for_endpoint(
                name, settings.queue_timeout_s, exclude=tried, on_queued=lambda: services.demand(name))
        except QueueFull as exc:
            return error_response(429, str(exc), headers={"Retry-After": "1"})
        except NoInstance as exc:
            status = 503 if services.functions.get(name) is None or _failed(services, name) else 504
            return error_response(status, str(exc))
        routing.acquire(name, endpoint.instance_id)
        try:
            reply = await services.http.post(endpoint.url + "/infer", content=body,
                                             headers={"content-type": "application/json"},
                                             timeout=settings.request_timeout_s)
        except httpx.ConnectError:
            # Nothing reached the instance, so trying elsewhere is always safe.
            routing.drop_endpoint(name, endpoint.instance_id)
            tried = tried | {endpoint.instance_id}
            continue
        except httpx.TimeoutException:
            return error_response(504, f"instance {endpoint.instance_id} did not answer within "
                                       f"{settings.request_timeout_s:g}s")
        except httpx.HTTPError as exc:
            routing.drop_endpoint(name, endpoint.instance_id)
            if function.spec.get("idempotent") and not retried:
                retried, tried = True, tried | {endpoint.instance_id}
                continue
            return error_response(502, f"instance {endpoint.instance_id} failed while serving the request: "
                                       f"{type(exc).__name__}")
        finally:
            routing.release(name, endpoint.instance_id)
        headers = {key: reply.headers[key] for key in PASSED_HEADERS if key in reply.headers}
        if reply.status_code == 503 and b"still loading" in reply.content:
            tried = tried | {endpoint.instance_id}
            continue
        return Response(reply.content, status_code=reply.status_code, headers=headers,
                        media_type=reply.headers.get("content-type", "application/json"))


def _failed(services: GatewayServices, name: str) -> bool:
    entry = services.functions.get(name)
    return entry is not None and entry.status == "failed"

