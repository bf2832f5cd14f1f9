"""Every error the gateway returns is JSON ``{"error": ...}``."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from dilu.failures import DATABASE_DOWN, STATE_STORE_DOWN
from gateway.encoding import BodyNotDecodable

RETRY_AFTER_S = "5"


log = logging.getLogger(__name__)


def outage(exc: BaseException) -> str | None:
    """The message for an exception that means a store is down (None for any other)."""
    if isinstance(exc, DATABASE_DOWN):
        return "the database cannot answer now (is it up and reachable?); retry later"
    if isinstance(exc, STATE_STORE_DOWN):
        return "the state store (Redis) cannot answer now; retry later"
    return None


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
ERROR_HEADER = "x-dilu-error"     # the error's message again, for a reply without a body (HEAD)


def error_header(message: str) -> str:
    """``message`` as one header value: printable ASCII (others escaped), at most 300 characters."""
    text = message.encode("ascii", "backslashreplace").decode()
    return _CONTROL.sub(lambda found: f"\\x{ord(found.group()):02x}", text)[:300]


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status,
                        headers={**(headers or {}), ERROR_HEADER: error_header(message)})


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = {key.lower(): value for key, value in (getattr(exc, "headers", None) or {}).items()}
        if exc.status_code == 405:
            # Every method the path answers to (the router names only the first route it matched).
            allowed = sorted({method for route in app.routes if isinstance(route, APIRoute)
                              and route.path_regex.match(request.url.path) for method in route.methods})
            headers["allow"] = ", ".join(allowed)
        return error_response(exc.status_code, str(exc.detail), headers or None)

    async def store_down(_: Request, exc: Exception) -> JSONResponse:
        return error_response(503, outage(exc) or "a store cannot answer now", {"retry-after": RETRY_AFTER_S})

    for kind in (*DATABASE_DOWN, *STATE_STORE_DOWN):
        app.add_exception_handler(kind, store_down)

    @app.exception_handler(BodyNotDecodable)
    async def not_decodable(_: Request, exc: BodyNotDecodable) -> JSONResponse:
        return error_response(400, str(exc))

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        # The framework answers with this, then re-raises to ``KeepsConnections`` below.
        return error_response(500, f"internal error in the gateway ({type(exc).__name__}); it is logged")

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = []
        for error in exc.errors():
            where = ".".join(str(p) for p in error["loc"] if p != "body") or "body"
            problems.append(f"{where}: {error['msg']}")
        return error_response(422, "; ".join(problems))


def errors_in_openapi(app: FastAPI, *more: Callable[[dict], None]) -> None:
    """Makes the OpenAPI document say what validation errors really look like (``{"error": ...}``,
    not FastAPI's default list of details)."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()
        for add in more:   # routes whose documents FastAPI cannot see (raw bodies) add them here
            add(schema)
        for methods in schema.get("paths", {}).values():
            for operation in methods.values():
                answer = operation.get("responses", {}).get("422")
                if answer is not None:
                    answer["content"] = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.setdefault("ErrorBody", {"title": "ErrorBody", "type": "object", "required": ["error"],
                                            "properties": {"error": {"title": "Error", "type": "string"}}})
        for unused in ("HTTPValidationError", "ValidationError"):
            components.pop(unused, None)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi


class KeepsConnections:
    """ASGI wrapper, outermost: an exception that escapes the app is logged once and answered
    500 with a JSON error (when nothing was sent yet) instead of reaching the server, which
    would close the client's keep-alive connection over it."""

    def __init__(self, app: ASGIApp, services_of: Callable[[], Any]) -> None:
        self.app = app
        self.services_of = services_of   # the gateway's services, once started (gRPC reaches them here)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking)
        except Exception as exc:  # the last line of defence for one request
            down = outage(exc)
            bad_body = isinstance(exc, BodyNotDecodable)    # the client's fault: a 400 naming it
            if down is None and not bad_body:
                log.exception("unexpected error on %s %s", scope.get("method"), scope.get("path"))
            if not started:
                message = str(exc) if bad_body else \
                    down or f"internal error in the gateway ({type(exc).__name__}); it is logged"
                body = json.dumps({"error": message}).encode()
                headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                           (ERROR_HEADER.encode(), error_header(message).encode())]
                if down:
                    headers.append((b"retry-after", RETRY_AFTER_S.encode()))
                status = 400 if bad_body else 503 if down else 500
                await send({"type": "http.response.start", "status": status, "headers": headers})
                await send({"type": "http.response.body", "body": body})
