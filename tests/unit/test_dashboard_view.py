"""The dashboard's document, from rows a person can check by hand (pure)."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace as Row

import pytest

from dilu.messages import FunctionActivity
from gateway.dashboard.view import (
    LatencyWindow,
    ShareHistory,
    build,
    is_live,
    request_rate,
    sample,
    shown_functions,
)

pytestmark = pytest.mark.unit


def test_p99_is_windowed_nearest_rank() -> None:
    window = LatencyWindow(window_s=60)
    for i in range(100):
        window.observe("f", now=1000.0, seconds=(i + 1) / 1000)     # 1 ms .. 100 ms
    assert window.p99_ms("f", now=1000.0) == 99.0
    window.observe("f", now=1100.0, seconds=0.005)
    assert window.p99_ms("f", now=1100.0) == 5.0                     # the old ones left the window
    assert window.p99_ms("g", now=1100.0) is None


def test_rate_counts_whole_seconds_before_now() -> None:
    assert request_rate({95: 10, 99: 10, 100: 50}, now=100.7, window_s=10) == 2.0


def test_history_aligns_instances_that_come_and_go() -> None:
    gpu = Row(id="w0", device_kind="gpu", device_name="H200", state="alive", memory_bytes=100)
    a = Row(id="a", function="fa", worker_id="w0", state="ready", role="serve", memory_bytes=30,
            sm_request=0.3, sm_limit=0.5)
    b = Row(id="b", function="fb", worker_id="w0", state="ready", role="serve", memory_bytes=20,
            sm_request=0.2, sm_limit=0.4)
    history = ShareHistory(capacity=3)
    history.add(1.0, sample([a], {"a": {"granted_share": 0.5, "used_share": 0.4}}))
    history.add(2.0, sample([a, b], {"a": {"granted_share": 0.3, "used_share": 0.3},
                                     "b": {"granted_share": 0.4, "used_share": None}}))
    history.add(3.0, sample([a, b], {"b": {"granted_share": 0.4, "used_share": 0.1}}))   # a not reported
    history.add(4.0, sample([b], {"b": {"granted_share": 0.2, "used_share": 0.2}}))
    series = {line["instance"]: line for line in history.series("w0")["series"]}
    assert history.series("w0")["t"] == [2.0, 3.0, 4.0]                # the oldest sample fell out
    assert series["a"]["granted"] == [0.3, None, None] and series["b"]["used"] == [0.0, 0.1, 0.2]

    fn = Row(name="fa", version=2, status="ready", error=None, requests_total=7, spec={"slo": {"p99_ms": 50}})
    latency = LatencyWindow()
    latency.observe("fa", 9.5, 0.02)
    event = Row(at=datetime(2026, 1, 1, tzinfo=UTC), function="fa", action="resize", reason="why", instance_id="a")
    document = build(now=10.2, gateway="gw", workers=[gpu], functions=[fn], instances=[a, b],
                     profiles={"fa": None}, events=[event],
                     activity={"fa": FunctionActivity(requests={5: 4, 9: 6})}, latency=latency,
                     telemetry={"a": {"granted_share": 0.3, "used_share": 0.25}}, history=history,
                     streams=lambda name, now: {"first_chunk_p50_ms": 2.5} if name == "fa" else None)
    function = document["functions"][0]
    assert function["streams"] == {"first_chunk_p50_ms": 2.5}
    assert (function["ready"], function["rate_per_s"], function["p99_ms"], function["slo_p99_ms"]) == (1, 1.0, 20.0, 50)
    device = document["devices"][0]
    assert [(i["id"], i["granted"], i["used"]) for i in device["instances"]] == [("a", 0.3, 0.25), ("b", None, None)]
    assert document["events"][0]["reason"] == "why" and document["instances"] == 2


def test_the_shown_functions_put_the_busy_then_the_unsettled_first_within_the_limit() -> None:
    rows = [Row(name=name, status=status) for name, status in
            [("a", "ready"), ("b", "failed"), ("c", "ready"), ("d", "deploying"), ("e", "ready")]]
    assert [r.name for r in shown_functions(rows, live={"e"}, limit=4)] == ["e", "b", "d", "a"]
    assert [r.name for r in shown_functions(rows, live=set(), limit=2)] == ["b", "d"]


def test_a_function_is_live_with_requests_in_flight_queued_or_lately() -> None:
    assert not is_live(None, now=100.0)
    assert not is_live(FunctionActivity(requests={50: 3}), now=100.0)     # long ago
    assert is_live(FunctionActivity(requests={95: 3}), now=100.0)
    assert is_live(FunctionActivity(queued=1), now=100.0) and is_live(FunctionActivity(in_flight=2), now=100.0)
