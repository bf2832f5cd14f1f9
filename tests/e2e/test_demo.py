"""`dilu up --demo`: every example answers its sample request over HTTP."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT
from tests.e2e.conftest import backend_env
from tests.waiting import eventually

EXAMPLES = ROOT / "examples"


def _check_resnet(body: dict) -> None:
    top = body["top"]
    assert len(top) == 3 and all(0 <= item["class"] < 10 for item in top)
    assert top[0]["probability"] >= top[-1]["probability"] > 0


def _check_bert(body: dict) -> None:
    vector = body["embedding"]
    # [CLS] + 6 words + "." + [SEP]
    assert len(vector) == 64 and abs(sum(v * v for v in vector) - 1) < 1e-3 and body["tokens"] == 9


def _check_gpt(body: dict) -> None:
    assert len(body["tokens"]) == 16 and all(0 <= t < 256 for t in body["tokens"])


def _check_echo(body: dict) -> None:
    assert body == json.loads((EXAMPLES / "echo" / "request.json").read_text())


def _check_iris(body: dict) -> None:
    assert body["species"] == ["setosa", "virginica"]
    assert all(abs(sum(row) - 1) < 1e-5 for row in body["probabilities"])


def _check_digits(body: dict) -> None:
    assert body["digit"] == 7 and abs(sum(body["probabilities"]) - 1) < 1e-5    # a held-out 7


CHECKS = {"resnet": _check_resnet, "bert": _check_bert, "gpt": _check_gpt, "echo": _check_echo,
          "iris": _check_iris, "digits": _check_digits}


@pytest.mark.parametrize("backend", ["embedded", "postgres+redis"])
def test_demo_examples_answer_their_sample_requests(backend: str, start_platform,
                                                    request: pytest.FixtureRequest) -> None:
    platform = start_platform(env=backend_env(backend, request), demo=True)
    assert {p.parent.name for p in EXAMPLES.glob("*/model.yaml")} == set(CHECKS)
    eventually(lambda: len(platform.http.get("/v1/functions").json()) == len(CHECKS), timeout=60,
               what="the demo deployments")
    for name, check in CHECKS.items():
        platform.wait_ready(name, timeout=180)
        sample = json.loads((EXAMPLES / name / "request.json").read_text())
        reply = platform.invoke(name, sample)
        assert reply.status_code == 200, (name, reply.text)
        check(reply.json())
        # Same input, same answer: fixed seeds make the examples deterministic.
        assert platform.invoke(name, sample).json() == reply.json()
    assert any("demo: deployed resnet" in line for line in platform.role.lines)
