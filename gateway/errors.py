"""Every error the gateway returns is JSON ``{"error": ...}``."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


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
