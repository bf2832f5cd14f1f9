"""The CLI's thin HTTP client for the gateway; every failure becomes a one-line message."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx


class CliError(Exception):
    """Shown to the user as ``error: <message>`` with exit status 1."""


class GatewayClient:
    def __init__(self, base_url: str, timeout: float = 30.0, api_key: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, headers=headers)

    def request(self, method: str, path: str, *, expect_json: bool = True, allow_status: tuple[int, ...] = (),
                **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.ConnectError:
            raise CliError(f"cannot reach the Dilu gateway at {self.base_url} "
                           "(is `dilu up` running? set DILU_URL to point elsewhere)") from None
        except httpx.TimeoutException:
            raise CliError(f"the gateway at {self.base_url} did not answer in time") from None
        if response.status_code >= 400 and response.status_code not in allow_status:
            raise CliError(_error_text(response))
        return response

    def lines(self, method: str, path: str, **kwargs: Any) -> Iterator[str]:
        """The non-empty lines of a streamed answer, as they come; a refusal (4xx/5xx before the
        stream began) raises with the gateway's message, as ``request`` does."""
        try:
            with self._http.stream(method, path, **kwargs) as response:
                if response.status_code >= 400:
                    response.read()
                    raise CliError(_error_text(response))
                for line in response.iter_lines():
                    if line:
                        yield line
        except httpx.ConnectError:
            raise CliError(f"cannot reach the Dilu gateway at {self.base_url} "
                           "(is `dilu up` running? set DILU_URL to point elsewhere)") from None
        except httpx.TimeoutException:
            raise CliError(f"the gateway at {self.base_url} sent nothing for too long") from None
        except httpx.RemoteProtocolError:
            return      # the connection broke mid-answer: the caller sees no terminator

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.request(method, path, **kwargs).json()


def _error_text(response: httpx.Response) -> str:
    try:
        body = response.json()
        message = body.get("error") if isinstance(body, dict) else None
    except ValueError:
        message = None
    # A reply to HEAD has no body: the gateway repeats its message in a header.
    message = message or response.headers.get("x-dilu-error")
    if message:
        return message
    reason = response.reason_phrase or "error"
    return f"{response.request.method} {response.request.url.path}: HTTP {response.status_code} {reason}" + (
        f": {response.text[:500]}" if response.text.strip() else "")
