"""Bad input gets a clear error naming what is wrong, and the platform keeps serving others."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path

import httpx
import pytest

from tests.conftest import FIXTURE_FUNCTIONS
from tests.platform import dilu_executable
from tests.waiting import eventually


@pytest.fixture
def serving(start_platform, tmp_path: Path):
    """A platform with a small body limit and a healthy function that must keep working."""
    platform = start_platform(env={"DILU_MAX_REQUEST_BYTES": "2048", "DILU_MAX_BUNDLE_BYTES": str(2**20)})
    source = shutil.copytree(FIXTURE_FUNCTIONS / "ok", tmp_path / "ok")
    assert platform.cli("deploy", str(source / "model.yaml")).returncode == 0
    yield platform
    reply = platform.invoke("ok", {"still": "serving"})
    assert reply.status_code == 200 and reply.json()["input"] == {"still": "serving"}


def _write(tmp_path: Path, text: str, handler_from: str | None = "ok") -> Path:
    folder = tmp_path / "spec"
    if handler_from and not folder.exists():
        shutil.copytree(FIXTURE_FUNCTIONS / handler_from, folder)
    folder.mkdir(exist_ok=True)
    spec = folder / "model.yaml"
    spec.write_text(text)
    return spec


@pytest.mark.parametrize(("label", "yaml_text", "message"), [
    ("malformed YAML", "name: x\nhandler: [handler:Echo\n", "malformed YAML at line"),
    ("unknown field", "name: x\nhandler: handler:Echo\nreplica: 2\n", "replica (line 3): unknown field"),
    ("mistyped field", "name: x\nhandler: handler:Echo\nscaling:\n  max_instances: many\n",
     "scaling.max_instances (line 4)"),
    ("handler module that does not exist", "name: x\nhandler: nowhere:Thing\n", "module 'nowhere' not found"),
    ("text generator that cannot stream", "name: x\nhandler: handler:Echo\ngenerates: text\n",
     "generates: text, but the handler class 'Echo' has no start and step()"),
])
def test_invalid_specs_are_refused_by_deploy(serving, tmp_path: Path, label: str, yaml_text: str,
                                             message: str) -> None:
    result = serving.cli("deploy", str(_write(tmp_path, yaml_text)))
    assert result.returncode == 1, label
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    reply = serving.deploy_file(tmp_path / "spec" / "model.yaml")
    assert reply.status_code == 422 and message in reply.json()["error"]
    assert serving.http.get("/v1/functions/x").status_code == 404


@pytest.mark.parametrize(("folder", "message"), [
    ("bad_import", "No module named 'module_that_does_not_exist'"),
    ("bad_load", "RuntimeError: weights file is corrupt"),
    ("no_class", "handler class 'Missing' not found"),
])
def test_handler_that_cannot_load_fails_the_deploy_with_its_error(serving, tmp_path: Path, folder: str,
                                                                  message: str) -> None:
    source = shutil.copytree(FIXTURE_FUNCTIONS / folder, tmp_path / folder)
    name = (source / "model.yaml").read_text().split("\n")[0].split(": ")[1]
    result = serving.cli("deploy", str(source / "model.yaml"))
    assert result.returncode == 1 and message in result.stderr, result.stderr
    assert f"dilu logs {name}" in result.stderr
    logs = serving.cli("logs", name)
    assert "Traceback" in logs.stdout and message in logs.stdout
    assert serving.function(name)["status"] == "failed"
    # No retry storm: the failed function is not restarted.
    instances = serving.http.get(f"/v1/functions/{name}/instances", params={"all": True}).json()
    assert len(instances) == 1 and instances[0]["state"] == "failed"
    reply = serving.invoke(name, {})
    assert reply.status_code == 503 and message in reply.json()["error"]


def test_bad_requests_get_json_errors(serving) -> None:
    cases = [
        (serving.http.post("/v1/functions/ok/invoke", content=b"{not json"), 400, "not valid JSON"),
        (serving.http.post("/v1/functions/ghost/invoke", json={}), 404, "function 'ghost' not found"),
        (serving.http.post("/v1/functions/ok/invoke", json={"blob": "x" * 4096}), 413, "exceeds the limit of 2048"),
        (serving.http.post("/v1/functions", content=b"[[["), 422, ""),
        (serving.http.post("/v1/functions", json={"source_dir": "/tmp"}), 422, "give the spec"),
        (serving.http.get("/v1/functions/ghost"), 404, "not found"),
        (serving.http.delete("/v1/functions/ghost"), 404, "not found"),
        (serving.http.get("/no/such/route"), 404, "Not Found"),
        # Code bundles: only gzipped tars, within the limit, and a deploy names one that exists.
        (serving.http.post("/v1/bundles", content=b"PK\x03\x04 a zip"), 400, "gzipped tar"),
        (serving.http.post("/v1/bundles", content=b"\x1f\x8b" + b"0" * (2 * 2**20)), 413, "over the limit"),
        (serving.http.post("/v1/functions", json={"yaml": "name: x\nhandler: h:H\n", "bundle": "sha256:" + "0" * 64}),
         422, "is not uploaded"),
        (serving.http.post("/v1/functions", json={"yaml": "name: x\nhandler: h:H\n"}), 422, "give exactly one of"),
        (serving.http.post("/v1/functions", json={"yaml": "name: x\nhandler: h:H\nimage: repo/x:1\n",
                                                  "source_dir": "/tmp"}), 422, "got source_dir, image"),
        (serving.http.head("/v1/bundles/sha256:nothex"), 422, None),
    ]
    for reply, status, message in cases:
        assert reply.status_code == status, (reply.request.url, reply.text)
        if message is not None:   # a HEAD answer has no body
            assert message in reply.json()["error"], reply.text


def _oversized(tmp_path: Path) -> Path:
    """A function folder whose packed size is past the CLI's bundle limit (sparse: no disk used)."""
    folder = shutil.copytree(FIXTURE_FUNCTIONS / "ok", tmp_path / "oversized")
    with open(folder / "huge.bin", "wb") as handle:
        handle.truncate(9 * 2**20)      # past 8x the 1 MiB limit: refused before packing
    return folder


def test_cli_errors_are_one_line_messages(serving, tmp_path: Path) -> None:
    for args, message in [
        (["invoke", "ghost"], "function 'ghost' not found"),
        (["invoke", "ok", "--data", "{oops"], "--data is not valid JSON"),
        (["invoke", "ok", "--data", "@/no/such/file.json"], "cannot read /no/such/file.json"),
        (["deploy", str(tmp_path / "missing.yaml")], "no such file"),
        (["rm", "ghost"], "not found"),
        (["describe", "ghost"], "not found"),
        (["deploy", str(_oversized(tmp_path) / "model.yaml")],
         "over the 1.0 MiB bundle limit; largest files: huge.bin"),
    ]:
        result = serving.cli(*args)
        assert result.returncode == 1, args
        assert message in result.stderr and "Traceback" not in result.stderr, (args, result.stderr)


def test_cli_reports_an_unreachable_gateway(serving) -> None:
    import os
    import subprocess

    from tests.platform import dilu_executable

    result = subprocess.run([dilu_executable(), "ls"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "DILU_URL": "http://127.0.0.1:9"})
    assert result.returncode == 1 and "cannot reach the Dilu gateway" in result.stderr


def test_cold_start_queue_overflow_and_deadline(start_platform, tmp_path: Path,
                                                instance_visible_dir: Path) -> None:
    platform = start_platform(env={"DILU_QUEUE_SIZE": "1", "DILU_QUEUE_TIMEOUT_S": "1.5"})
    release = instance_visible_dir / "release"
    source = shutil.copytree(FIXTURE_FUNCTIONS / "slow_load", tmp_path / "slow")
    (source / "model.yaml").write_text(
        "name: slow\nhandler: handler:SlowLoad\nresources:\n  memory: 64Mi\n  gpu: false\n"
        f"model:\n  release_file: {release}\n")
    assert platform.cli("deploy", str(source / "model.yaml"), "--no-wait").returncode == 0

    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(platform.invoke, "slow", {"n": 1})
        eventually(lambda: platform.function("slow")["queued_requests"] == 1, timeout=30, what="a queued request")
        second = platform.invoke("slow", {"n": 2})
        assert second.status_code == 429 and second.headers["retry-after"] == "1"
        assert "already wait" in second.json()["error"]
        timed_out = first.result(60)
    assert timed_out.status_code == 504 and "became ready within 1.5s" in timed_out.json()["error"]

    release.write_text("go")
    platform.wait_ready("slow")
    reply = platform.invoke("slow", {"n": 3})
    assert reply.status_code == 200 and reply.json() == {"input": {"n": 3}}



async def test_a_bad_input_in_a_batch_fails_only_its_own_request(serving, tmp_path: Path) -> None:
    """Eight concurrent requests batched together: the malformed one gets 422, the one the
    handler fails on gets 500 with the handler's message, the six others their results."""
    source = shutil.copytree(FIXTURE_FUNCTIONS / "picky", tmp_path / "picky")
    assert serving.cli("deploy", str(source / "model.yaml")).returncode == 0
    serving.wait_ready("picky")
    bodies = [{"x": 1}, {"x": 4}, {"x": "four"}, {"x": 9}, {"x": -1}, {"x": 16}, {"x": 25}, {"x": 36}]
    async with httpx.AsyncClient(base_url=serving.url, timeout=60) as client:
        replies = await asyncio.gather(*(client.post("/v1/functions/picky/invoke", json=b) for b in bodies))
    statuses = [r.status_code for r in replies]
    assert statuses == [200, 200, 422, 200, 500, 200, 200, 200], [r.text for r in replies]
    assert [r.json()["root"] for r in replies if r.status_code == 200] == [1, 2, 3, 4, 5, 6]
    assert "x must be a number, got 'four'" in replies[2].json()["error"]
    assert "negative number" in replies[4].json()["error"]
    assert max(int(r.headers["x-dilu-batch-size"]) for r in replies if r.status_code == 200) > 1, \
        "the requests were batched together"
    # The failure's traceback is in the instance's log, once however many requests hit it, and
    # `dilu logs -f` prints it as it comes.
    following = subprocess.Popen([dilu_executable(), "logs", "picky", "--follow"], stdout=subprocess.PIPE,
                                 text=True, env={**os.environ, **serving.env, "DILU_URL": serving.url})
    printed: list[str] = []

    def read() -> None:
        for line in following.stdout:
            printed.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    for _ in range(3):
        assert serving.invoke("picky", {"x": -4}).status_code == 500
    eventually(lambda: any("predict() failed" in line for line in printed), timeout=30, what="logs -f to print it")
    following.send_signal(signal.SIGINT)
    assert following.wait(30) == 0
    reader.join(10)
    following.stdout.close()
    logs = serving.cli("logs", "picky").stdout
    assert logs.count("predict() failed") == 1, logs
    assert "Traceback" in logs and "RuntimeError: cannot take the square root of a negative number" in logs
    assert "x must be a number" not in logs        # the caller's own mistake is theirs to read, not logged
