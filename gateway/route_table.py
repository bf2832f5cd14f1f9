"""One table of the gateway's routes and their policy, read by every layer in front of the app:
the key check (``gateway.auth``: the scope a route needs, and for which function), the body
limit (``gateway.limits``: whether it bounds the body, or the route reads its own), the fast
path (``gateway.fast_path``: the hot routes served before the framework) and the end of work
whose caller left (``gateway.abandon``: which routes are invocations).

``route_of`` classifies a request once; the outermost layer keeps the answer in the ASGI scope
(``ROUTE_KEY``) for the others (pure).
"""

from __future__ import annotations

from dataclasses import dataclass

from dilu.keys import Need

ROUTE_KEY = "dilu_route"
INVOKE_PREFIX, INVOKE_SUFFIX = "/v1/functions/", "/invoke"
MODELS_PREFIX, INFER_SUFFIX = "/v2/models/", "/infer"
VERSIONS = "/versions/"
OPEN_PATHS = frozenset({"/healthz", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json",
                        "/v2", "/v2/health/live", "/v2/health/ready"})
# The OpenAI routes check the key themselves (per model, in OpenAI's error shape) and read their
# own bodies, bounded like invocations; /v1/models has none.
OPENAI_PATHS = frozenset({"/v1/models", "/v1/completions", "/v1/chat/completions", "/v1/embeddings"})
OPENAI_INVOCATIONS = OPENAI_PATHS - {"/v1/models"}
# Routes that stream their bodies under limits of their own: bundles and weight artifacts (their
# own settings), the inference protocol's requests (DILU_MAX_REQUEST_BYTES).
OWN_BODY_PREFIXES = ("/v1/bundles", "/v1/artifacts", "/v2/")


@dataclass(frozen=True, slots=True)
class Route:
    """What the layers need to know of a request's route."""

    need: Need | None                 # the key's scope it needs (None: open, or checked by the route)
    function: str | None = None       # the function that scope is for (an invocation's, a model's)
    own_body: bool = False            # the route reads and bounds its own body (else DILU_MAX_API_BODY_BYTES)
    invocation: bool = False          # work worth stopping when its caller leaves (never a deploy or a delete)
    fast: str | None = None           # "invoke" or "infer": served by the fast path
    version: str | None = None        # an infer route's model version, when it names one


def _infer_target(path: str) -> tuple[str, str | None] | None:
    """(name, version) of an infer path, None for any other path."""
    if not (path.startswith(MODELS_PREFIX) and path.endswith(INFER_SUFFIX)):
        return None
    name, _, version = path[len(MODELS_PREFIX):-len(INFER_SUFFIX)].partition(VERSIONS)
    if not name or "/" in name or "/" in version or (VERSIONS in path and not version):
        return None
    return name, version or None


def route_of(method: str, path: str, metrics_public: bool) -> Route:
    """The policy of ``method path``: one table for every route, read before anything reads the body."""
    if method == "POST":
        if path.startswith(INVOKE_PREFIX) and path.endswith(INVOKE_SUFFIX):
            name = path[len(INVOKE_PREFIX):-len(INVOKE_SUFFIX)]
            if name and "/" not in name:
                return Route(Need.INVOKE, name, own_body=True, invocation=True, fast="invoke")
        if (target := _infer_target(path)) is not None:
            return Route(Need.INVOKE, target[0], own_body=True, invocation=True, fast="infer", version=target[1])
        if path in OPENAI_INVOCATIONS:
            return Route(None, own_body=True, invocation=True)
        if path.startswith("/v1/workflows/") and path.endswith("/invoke"):
            return Route(Need.INVOKE, own_body=True)    # it invokes several functions: the scope for all
    if path in OPEN_PATHS or (path == "/metrics" and metrics_public):
        return Route(None)
    if method in ("GET", "HEAD") and (path == "/dashboard" or path.startswith("/dashboard/")):
        return Route(None)   # the page and its script hold no data; what they fetch needs a key
    if path in OPENAI_PATHS:
        return Route(None)
    own = path.startswith(OWN_BODY_PREFIXES)
    parts = path.strip("/").split("/")
    if parts == ["v2", "models", "stats"] and method in ("GET", "HEAD"):
        return Route(Need.READ, own_body=own)      # every model's statistics
    if parts[:2] == ["v2", "models"] and len(parts) >= 3:
        # /v2/models/{name}[/versions/{v}][/ready|/config|/stats|/infer]
        return Route(Need.INVOKE if method == "POST" else Need.MODEL, parts[2], own_body=own)
    if method in ("GET", "HEAD"):
        if (len(parts) == 4 and parts[:2] == ["v1", "functions"] and parts[3] == "logs") or \
                parts[:2] in (["v1", "keys"], ["v1", "bundles"], ["v1", "artifacts"]):
            return Route(Need.ADMIN, own_body=own)
        return Route(Need.READ, own_body=own)
    return Route(Need.ADMIN, own_body=own)


def route_in(scope: dict, metrics_public: bool = True) -> Route:
    """The request's route, classified once per request and kept in its scope."""
    route = scope.get(ROUTE_KEY)
    if route is None:
        route = scope[ROUTE_KEY] = route_of(scope["method"], scope["path"], metrics_public)
    return route
