"""The CLI as a newcomer meets it: `dilu init` gives a function that deploys and answers as it
is, tables off a terminal are whole, `-o json` is the API's own objects, and `dilu invoke
--stream` prints chunks as they come and fails (exit 1) on a stream that did not finish."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import FIXTURE_FUNCTIONS

REPO = FIXTURE_FUNCTIONS.parents[2]


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    from tests.platform import Platform

    started = Platform(tmp_path_factory.mktemp("cli") / "home")
    for spec in (FIXTURE_FUNCTIONS / "counter_stream" / "model.yaml", REPO / "examples" / "echo" / "model.yaml"):
        deployed = started.cli("deploy", str(spec))
        assert deployed.returncode == 0, deployed.stderr
    yield started
    started.close()


def test_init_writes_a_function_that_deploys_and_answers_as_it_is(platform, tmp_path: Path) -> None:
    folder = tmp_path / "my-model"
    made = platform.cli("init", "my-model", "--dir", str(folder))
    assert made.returncode == 0, made.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["handler.py", "model.yaml", "request.json"]
    assert f"dilu deploy {folder / 'model.yaml'}" in made.stdout
    deployed = platform.cli("deploy", str(folder / "model.yaml"))
    assert deployed.returncode == 0, deployed.stderr
    answer = platform.cli("invoke", "my-model", "--data", f"@{folder / 'request.json'}")
    assert answer.returncode == 0, answer.stderr
    assert len(json.loads(answer.stdout)["scores"]) == 2
    refused = platform.invoke("my-model", {"x": "three numbers"})
    assert refused.status_code == 422 and "3 numbers" in refused.json()["error"]
    # Nothing of an existing folder is overwritten; a name the spec would refuse is refused here.
    again = platform.cli("init", "my-model", "--dir", str(folder))
    assert again.returncode == 1 and "already exists" in again.stderr
    assert platform.cli("init", "My Model", "--dir", str(tmp_path / "other")).returncode == 1
    assert not (tmp_path / "other").exists()


def test_tables_off_a_terminal_keep_every_column_whole(platform) -> None:
    described = platform.cli("describe", "counter")   # captured: not a terminal
    assert described.returncode == 0, described.stderr
    header = next(line for line in described.stdout.splitlines() if "INSTANCE" in line)
    for column in ("WORKER", "VERSION", "STATE", "ENDPOINT", "SLICE", "GRANTED", "USED", "KLC", "HELD", "PROGRESS"):
        assert column in header, header
    (instance,) = [i for i in platform.instances("counter") if i["state"] == "ready"]
    assert instance["id"] in described.stdout and "…" not in described.stdout


def test_output_json_is_the_apis_own_objects(platform) -> None:
    listed = platform.cli("ls", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    assert sorted(f["name"] for f in json.loads(listed.stdout)) == sorted(
        f["name"] for f in platform.http.get("/v1/functions").json())
    described = json.loads(platform.cli("describe", "counter", "--output", "json").stdout)
    assert described["function"]["name"] == "counter" and described["instances"][0]["id"].startswith("counter-")
    assert isinstance(described["events"], list)
    status = json.loads(platform.cli("status", "-o", "json").stdout)
    assert status["workers"] and status["functions"]["total"] >= 2
    events = json.loads(platform.cli("events", "counter", "-o", "json").stdout)
    assert any(e["action"] for e in events)
    wrong = platform.cli("ls", "-o", "yaml")
    assert wrong.returncode == 2 and "yaml" in wrong.stderr


def test_invoke_stream_prints_each_chunk_and_fails_on_a_stream_that_did_not_finish(platform) -> None:
    streamed = platform.cli("invoke", "counter", "--stream", "--data", '{"to": 3}')
    assert streamed.returncode == 0, streamed.stderr
    assert [json.loads(line) for line in streamed.stdout.splitlines()] == [{"n": 1}, {"n": 2}, {"n": 3}]
    failed = platform.cli("invoke", "counter", "--stream", "--data", '{"to": 5, "fail_at": 2}')
    assert failed.returncode == 1
    assert [json.loads(line) for line in failed.stdout.splitlines()] == [{"n": 1}]
    assert "the stream failed after 1 chunk(s) (status 500)" in failed.stderr and "on purpose" in failed.stderr
    refused = platform.cli("invoke", "counter", "--stream", "--data", '{"to": 0}')
    assert refused.returncode == 1 and "n >= 1" in refused.stderr and refused.stdout == ""
    not_streaming = platform.cli("invoke", "echo", "--stream", "--data", '{"x": 1}')
    assert not_streaming.returncode == 1 and "does not stream" in not_streaming.stderr
