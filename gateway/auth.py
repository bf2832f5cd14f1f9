"""Who is asking: API keys on every route but /healthz (and /metrics unless configured).

Authentication is on once a key has ever been made (in the database, or ``DILU_ADMIN_KEY``);
revoking every key does not turn it off again (``dilu keys reopen``, on the database, does).
Before that the platform is open, which only a gateway on a loopback address may be (``roles``
refuses to start one on any other address, and such a gateway stays closed for its whole life),
and an open platform answers only loopback names and its own pages (``gateway.origin``), and
only this machine's users, not its functions' instances (``dilu.peers``). Keys
are read from the database into memory and refreshed periodically and on a miss, so checking a
key costs no I/O on the hot path.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker
from starlette.types import ASGIApp, Receive, Scope, Send

from dilu.db import repo
from dilu.keys import Need, allows, parse, secret_matches
from dilu.peers import PeerUids
from gateway.origin import refusal
from gateway.route_table import route_in

log = logging.getLogger(__name__)
MISS_REFRESH_S = 1.0   # a key unknown here is looked up in the database at most this often


@dataclass(frozen=True)
class Denied:
    """Why a request is refused: 401 (no or bad key) or 403 (a key without the scope)."""

    status: int
    message: str

    @property
    def headers(self) -> dict[str, str]:
        return {"www-authenticate": 'Bearer realm="dilu"'} if self.status == 401 else {}


class Authenticator:
    def __init__(self, sessions: sessionmaker[Session], admin_key: str | None = None,
                 always_closed: bool = False, instance_uids: tuple[int, int] | None = None,
                 metrics_public: bool = True) -> None:
        """``instance_uids``: the range instances run as; an open platform refuses their callers.
        ``metrics_public``: /metrics needs no key."""
        self.metrics_public = metrics_public
        self._sessions = sessions
        self._instance_uids = instance_uids
        self._peers = PeerUids()
        self._admin_key = admin_key
        self._always_closed = always_closed    # a gateway reachable from other machines
        self._keys: dict[str, tuple[str, tuple[str, ...]]] = {}   # id -> (secret hash, scopes)
        self._ever_keyed = False
        self._last_miss_refresh = 0.0

    @property
    def required(self) -> bool:
        """Whether callers must present a key (a key was ever made, or the gateway is exposed)."""
        return bool(self._admin_key) or self._always_closed or self._ever_keyed or bool(self._keys)

    def _load(self) -> tuple[dict[str, tuple[str, tuple[str, ...]]], bool]:
        with self._sessions() as session:
            rows = repo.list_keys(session=session, include_revoked=True)
            return ({row.id: (row.secret_hash, tuple(row.scopes)) for row in rows if row.revoked_at is None},
                    bool(rows))

    async def refresh(self) -> None:
        self._keys, self._ever_keyed = await asyncio.to_thread(self._load)

    def instance_refusal(self, client: tuple[str, int] | None, server: tuple[str, int] | None) -> str | None:
        """Why an open platform refuses this caller: its socket is an instance's. Open means open to
        this machine's users; a function must not reach the platform's keys, bundles and other
        functions, nor mint the first admin key and lock its owner out."""
        if self._instance_uids is None or client is None or server is None:
            return None
        uid = self._peers.of(tuple(client), tuple(server))
        first, last = self._instance_uids
        if uid is None or not first <= uid <= last:
            return None
        return ("this platform has no API key yet, so it answers only this machine's users, and this request "
                f"comes from a function's instance (uid {uid}); create a key (`dilu keys create NAME --scope "
                "admin`) and give the function one")

    async def check(self, authorization: str | None, need: Need, function: str | None = None) -> Denied | None:
        """None when the request may proceed."""
        if not self.required:
            return None
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            return Denied(401, "this platform needs an API key: send 'Authorization: Bearer <key>' "
                               "(the CLI reads DILU_API_KEY)")
        scopes = await self._scopes_of(token.strip())
        if scopes is None:
            return Denied(401, "the API key is not valid (unknown, revoked or mistyped)")
        if not allows(scopes, need, function):
            target = f" on {function!r}" if function else ""
            return Denied(403, f"the API key's scopes ({', '.join(scopes)}) do not allow {need.value}{target}")
        return None

    async def scopes(self, authorization: str | None) -> tuple[str, ...]:
        """The scopes of an already checked request (everything on an open platform)."""
        if not self.required:
            return ("admin",)
        _, _, token = (authorization or "").partition(" ")
        return await self._scopes_of(token.strip()) or ()

    async def _scopes_of(self, token: str) -> tuple[str, ...] | None:
        if self._admin_key and hmac.compare_digest(token.encode(), self._admin_key.encode()):
            return ("admin",)
        parsed = parse(token)
        if parsed is None:
            return None
        key_id, secret = parsed
        if key_id not in self._keys and time.monotonic() - self._last_miss_refresh > MISS_REFRESH_S:
            self._last_miss_refresh = time.monotonic()   # a key made through another gateway
            await self.refresh()
        stored = self._keys.get(key_id)
        if stored is None or not secret_matches(secret, stored[0]):
            return None
        return stored[1]


def authorization_header(headers: Mapping[str, str] | list[tuple[bytes, bytes]]) -> str | None:
    """The Authorization header from a mapping or raw ASGI headers."""
    if isinstance(headers, list):
        for key, value in headers:
            if key == b"authorization":
                return value.decode("latin-1")
        return None
    return headers.get("authorization")


SCOPES_KEY = "dilu_scopes"


class AuthGate:
    """ASGI wrapper: refuses requests whose key does not allow the route, before the app (or the
    invoke fast path) reads them."""

    def __init__(self, app: ASGIApp, authenticator_of: Callable[[], Authenticator]) -> None:
        """``authenticator_of``: the gateway's, once the app has started."""
        self.app = app
        self._authenticator_of = authenticator_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            auth = self._authenticator_of()
            if not auth.required and scope["path"] != "/healthz":
                why = refusal(scope["method"], _origin_headers(scope["headers"])) or \
                    auth.instance_refusal(scope.get("client"), scope.get("server"))
                if why is not None:
                    await _send_denied(send, Denied(403, why))
                    return
            route = route_in(scope, auth.metrics_public)
            need, function = route.need, route.function
            if need is not None:
                header = authorization_header(scope["headers"])
                denied = await auth.check(header, need, function)
                if denied is not None:
                    await _send_denied(send, denied)
                    return
                if auth.required:   # routes that show more to admins read it here
                    scope.setdefault("state", {})[SCOPES_KEY] = await auth.scopes(header)
        await self.app(scope, receive, send)


_ORIGIN_HEADERS = frozenset({b"host", b"origin", b"sec-fetch-site"})


def _origin_headers(raw: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """The headers the open platform's origin rule reads (not every header, on every request)."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in raw if k in _ORIGIN_HEADERS}


async def _send_denied(send: Send, denied: Denied) -> None:
    import json

    body = json.dumps({"error": denied.message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in denied.headers.items()]
    await send({"type": "http.response.start", "status": denied.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def is_admin(scope: dict) -> bool:
    """Whether the request's key has the admin scope (always, on an open platform)."""
    held = scope.get("state", {}).get(SCOPES_KEY)
    return held is None or "admin" in held
