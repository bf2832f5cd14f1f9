"""Deploys an attacker or a careless user would send: ten at once of one new name, one that no
worker can ever hold, a delete in the middle of profiling. Each gets a clear answer, and the
platform's log stays free of tracebacks."""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.conftest import FIXTURE_FUNCTIONS
from tests.waiting import eventually


def test_concurrent_deploys_impossible_deploys_and_deletes(start_platform, tmp_path: Path) -> None:
    # Slow trials, so the delete below lands in the middle of profiling.
    platform = start_platform(env={"DILU_PROFILING": "true", "DILU_PROFILE_TRIAL_S": "2"})
    source = shutil.copytree(FIXTURE_FUNCTIONS / "ok", tmp_path / "ok")
    text = (source / "model.yaml").read_text()

    def deploy(n: int) -> tuple[int, int]:
        reply = platform.http.post("/v1/functions", json={"yaml": text.replace("name: ok", "name: race")
                                                          .replace("plain", f"flavour-{n}"),
                                                          "source_dir": str(source)})
        return reply.status_code, reply.json().get("version", -1)

    with ThreadPoolExecutor(10) as pool:
        results = list(pool.map(deploy, range(10)))
    assert sorted(status for status, _ in results) == [200] * 9 + [201]
    assert sorted(version for _, version in results) == list(range(1, 11))
    assert platform.function("race")["version"] == 10

    # A memory slice no worker has: failed at once with the reason; invokes answered 503 at once.
    huge = text.replace("name: ok", "name: huge").replace("memory: 64Mi", "memory: 64Ti")
    assert platform.http.post("/v1/functions", json={"yaml": huge, "source_dir": str(source)}).status_code == 201
    failed = eventually(lambda: (f := platform.function("huge"))["status"] == "failed" and f, timeout=30,
                        what="the impossible deployment to fail")
    assert "no worker can ever hold" in failed["error"]
    started = time.monotonic()
    reply = platform.invoke("huge", {})
    assert reply.status_code == 503 and "no worker can ever hold" in reply.json()["error"]
    assert time.monotonic() - started < 5      # at once, not after the queue's timeout

    # Deleted while profiling: no traceback anywhere.
    profiled = text.replace("name: ok", "name: doomed")
    assert platform.http.post("/v1/functions", json={"yaml": profiled, "source_dir": str(source)}).status_code == 201
    eventually(lambda: platform.function("doomed")["status"] == "profiling", timeout=30, what="profiling")
    assert platform.http.delete("/v1/functions/doomed").status_code == 200
    assert platform.http.get("/v1/functions/doomed").status_code == 404
    eventually(lambda: "profiling of doomed version 1 stopped" in platform.role.log(), timeout=30,
               what="the deleted function's profiling job to stop")
    eventually(lambda: platform.function("race")["status"] == "ready", timeout=120, what="the race winner ready")
    assert "Traceback" not in platform.role.log()


def test_code_comes_only_from_the_function(start_platform, tmp_path: Path) -> None:
    import os
    import sys

    platform = start_platform()
    marker = tmp_path / "pwned"
    spec = f"name: evil\nhandler: os:system\nmodel: {{command: 'touch {marker}'}}\n"
    stdlib = os.path.dirname(os.__file__)

    # A local path outside the allowed roots (here: Python's standard library) is refused.
    reply = platform.http.post("/v1/functions", json={"yaml": spec, "source_dir": stdlib})
    assert reply.status_code == 422 and "outside the folders local deploys may use" in reply.json()["error"]

    # A bundle with its own os.py: the name resolves to the standard library's module, which is
    # not the function's code, so the instance refuses to load it and nothing runs.
    folder = tmp_path / "evil"
    folder.mkdir()
    (folder / "os.py").write_text("def system(command):\n    return 0\n")
    (folder / "model.yaml").write_text(spec + "resources: {sm_request: 0.5, sm_limit: 1.0}\n")
    deployed = platform.cli("deploy", str(folder / "model.yaml"))
    assert deployed.returncode == 1 and "outside the function's code" in deployed.stderr, deployed.stderr
    assert not marker.exists()
    assert sys.modules["os"].__file__.startswith(stdlib)
