"""What the OpenAPI document says about errors and security, in one place.

Every error the gateway answers is ``{"error": "..."}`` (``ErrorBody``); every route that needs a
key says so (``SECURED``) and documents 401 and 403. Routes add the other codes they answer.
"""

from __future__ import annotations

from typing import Any

from fastapi import Security
from fastapi.security import HTTPBearer
from pydantic import BaseModel

bearer = HTTPBearer(auto_error=False, scheme_name="apiKey",
                    description="An API key (`dilu keys create`), once any key exists: `Bearer dilu_...`")
SECURED = [Security(bearer)]


class ErrorBody(BaseModel):
    error: str


_MEANINGS = {
    400: "The body is not valid JSON, or is nested too deep",
    401: "No API key, or one that is not valid",
    403: "The API key's scopes do not allow this",
    404: "No such function (or key, or bundle)",
    409: "The change does not fit where the function runs",
    413: "The body is over its size limit",
    422: "The input is invalid; the message names the field and the problem",
    429: "The function's cold-start queue is full (see Retry-After)",
    502: "The instance failed while serving",
    503: "The function cannot start, or the state store is unavailable",
    504: "No instance became ready in time, or it did not answer in time",
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` entries for these status codes, all with the error body."""
    return {code: {"model": ErrorBody, "description": _MEANINGS[code]} for code in codes}


AUTH_ERRORS = errors(401, 403)
