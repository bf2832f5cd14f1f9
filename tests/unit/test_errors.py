"""The gateway's last answer to an unexpected error: JSON, 500 (503 for a store outage), and the
exception kept from the server, which would close the client's keep-alive connection over it."""

from __future__ import annotations

import json

import pytest
from sqlalchemy.exc import OperationalError

from gateway.errors import KeepsConnections


async def _run(error: Exception) -> list[dict]:
    async def app(scope, receive, send) -> None:
        raise error

    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    async def receive() -> dict:
        return {"type": "http.request", "body": b""}

    await KeepsConnections(app, lambda: None)({"type": "http", "method": "POST", "path": "/x"}, receive, send)
    return sent


@pytest.mark.parametrize(("error", "status", "words"), [
    (ValueError("boom"), 500, "internal error in the gateway (ValueError)"),
    (OperationalError("SELECT 1", {}, Exception("connection refused")), 503, "the database cannot answer now"),
])
async def test_an_escaping_error_is_answered_not_raised(error: Exception, status: int, words: str) -> None:
    start, body = await _run(error)
    assert start["status"] == status and (b"content-type", b"application/json") in start["headers"]
    assert words in json.loads(body["body"])["error"]
    assert ((b"retry-after", b"5") in start["headers"]) is (status == 503)
    repeated = dict(start["headers"])[b"x-dilu-error"].decode()       # for a HEAD, which has no body
    assert words in repeated and repeated == json.loads(body["body"])["error"]


def test_the_error_header_is_one_printable_line() -> None:
    from gateway.errors import error_header

    assert error_header("bad\r\nline\x00 ünï " + "x" * 400) == ("bad\\x0d\\x0aline\\x00 \\xfcn\\xef " + "x" * 400)[:300]
    assert error_header("\udb25 lone") == "\\udb25 lone"
