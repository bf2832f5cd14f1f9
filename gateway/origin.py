"""Who may drive an open platform: the loopback names and the gateway's own pages (pure).

An open platform (no key ever made) listens on loopback only, but a web page the user visits can
still reach it: through DNS rebinding (its own name resolving to 127.0.0.1, so the request names
that name as ``Host``) or a cross-origin form POST. So on an open platform every request must
name a loopback host, and a request that changes state must not come from another origin's page.
Clients that are not browsers (the CLI, curl, SDKs) send no ``Origin`` and are unaffected.
"""

from __future__ import annotations

import functools
from urllib.parse import urlsplit

from dilu.addresses import is_loopback

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _host_name(authority: str) -> str:
    """The host of ``name``, ``name:port``, ``[v6]`` or ``[v6]:port``; "" when the port is not a
    number (no browser sends such a header, so nothing is lost by refusing it)."""
    authority = authority.strip()
    if authority.startswith("["):
        host, _, rest = authority.partition("]")
        port = rest[1:] if rest.startswith(":") else None
        return host + "]" if (not rest or (port is not None and port.isdigit())) else ""
    if authority.count(":") == 1:
        host, _, port = authority.partition(":")
        return host if port.isdigit() else ""
    return authority


@functools.lru_cache(maxsize=256)
def _names_loopback(host: str) -> bool:
    """Whether a Host header names this machine only (asked on every request, of a few values)."""
    return is_loopback(_host_name(host))


def refusal(method: str, headers: dict[str, str]) -> str | None:
    """Why an open platform refuses this request (None: it may proceed). ``headers``: lower-case
    names. Checked for every route; the origin rule for state-changing methods only."""
    host = headers.get("host", "")
    if not host or not _names_loopback(host):
        return (f"this platform has no API key, so it answers only requests addressed to a loopback name "
                f"(localhost, 127.0.0.1, [::1]), not {host[:100]!r}: create a key "
                "(`dilu keys create NAME --scope admin`) to serve other names")
    if method in SAFE_METHODS:
        return None
    site = headers.get("sec-fetch-site")
    origin = headers.get("origin")
    if site not in (None, "same-origin", "none") or (origin is not None and not _same_origin(origin, host)):
        return (f"a web page from another origin ({(origin or site or '')[:100]}) may not change this "
                "platform: without an API key only the CLI, other non-browser clients and the gateway's own "
                "pages may")
    return None


def _same_origin(origin: str, host: str) -> bool:
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host.strip().lower()
