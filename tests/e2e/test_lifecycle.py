"""Deploy, invoke, inspect and delete a function through the CLI and HTTP, on both backends."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import FIXTURE_FUNCTIONS
from tests.e2e.conftest import backend_env
from tests.waiting import eventually


@pytest.mark.parametrize("backend", ["embedded", "postgres+redis"])
def test_deploy_invoke_inspect_delete(backend: str, start_platform, request: pytest.FixtureRequest,
                                      tmp_path: Path) -> None:
    platform = start_platform(env=backend_env(backend, request))
    source = shutil.copytree(FIXTURE_FUNCTIONS / "ok", tmp_path / "ok")

    deployed = platform.cli("deploy", str(source / "model.yaml"))
    assert deployed.returncode == 0, deployed.stderr
    assert "ready" in deployed.stdout and f"{platform.url}/v1/functions/ok/invoke" in deployed.stdout

    invoked = platform.cli("invoke", "ok", "--data", '{"x": 1}')
    assert invoked.returncode == 0, invoked.stderr
    result = json.loads(invoked.stdout)
    assert result["input"] == {"x": 1} and result["greeting"] == "hello" and result["options"] == {"flavour": "plain"}

    (tmp_path / "req.json").write_text('{"from": "file"}')
    assert json.loads(platform.cli("invoke", "ok", "--data", f"@{tmp_path / 'req.json'}").stdout)["input"] == \
        {"from": "file"}
    reply = platform.invoke("ok", [1, 2, 3])
    assert reply.status_code == 200 and reply.json()["input"] == [1, 2, 3]
    assert reply.headers["x-dilu-batch-size"] == "1" and reply.headers["x-dilu-instance"].startswith("ok-")

    listing = platform.cli("ls")
    assert listing.returncode == 0 and "ok" in listing.stdout and "ready" in listing.stdout
    described = platform.cli("describe", "ok")
    assert described.returncode == 0 and "ready" in described.stdout and "deployed" in described.stdout
    logs = platform.cli("logs", "ok")
    assert logs.returncode == 0 and "ready" in logs.stdout
    paths = platform.http.get("/openapi.json").json()["paths"]
    assert {"/v1/functions", "/v1/functions/{name}/invoke", "/v1/functions/{name}/slice"} <= set(paths)
    status = platform.cli("status")
    assert status.returncode == 0 and "alive" in status.stdout
    assert "controller: " in status.stdout and " leads (term " in status.stdout, status.stdout
    expected_db = "sqlite" if backend == "embedded" else "postgresql"
    assert expected_db in status.stdout

    # Request counters reach durable state.
    eventually(lambda: platform.function("ok")["requests_total"] == 3, timeout=30, what="request counters")

    pid = platform.invoke("ok", {}).json()["pid"]
    removed = platform.cli("rm", "ok")
    assert removed.returncode == 0, removed.stderr
    assert platform.http.get("/v1/functions/ok").status_code == 404
    assert platform.invoke("ok", {}).status_code == 404

    def process_gone() -> bool:
        try:
            Path(f"/proc/{pid}/status").read_text()
        except FileNotFoundError:
            return True
        return "zombie" in Path(f"/proc/{pid}/status").read_text()

    eventually(process_gone, timeout=30, what="the deleted function's instance to stop")


def test_redeploy_rolls_out_a_new_version(start_platform, tmp_path: Path) -> None:
    platform = start_platform()
    source = shutil.copytree(FIXTURE_FUNCTIONS / "ok", tmp_path / "ok")
    assert platform.cli("deploy", str(source / "model.yaml")).returncode == 0
    first_pid = platform.invoke("ok", {}).json()["pid"]
    spec = source / "model.yaml"
    spec.write_text(spec.read_text().replace("flavour: plain", "flavour: spicy"))
    redeployed = platform.cli("deploy", str(spec))
    assert redeployed.returncode == 0, redeployed.stderr
    assert "version 2" in redeployed.stdout

    def new_version_serves() -> bool:
        body = platform.invoke("ok", {}).json()
        return body["options"] == {"flavour": "spicy"} and body["pid"] != first_pid

    eventually(new_version_serves, timeout=60, what="version 2 to serve")
    eventually(lambda: all(i["version"] == 2 for i in platform.instances("ok")), timeout=60,
               what="version 1 instances to stop")
