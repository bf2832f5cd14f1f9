"""What an attacker (or a careless client) sends to `dilu up`, and what it gets: a web page cannot
drive an open platform, a platform once closed stays closed, bad archives are refused at upload
naming the member, numbers outside the protocol are 400s on every transport, what functions
print reaches the CLI as plain text, and a request whose instance died is retried only where the
function allows it, and the reply says so."""

from __future__ import annotations

import io
import shutil
import tarfile
import uuid
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from dilu.bundles import digest_of
from tests.builders import compression_bomb
from tests.conftest import FIXTURE_FUNCTIONS, ROOT
from tests.waiting import eventually

EVIL = "https://evil.example"


def test_a_web_page_cannot_drive_an_open_platform(start_platform, tmp_path: Path) -> None:
    platform = start_platform()
    http = platform.http
    source = shutil.copytree(FIXTURE_FUNCTIONS / "ok", tmp_path / "ok")
    bundle = _tar_gz({"handler.py": (source / "handler.py").read_bytes()})
    spec = (source / "model.yaml").read_text()

    # DNS rebinding: the page's own name resolves to 127.0.0.1, so the browser sends it as Host.
    rebound = {"host": "evil.example:8080"}
    for reply in (http.post("/v1/bundles", content=bundle, headers=rebound),
                  http.post("/v1/functions", json={"yaml": spec, "source_dir": str(source)}, headers=rebound),
                  http.get("/v1/functions", headers=rebound),
                  http.post("/v1/functions/ok/invoke", json={}, headers=rebound)):
        assert reply.status_code == 403 and "loopback name" in reply.json()["error"], reply.text
    # A cross-origin form POST (the browser names the page's origin): refused before it is read.
    for origin in (EVIL, "null", "http://127.0.0.1:1"):
        for reply in (http.post("/v1/bundles", content=bundle, headers={"origin": origin}),
                      http.post("/v1/functions", json={"yaml": spec, "source_dir": str(source)},
                                headers={"origin": origin, "content-type": "text/plain"})):
            assert reply.status_code == 403 and "another origin" in reply.json()["error"], reply.text
    assert http.get("/v1/functions/ok").status_code == 404        # nothing was deployed

    # The CLI (no Origin) and the gateway's own pages (same origin) still may.
    deployed = platform.cli("deploy", str(source / "model.yaml"))
    assert deployed.returncode == 0, deployed.stderr
    own = http.post("/v1/functions", json={"yaml": spec.replace("plain", "second"), "source_dir": str(source)},
                    headers={"origin": platform.url, "sec-fetch-site": "same-origin"})
    assert own.status_code == 200, own.text
    assert http.get("/healthz", headers=rebound).status_code == 200     # liveness stays answerable


def test_once_closed_a_platform_stays_closed(start_platform) -> None:
    platform = start_platform()
    created = platform.cli("keys", "create", "ops", "--scope", "admin")
    assert created.returncode == 0, created.stderr
    admin = {"authorization": f"Bearer {created.stdout.strip()}"}
    key_id = platform.http.get("/v1/keys", headers=admin).json()[0]["id"]
    assert platform.http.delete(f"/v1/keys/{key_id}", headers=admin).status_code == 200

    # The last key revoked: still closed, to everyone.
    reply = platform.http.get("/v1/functions")
    assert reply.status_code == 401 and "API key" in reply.json()["error"]
    assert platform.http.post("/v1/bundles", content=_tar_gz({"a.py": b""})).status_code == 401

    # Reopening is an explicit act on the database, confirmed.
    refused = platform.cli("keys", "reopen")
    assert refused.returncode == 1 and "--yes" in refused.stderr
    reopened = platform.cli("keys", "reopen", "--yes")
    assert reopened.returncode == 0 and "forgot 1 revoked key" in reopened.stdout, reopened.stderr
    eventually(lambda: platform.http.get("/v1/functions").status_code == 200, timeout=30,
               what="the gateway to read the reopened key table")


def _tar_gz(files: dict[str, bytes], extra: list[tarfile.TarInfo] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        for info in extra or []:
            archive.addfile(info)
    return buffer.getvalue()


def _member(name: str, kind: bytes, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info


def test_bad_archives_are_refused_at_upload_naming_the_member(start_platform) -> None:
    platform = start_platform(env={"DILU_MAX_BUNDLE_BYTES": str(8 * 2**20)})
    handler = {"handler.py": b"class H:\n    pass\n"}
    many = io.BytesIO()
    with tarfile.open(fileobj=many, mode="w:gz") as archive:
        for n in range(20_001):
            archive.addfile(tarfile.TarInfo(f"f/{n}"))
    cases = {
        "'../escape.py' points outside the bundle": _tar_gz({**handler, "../escape.py": b"x"}),
        "'/etc/cron.d/job' points outside the bundle": _tar_gz({**handler, "/etc/cron.d/job": b"x"}),
        "'link' is a link": _tar_gz(handler, [_member("link", tarfile.SYMTYPE, "/etc/shadow")]),
        "'hard' is a link": _tar_gz(handler, [_member("hard", tarfile.LNKTYPE, "../../etc/shadow")]),
        "'pipe' is a device, fifo": _tar_gz(handler, [_member("pipe", tarfile.FIFOTYPE)]),
        "'sda' is a device, fifo": _tar_gz(handler, [_member("sda", tarfile.BLKTYPE)]),
        "over the expansion limit": compression_bomb(2 * 2**30),
        "more than 20000 files": many.getvalue(),
    }
    for message, data in cases.items():
        assert len(data) < 8 * 2**20
        reply = platform.http.post("/v1/bundles", content=data)
        assert reply.status_code == 422 and message in reply.json()["error"], (message, reply.text)
        assert platform.http.head(f"/v1/bundles/{digest_of(data)}").status_code == 404     # nothing stored
    assert platform.http.post("/v1/bundles", content=_tar_gz(handler)).status_code == 201


def test_numbers_outside_the_protocol_are_400_on_every_transport(start_platform, tmp_path: Path) -> None:
    platform = start_platform()
    for name in ("iris", "echo"):
        done = platform.cli("deploy", str(ROOT / "examples" / name / "model.yaml"))
        assert done.returncode == 0, done.stderr
    platform.wait_ready("iris")
    http = platform.http

    reply = http.post("/v1/functions/echo/invoke", content=b'{"x": 1e400}',
                      headers={"content-type": "application/json"})
    assert reply.status_code == 400 and "outside the range of a 64-bit float" in reply.json()["error"]
    done = platform.cli("deploy", str(FIXTURE_FUNCTIONS / "not_finite" / "model.yaml"))
    assert done.returncode == 0, done.stderr
    reply = platform.invoke("not-finite", {})       # the handler's NaN: its 500, never invalid JSON
    assert reply.status_code == 500 and "handler returned a result that is not JSON" in reply.json()["error"]
    workflow = "name: one\nnodes:\n  - {name: only, function: echo}\n"
    assert http.post("/v1/workflows", json={"yaml": workflow}).status_code in (200, 201)
    reply = http.post("/v1/workflows/one/invoke", content=b'{"x": [1, -1e999]}')
    assert reply.status_code == 400 and "outside the range" in reply.json()["error"]

    def v2(shape: list[int], data: bytes) -> httpx.Response:
        header = (f'{{"inputs": [{{"name": "features", "datatype": "FP32", "shape": {shape}, '
                  f'"parameters": {{"binary_data_size": {len(data)}}}}}]}}').encode()
        return http.post("/v2/models/iris/infer", content=header + data,
                         headers={"inference-header-content-length": str(len(header)),
                                  "content-type": "application/octet-stream"})

    huge = v2([0, 2**62], b"")
    assert huge.status_code == 400 and "holds more than" in huge.json()["error"], huge.text
    for bad in (np.nan, np.inf):
        rows = np.array([[5.1, 3.5, 1.4, bad]], dtype="<f4")
        reply = v2([1, 4], rows.tobytes())
        assert reply.status_code == 400 and "'features': element 3 is" in reply.json()["error"], reply.text
    infinite = http.post("/v2/models/iris/infer", content=b'{"inputs": [{"name": "features", "datatype": "FP32", '
                                                          b'"shape": [1, 4], "data": [1, 2, 3, 1e999]}]}')
    assert infinite.status_code == 400 and "outside the range" in infinite.json()["error"]
    assert v2([1, 4], np.ones((1, 4), dtype="<f4").tobytes()).status_code == 200   # the same connection serves on

    client = triton_grpc.InferenceServerClient(platform.grpc_address)
    for shape, values in (([1, 4], np.array([[1, 2, 3, np.nan]], dtype=np.float32)),
                          ([1, 4], np.array([[1, 2, np.inf, 3]], dtype=np.float32))):
        features = triton_grpc.InferInput("features", shape, "FP32")
        features.set_data_from_numpy(values)
        with pytest.raises(InferenceServerException, match="finite numbers only") as refused:
            client.infer("iris", [features])
        assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    client.close()
    with grpc.insecure_channel(platform.grpc_address) as channel:      # a shape no client library would send
        request = service_pb2.ModelInferRequest(model_name="iris", raw_input_contents=[b""])
        request.inputs.add(name="features", datatype="FP32", shape=[0, 2**62])
        with pytest.raises(grpc.RpcError) as refused:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "holds more than" in refused.value.details()
    assert "Traceback" not in platform.role.log()


def test_the_cli_prints_what_functions_produce_as_plain_text(start_platform, tmp_path: Path) -> None:
    platform = start_platform()
    source = shutil.copytree(FIXTURE_FUNCTIONS / "markup", tmp_path / "markup")
    platform.cli("deploy", str(source / "model.yaml"))      # its load fails: what matters is what follows
    eventually(lambda: platform.function("markup")["status"] == "failed", timeout=120, what="the load to fail")
    described = platform.cli("describe", "markup")
    assert described.returncode == 0, described.stderr
    assert "bad [/] tag and [link=http://evil.example]a link[/link]" in described.stdout
    logs = platform.cli("logs", "markup")
    assert logs.returncode == 0, logs.stderr
    assert "[link=http://evil.example]click me[/link]" in logs.stdout and "[/]" in logs.stdout
    assert "\x1b]8;" not in logs.stdout + described.stdout      # no terminal hyperlink was drawn


def test_retries_are_the_functions_choice_and_the_reply_says_so(start_platform, tmp_path: Path,
                                                                instance_visible_dir: Path) -> None:
    platform = start_platform()
    source = shutil.copytree(FIXTURE_FUNCTIONS / "dies_once", tmp_path / "dies")
    deployed = platform.cli("deploy", str(source / "model.yaml"))
    assert deployed.returncode == 0, deployed.stderr

    def two_ready(name: str) -> bool:
        return len([i for i in platform.instances(name) if i["state"] == "ready"]) == 2

    eventually(lambda: two_ready("dies-once"), timeout=120, what="two instances")
    shared = instance_visible_dir        # both instances must see the marker
    marker = shared / uuid.uuid4().hex
    try:
        reply = platform.invoke("dies-once", {"marker": str(marker)})     # latency class: retried
        assert reply.status_code == 200, reply.text
        assert reply.headers["x-dilu-retried"] == "1"
        assert reply.json()["first_run_by"] != reply.json()["served_by"]   # the handler ran twice
    finally:
        marker.unlink(missing_ok=True)

    spec = (source / "model.yaml").read_text() + "idempotent: false\n"
    (source / "model.yaml").write_text(spec)
    assert platform.cli("deploy", str(source / "model.yaml")).returncode == 0
    eventually(lambda: platform.function("dies-once")["version"] == 2 and two_ready("dies-once")
               and all(i["version"] == 2 for i in platform.instances("dies-once") if i["state"] == "ready"),
               timeout=120, what="version 2's instances")
    marker = shared / uuid.uuid4().hex
    try:
        reply = platform.invoke("dies-once", {"marker": str(marker)})
        assert reply.status_code == 502 and "not retried" in reply.json()["error"], reply.text
        assert "x-dilu-retried" not in reply.headers and marker.exists()     # it ran once, and only once
    finally:
        marker.unlink(missing_ok=True)
