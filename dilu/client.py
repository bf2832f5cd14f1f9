"""Dilu's Python client: invoke and inspect functions from code.

    from dilu.client import Client

    with Client() as dilu:                    # DILU_URL and DILU_API_KEY, or pass url= and api_key=
        print(dilu.invoke("iris", {"features": [[5.1, 3.5, 1.4, 0.2]]}))

Every error the gateway answers becomes ``DiluError`` with its status and message. For the
inference protocol (v2), use any Triton or KServe client (docs/protocols.md).
"""

from __future__ import annotations

from typing import Any

import httpx

from dilu.config import CliSettings


class DiluError(Exception):
    """The gateway refused or failed the call: ``status`` (0: not reached) and its message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message


class Client:
    def __init__(self, url: str | None = None, api_key: str | None = None, timeout: float = 300.0) -> None:
        settings = CliSettings()
        self.url = (url or settings.url).rstrip("/")
        key = api_key if api_key is not None else settings.api_key
        self._http = httpx.Client(base_url=self.url, timeout=timeout,
                                  headers={"authorization": f"Bearer {key}"} if key else {})

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            reply = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise DiluError(0, f"cannot reach the Dilu gateway at {self.url}: {exc}") from None
        try:
            body = reply.json()
        except ValueError:
            body = None
        if reply.status_code >= 400:
            message = body.get("error") if isinstance(body, dict) else None
            raise DiluError(reply.status_code, message or reply.text[:500])
        return body

    def invoke(self, name: str, payload: Any) -> Any:
        """Runs function ``name`` on one JSON-serialisable input and returns its result."""
        return self._call("POST", f"/v1/functions/{name}/invoke", json=payload)

    def functions(self, page: int = 500) -> list[dict[str, Any]]:
        """Every function, read ``page`` at a time."""
        functions: list[dict[str, Any]] = []
        cursor = None
        while True:
            params = {"limit": page, **({"cursor": cursor} if cursor else {})}
            try:
                reply = self._http.get("/v1/functions", params=params)
            except httpx.HTTPError as exc:
                raise DiluError(0, f"cannot reach the Dilu gateway at {self.url}: {exc}") from None
            if reply.status_code >= 400:
                raise DiluError(reply.status_code, reply.text[:500])
            functions += reply.json()
            cursor = reply.headers.get("x-next-cursor")
            if not cursor:
                return functions

    def function(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/functions/{name}")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
