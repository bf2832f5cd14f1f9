"""A repeating failure is logged once, then as a count at most every period, then its recovery."""

from __future__ import annotations

import logging

import pytest

from dilu.failures import FailureLog, describe
from dilu.spec import retries_after_failure


def test_a_flood_of_failures_is_three_lines(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    failures = FailureLog(logging.getLogger("t"), "heartbeat", every_s=60.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING):
        for step in range(40 * 90):            # 40 a second for 90 s: what a poll loop would do
            now[0] = step / 40
            failures.failed(ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused."))
        failures.succeeded()
        failures.succeeded()
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 3, lines
    assert lines[0] == "heartbeat failed: ConnectionError: Error 111 connecting to 127.0.0.1:6379. Connection refused."
    assert not caplog.records[0].exc_info                 # an outage: its reason, no traceback
    assert lines[1].startswith("heartbeat still failing: 2401 attempts in 60 s")
    assert lines[2] == "heartbeat works again after 3600 failed attempts in 90 s"


def test_a_bug_shows_its_traceback_once(caplog: pytest.LogCaptureFixture) -> None:
    failures = FailureLog(logging.getLogger("t"), "pass", clock=lambda: 0.0)
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            try:
                raise KeyError("x")
            except KeyError as exc:
                failures.failed(exc)
    assert len(caplog.records) == 1 and caplog.records[0].exc_info is not None


def test_a_timeout_without_a_message_is_named_by_its_type() -> None:
    assert describe(TimeoutError()) == "TimeoutError"
    assert describe(ValueError("bad\nsecond line")) == "ValueError: bad"


@pytest.mark.parametrize(("spec", "retried"), [({}, True), ({"class": "latency"}, True), ({"class": "batch"}, False),
                                               ({"class": "batch", "idempotent": True}, True),
                                               ({"idempotent": False}, False), ({"idempotent": None}, True)])
def test_retries_are_on_by_default_for_inference_only(spec: dict, retried: bool) -> None:
    assert retries_after_failure(spec) is retried
