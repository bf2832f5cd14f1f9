"""Two gateways serving one workflow share what its requests said: a gateway decides from every
request's record, whichever gateway ran it (PostgreSQL and Redis shared, as in production)."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from tests.conftest import FIXTURE_FUNCTIONS
from tests.e2e.conftest import backend_env
from tests.platform import start_role

SPEC = ("name: pair\nloading: slack\nnodes:\n"
        "  - {name: a, function: first}\n  - {name: b, function: second, after: [a]}\n")


def test_a_gateway_decides_from_the_requests_the_other_gateway_served(start_platform, tmp_path: Path,
                                                                       request: pytest.FixtureRequest) -> None:
    env = backend_env("postgres+redis", request)
    platform = start_platform(env=env)
    # The root loads for half a second: its cold start shows (no slack hides a root's), so only
    # the gaps between requests decide whether to hold it.
    for name, load_s in (("first", 0.5), ("second", 0.0)):
        folder = shutil.copytree(FIXTURE_FUNCTIONS / "step", tmp_path / name)
        text = (folder / "model.yaml").read_text().replace("name: step", f"name: {name}")
        (folder / "model.yaml").write_text(text + f"model: {{op: add, amount: 1, load_s: {load_s}}}\n")
        assert platform.cli("deploy", str(folder / "model.yaml")).returncode == 0
    (tmp_path / "pair.yaml").write_text(SPEC)
    assert platform.cli("workflow", "deploy", str(tmp_path / "pair.yaml")).returncode == 0
    other = start_role(["gateway"], {**env, "DILU_PORT": "0", "DILU_HOME": str(tmp_path / "other")},
                       tmp_path / "other-gateway.log")
    try:
        with httpx.Client(base_url=other.url, timeout=60) as second:
            for gateway in (platform.http, platform.http, second):   # the third request at the other gateway
                reply = gateway.post("/v1/workflows/pair/invoke", json={"x": 1})
                assert reply.status_code == 200 and reply.json() == {"x": 3}
            # Three arrivals make two gaps, enough to weigh holding each node: a gateway that
            # knew only the one request it served would still answer "too few requests".
            keep = second.get("/v1/workflows/pair").json()["keep"]
            assert set(keep) == {"a", "b"} and all(v["verdict"] != "default" for v in keep.values()), keep
            assert platform.http.get("/v1/workflows/pair").json()["keep"] == keep
    finally:
        other.stop()
