"""API keys: a platform is open until its first key; then every route but /healthz and /metrics
needs a key whose scopes allow it, the CLI sends DILU_API_KEY, revoking takes effect at once,
and a gateway on a non-loopback address refuses to start without keys."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.conftest import FIXTURE_FUNCTIONS
from tests.platform import dilu_executable


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def test_keys_and_scopes(start_platform, tmp_path: Path) -> None:
    platform = start_platform()
    source = shutil.copytree(FIXTURE_FUNCTIONS / "ok", tmp_path / "ok")
    assert platform.cli("deploy", str(source / "model.yaml")).returncode == 0   # open: no key yet
    assert "open to anyone" in platform.role.log()

    created = platform.cli("keys", "create", "ops", "--scope", "admin")
    assert created.returncode == 0, created.stderr
    admin = created.stdout.strip()
    assert admin.startswith("dilu_") and "not shown again" in created.stderr
    http = platform.http

    # Now closed: no key, a malformed one, a made-up one.
    for headers in ({}, bearer("nonsense"), bearer("dilu_000000000000_" + "A" * 43)):
        reply = http.get("/v1/functions", headers=headers)
        assert reply.status_code == 401 and "API key" in reply.json()["error"]
        assert reply.headers["www-authenticate"].startswith("Bearer")
    assert http.post("/v1/functions/ok/invoke", json={}).status_code == 401   # the fast path too
    assert http.get("/healthz").status_code == 200 and http.get("/metrics").status_code == 200

    def key(*scopes: str) -> str:
        reply = http.post("/v1/keys", json={"name": "k", "scopes": list(scopes)}, headers=bearer(admin))
        assert reply.status_code == 201, reply.text
        return reply.json()["key"]

    reader, invoker, ok_only = key("read"), key("invoke"), key("invoke:ok")
    assert http.get("/v1/functions", headers=bearer(reader)).status_code == 200
    for forbidden in (http.delete("/v1/functions/ok", headers=bearer(reader)),
                      http.get("/v1/functions/ok/logs", headers=bearer(reader)),
                      http.post("/v1/functions/ok/invoke", json={}, headers=bearer(reader)),
                      http.get("/v1/functions", headers=bearer(invoker)),
                      http.post("/v1/keys", json={"name": "x", "scopes": ["admin"]}, headers=bearer(invoker)),
                      http.post("/v1/functions/other/invoke", json={}, headers=bearer(ok_only))):
        assert forbidden.status_code == 403, (forbidden.request.url, forbidden.text)
        assert "do not allow" in forbidden.json()["error"]
    for allowed_key in (invoker, ok_only, admin):
        reply = http.post("/v1/functions/ok/invoke", json={"k": 1}, headers=bearer(allowed_key))
        assert reply.status_code == 200 and reply.json()["input"] == {"k": 1}
    # An instance answers only under its secret path, which only admins are shown: a caller who
    # found its port cannot bypass the gateway.
    full = http.get("/v1/functions/ok/instances", headers=bearer(admin)).json()[0]["endpoint"]
    bare = http.get("/v1/functions/ok/instances", headers=bearer(reader)).json()[0]["endpoint"]
    assert full.startswith(bare + "/i/") and len(full) > len(bare) + 10
    assert httpx.post(bare + "/infer", json={"d": 1}).status_code == 404
    assert httpx.get(bare + "/health").status_code == 404
    assert httpx.post(full + "/infer", json={"d": 1}).json()["input"] == {"d": 1}

    bad_scope = http.post("/v1/keys", json={"name": "x", "scopes": ["root"]}, headers=bearer(admin))
    assert bad_scope.status_code == 422 and "unknown scope 'root'" in bad_scope.json()["error"]

    # The CLI sends DILU_API_KEY, and says what is wrong without it.
    platform.env["DILU_API_KEY"] = reader
    listed = platform.cli("ls")
    assert listed.returncode == 0 and "ok" in listed.stdout
    denied = platform.cli("rm", "ok")
    assert denied.returncode == 1 and "do not allow admin" in denied.stderr
    platform.env.pop("DILU_API_KEY")
    missing = platform.cli("ls")
    assert missing.returncode == 1 and "DILU_API_KEY" in missing.stderr

    # Keys are listed without their secrets; revoking works at once.
    platform.env["DILU_API_KEY"] = admin
    listing = platform.cli("keys", "ls")
    assert listing.returncode == 0 and admin not in listing.stdout and "ops" in listing.stdout
    reader_id = reader.split("_")[1]
    assert platform.cli("keys", "revoke", reader_id).returncode == 0
    assert http.get("/v1/functions", headers=bearer(reader)).status_code == 401
    assert platform.cli("keys", "revoke", reader_id).returncode == 1   # not active any more


def test_exposed_gateway_needs_keys(tmp_path: Path) -> None:
    env = {"DILU_HOME": str(tmp_path / "home"), "DILU_HOST": "0.0.0.0", "DILU_PORT": "0", "DILU_GPUS": "none"}
    import os

    refused = subprocess.run([dilu_executable(), "up"], env={**os.environ, **env}, capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 1
    assert "reachable from other machines" in refused.stderr and "DILU_ADMIN_KEY" in refused.stderr
    assert "Traceback" not in refused.stderr

    from tests.platform import start_role

    role = start_role(["up"], {**env, "DILU_ADMIN_KEY": "k" * 32}, tmp_path / "up.log")
    try:
        port = role.url.rsplit(":", 1)[1]
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            assert http.get("/v1/status").status_code == 401
            assert http.get("/v1/status", headers=bearer("k" * 32)).status_code == 200
    finally:
        role.stop()


def test_exposed_worker_needs_the_cluster_key(tmp_path: Path) -> None:
    import os

    env = {"DILU_HOME": str(tmp_path / "home"), "DILU_HOST": "0.0.0.0", "DILU_PORT": "0", "DILU_GPUS": "none"}
    refused = subprocess.run([dilu_executable(), "worker"], env={**os.environ, **env}, capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 1 and "DILU_CLUSTER_KEY" in refused.stderr and "Traceback" not in refused.stderr


def test_python_client_sends_the_key(start_platform, tmp_path: Path, monkeypatch) -> None:
    from dilu.client import Client, DiluError

    admin = "client-admin-key-0123456789abcdef"
    platform = start_platform(env={"DILU_ADMIN_KEY": admin, "DILU_API_KEY": admin})
    source = shutil.copytree(FIXTURE_FUNCTIONS / "ok", tmp_path / "ok")
    assert platform.cli("deploy", str(source / "model.yaml")).returncode == 0
    with Client(platform.url, api_key="") as anonymous, pytest.raises(DiluError) as refused:
        anonymous.invoke("ok", {"k": 1})
    assert refused.value.status == 401 and "API key" in refused.value.message
    monkeypatch.setenv("DILU_URL", platform.url)
    monkeypatch.setenv("DILU_API_KEY", admin)
    with Client() as client:                      # both from the environment, as the CLI does
        assert client.invoke("ok", {"k": 1})["input"] == {"k": 1}
        assert [f["name"] for f in client.functions()] == ["ok"]
        with pytest.raises(DiluError) as missing:
            client.function("missing")
        assert missing.value.status == 404
