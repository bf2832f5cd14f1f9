"""The documented ``/v1`` invoke route, over the gateway's ``Invoker`` (``gateway.invocation``).

``gateway.fast_path`` serves the same route in the running gateway, taking invoke requests
before the framework's middleware, routing and dependency machinery (which cost more CPU per
request than the forwarding itself); this one documents it and backs it up.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from gateway.docs import AUTH_ERRORS, SECURED, ErrorBody, errors
from gateway.invocation import Invocation

router = APIRouter(prefix="/v1/functions", tags=["invoke"], dependencies=SECURED, responses=AUTH_ERRORS)


@router.post("/{name}/invoke", responses={
    200: {"description": "The function's JSON result (headers x-dilu-batch-size, x-dilu-latency-ms, "
                         "x-dilu-instance; x-dilu-queued-ms after a cold start)",
          "content": {"application/json": {"schema": {}}}},
    **errors(400, 404, 413, 429, 502, 503, 504),
    422: {"model": ErrorBody, "description": "The handler refused the input (dilu.InputError)"},
    500: {"model": ErrorBody, "description": "The handler failed on this input"}},
    openapi_extra={"requestBody": {"required": True, "description": "One JSON input of the function",
                                   "content": {"application/json": {"schema": {}}}}})
async def invoke(name: str, request: Request) -> Response:
    """Runs the function on one JSON input and returns its JSON result.

    (Served by gateway.fast_path in the running gateway; this route documents it and backs it up.)
    """
    stream = request.stream().__aiter__()

    async def next_chunk() -> tuple[bytes, bool]:
        try:
            return await stream.__anext__(), True
        except StopAsyncIteration:
            return b"", False

    outcome = await request.app.state.services.invoker.invoke(Invocation(
        name, next_chunk, request.headers.get("content-length"), accept=request.headers.get("accept")))
    if outcome.relay is not None:
        return StreamingResponse(outcome.relay.pieces(), headers=outcome.headers, media_type=outcome.content_type)
    return Response(outcome.body, status_code=outcome.status, headers=outcome.headers,
                    media_type=outcome.content_type)
