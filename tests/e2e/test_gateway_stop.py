"""A stopping gateway answers everyone: a request waiting for a cold start gets a 503 at once (it
would hold the stop up for its queue timeout), and work still in flight once the stop drain
(``DILU_STOP_DRAIN_S``) is over gets a 503, a stream its error frame, never a cut body, a 500 or
a traceback in the log."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

from tests.conftest import FIXTURE_FUNCTIONS
from tests.waiting import eventually


def _answer(connection: socket.socket) -> tuple[str, dict]:
    """The status line and JSON body of the one answer on ``connection`` (closed after it)."""
    reply = b""
    while chunk := connection.recv(65536):
        reply += chunk
    connection.close()
    head, _, body = reply.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0].decode(), json.loads(body)


def test_a_stopping_gateway_answers_queued_and_unfinished_work(start_platform, tmp_path: Path) -> None:
    platform = start_platform(env={"DILU_STOP_DRAIN_S": "1"})
    cold = shutil.copytree(FIXTURE_FUNCTIONS / "step", tmp_path / "cold")
    text = (cold / "model.yaml").read_text().replace("name: step", "name: cold")
    (cold / "model.yaml").write_text(text + "model: {op: add, load_s: 60}\n")
    assert platform.deploy_file(cold / "model.yaml").status_code == 201
    slow = shutil.copytree(FIXTURE_FUNCTIONS / "slow_stream", tmp_path / "slow")
    (slow / "model.yaml").write_text((slow / "model.yaml").read_text() + "model: {step_s: 0.05}\n")
    assert platform.cli("deploy", str(slow / "model.yaml")).returncode == 0

    queued = platform.send_unread("/v1/functions/cold/invoke", {"x": 1})
    eventually(lambda: platform.function("cold")["queued_requests"] == 1, timeout=30, what="the request queued")
    whole = platform.send_unread("/v1/functions/slow-stream/invoke", {"max_new_tokens": 2000})
    with platform.http.stream("POST", "/v1/functions/slow-stream/invoke", json={"max_new_tokens": 2000},
                              headers={"accept": "application/x-ndjson"}) as stream:
        lines = stream.iter_lines()
        assert json.loads(next(lines))["text"] == "x"
        eventually(lambda: platform.function("slow-stream")["in_flight_requests"] == 2, timeout=30,
                   what="both long requests at the instance")
        assert platform.role.stop() == 130          # SIGINT, and it exited on its own
        streamed = [json.loads(line) for line in lines if line]

    status, body = _answer(queued)
    assert status == "HTTP/1.1 503 Service Unavailable" and "the gateway is stopping" in body["error"], body
    status, body = _answer(whole)
    assert status == "HTTP/1.1 503 Service Unavailable", (status, body)
    assert "the gateway stopped before the answer came" in body["error"], body
    *chunks, last = streamed
    assert all(chunk["text"] == "x" for chunk in chunks)
    assert last["status"] == 503 and last["error"].startswith("stream cut: the gateway stopped"), last
    log = platform.role.log()
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
