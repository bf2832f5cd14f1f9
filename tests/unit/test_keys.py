"""API keys: format, scopes, and which scope each route needs."""

from __future__ import annotations

import pytest

from dilu.addresses import is_loopback
from dilu.keys import Need, allows, check_scopes, hash_secret, new_key, parse, secret_matches
from gateway.route_table import route_of


def test_a_new_key_parses_and_matches_only_its_hash() -> None:
    key_id, stored, key = new_key()
    parsed = parse(key)
    assert parsed is not None and parsed[0] == key_id
    assert secret_matches(parsed[1], stored) and not secret_matches(parsed[1] + "x", stored)
    assert stored == hash_secret(parsed[1]) and parsed[1] not in stored
    assert parse("dilu_xyz_abc") is None and parse(key + "!") is None


@pytest.mark.parametrize(("scopes", "need", "function", "allowed"), [
    (["admin"], Need.ADMIN, None, True),
    (["admin"], Need.INVOKE, "fn", True),
    (["read"], Need.READ, None, True),
    (["read"], Need.ADMIN, None, False),
    (["read"], Need.INVOKE, "fn", False),
    (["invoke"], Need.INVOKE, "fn", True),
    (["invoke"], Need.READ, None, False),
    (["invoke:fn"], Need.INVOKE, "fn", True),
    (["invoke:fn"], Need.INVOKE, "fn-2", False),
    (["invoke:fn", "read"], Need.READ, None, True),
    (["invoke:fn"], Need.MODEL, "fn", True),
    (["invoke:fn"], Need.MODEL, "fn-2", False),
    (["read"], Need.MODEL, "fn", True),
    (["invoke:fn"], Need.READ, None, False),
])
def test_scopes(scopes: list[str], need: Need, function: str | None, allowed: bool) -> None:
    assert allows(scopes, need, function) is allowed


@pytest.mark.parametrize("bad", [[], ["root"], ["invoke:"], ["invoke:Bad_Name"], ["read", "write"]])
def test_unknown_scopes_are_refused(bad: list[str]) -> None:
    with pytest.raises(ValueError):
        check_scopes(bad)


@pytest.mark.parametrize(("method", "path", "need", "function"), [
    ("GET", "/healthz", None, None),
    ("GET", "/openapi.json", None, None),
    ("GET", "/metrics", None, None),
    ("POST", "/v1/functions/resnet/invoke", Need.INVOKE, "resnet"),
    ("GET", "/v1/functions", Need.READ, None),
    ("GET", "/v1/functions/resnet/events", Need.READ, None),
    ("GET", "/v1/functions/resnet/logs", Need.ADMIN, None),
    ("GET", "/v1/keys", Need.ADMIN, None),
    ("HEAD", "/v1/bundles/sha256:00", Need.ADMIN, None),
    ("POST", "/v1/functions", Need.ADMIN, None),
    ("DELETE", "/v1/functions/resnet", Need.ADMIN, None),
    ("PATCH", "/v1/functions/resnet/slice", Need.ADMIN, None),
    ("POST", "/v1/functions/a/b/invoke", Need.ADMIN, None),
    ("GET", "/v2", None, None),
    ("GET", "/v2/health/ready", None, None),
    ("GET", "/v2/models/iris", Need.MODEL, "iris"),
    ("GET", "/v2/models/iris/versions/3/ready", Need.MODEL, "iris"),
    ("POST", "/v2/models/iris/infer", Need.INVOKE, "iris"),
    ("POST", "/v2/models/iris/versions/3/infer", Need.INVOKE, "iris"),
    ("POST", "/v2/repository/index", Need.ADMIN, None),
    ("GET", "/dashboard", None, None),
    ("GET", "/dashboard/dashboard.js", None, None),
    ("GET", "/v1/dashboard", Need.READ, None),
    ("POST", "/v1/workflows/amber/invoke", Need.INVOKE, None),
    ("POST", "/v1/workflows", Need.ADMIN, None),
    ("GET", "/v1/workflows/amber", Need.READ, None),
])
def test_every_route_needs_a_scope(method: str, path: str, need: Need | None, function: str | None) -> None:
    route = route_of(method, path, metrics_public=True)
    assert (route.need, route.function) == (need, function)


def test_metrics_can_need_a_key() -> None:
    assert route_of("GET", "/metrics", metrics_public=False).need == Need.READ


@pytest.mark.parametrize(("method", "path", "own_body", "invocation", "fast"), [
    ("POST", "/v1/functions/f/invoke", True, True, "invoke"),
    ("POST", "/v2/models/m/versions/2/infer", True, True, "infer"),
    ("POST", "/v1/chat/completions", True, True, None),
    ("POST", "/v1/workflows/w/invoke", True, False, None),
    ("PUT", "/v1/artifacts/sha256:ab", True, False, None),
    ("POST", "/v1/functions", False, False, None),          # a deploy: bounded, never stopped half-way
    ("DELETE", "/v1/functions/f", False, False, None),
])
def test_one_table_tells_every_layer_its_part(method, path, own_body, invocation, fast) -> None:
    route = route_of(method, path, metrics_public=True)
    assert (route.own_body, route.invocation, route.fast) == (own_body, invocation, fast)


@pytest.mark.parametrize(("host", "loopback"), [("127.0.0.1", True), ("127.0.0.3", True), ("::1", True),
                                                ("localhost", True), ("0.0.0.0", False), ("10.0.0.5", False),
                                                ("gpu-7.internal", False)])
def test_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(("method", "headers", "refused"), [
    ("GET", {"host": "127.0.0.1:8080"}, None),
    ("GET", {"host": "localhost"}, None),
    ("GET", {"host": "[::1]:8080"}, None),
    ("GET", {"host": "evil.example:8080"}, "loopback name"),          # DNS rebinding
    ("GET", {}, "loopback name"),
    ("GET", {"host": "localhost:8080@evil.example"}, "loopback name"),
    ("GET", {"host": "evil.localhost:8080"}, "loopback name"),
    ("GET", {"host": "127.0.0.1.evil.example"}, "loopback name"),
    ("GET", {"host": "[::1]x"}, "loopback name"),
    ("POST", {"host": "127.0.0.1:8080"}, None),                       # the CLI, curl: no Origin
    ("POST", {"host": "127.0.0.1:8080", "origin": "http://127.0.0.1:8080"}, None),   # the gateway's own page
    ("POST", {"host": "127.0.0.1:8080", "origin": "https://evil.example"}, "another origin"),
    ("POST", {"host": "127.0.0.1:8080", "origin": "http://127.0.0.1:3000"}, "another origin"),
    ("POST", {"host": "127.0.0.1:8080", "origin": "null"}, "another origin"),
    ("DELETE", {"host": "127.0.0.1:8080", "sec-fetch-site": "cross-site"}, "another origin"),
    ("GET", {"host": "127.0.0.1:8080", "origin": "https://evil.example"}, None),  # reads: CORS keeps the answer
])
def test_an_open_platform_answers_loopback_names_and_its_own_pages(method: str, headers: dict[str, str],
                                                                   refused: str | None) -> None:
    from gateway.origin import refusal

    why = refusal(method, headers)
    assert (why is None) if refused is None else (why is not None and refused in why)
