"""Small pure helpers: activity merging, exit descriptions, log tails."""

from __future__ import annotations

from pathlib import Path

import pytest

from dilu.instance_protocol import ERROR_MARKER, EXIT_LOAD_FAILED
from dilu.state.base import merge_activity
from worker.agent import describe_exit, read_log_tail


def test_merge_activity_sums_gateways_and_keeps_latest_request() -> None:
    merged = merge_activity(
        [{"f": {"in_flight": 2, "queued": 1, "last_request_at": 10.0}},
         {"f": {"in_flight": 1, "queued": 0, "last_request_at": 12.0}, "g": {"in_flight": 0}}],
        {"f": {100: 3}})
    assert merged["f"].in_flight == 3 and merged["f"].queued == 1
    assert merged["f"].last_request_at == 12.0 and merged["f"].requests == {100: 3}
    assert merged["g"].last_request_at is None


def test_merge_activity_keeps_the_latest_workflow_hints_of_any_gateway() -> None:
    merged = merge_activity(
        [{"f": {"workflow": {"expected_until": 50.0, "release_idle_until": 40.0, "direct_at": None}}},
         {"f": {"workflow": {"expected_until": 45.0, "release_idle_until": None, "direct_at": 30.0}}},
         {"f": {"in_flight": 1}}], {})
    hint = merged["f"].workflow
    assert hint.expected_until == 50.0 and hint.release_idle_until == 40.0
    assert hint.direct_at == 30.0          # a direct request at another gateway still counts


@pytest.mark.parametrize(("code", "log", "expected"), [
    (EXIT_LOAD_FAILED, f"Traceback...\n{ERROR_MARKER}Echo.load() failed: OSError: no weights\n",
     "Echo.load() failed: OSError: no weights"),
    (EXIT_LOAD_FAILED, "", "handler failed to load"),
    (-9, "serving\n", "killed by signal 9"),
    (1, "boom\n", "exited with status 1"),
])
def test_describe_exit(code: int, log: str, expected: str) -> None:
    assert expected in describe_exit(code, log)


def test_read_log_tail(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    assert read_log_tail(log, 5) == ""
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert read_log_tail(log, 3) == "line 97\nline 98\nline 99"


def test_profiling_samples_fall_back_to_the_warmup_request(tmp_path: Path) -> None:
    from dilu.controller.trials import MissingSample, sample_request

    (tmp_path / "warm.json").write_text('{"from": "file"}')
    assert sample_request(str(tmp_path), warmup={"request": {"from": "spec"}}) == b'{"from": "spec"}'
    assert sample_request(str(tmp_path), warmup={"file": "warm.json"}) == b'{"from": "file"}'
    (tmp_path / "request.json").write_text('{"from": "request.json"}')
    assert sample_request(str(tmp_path), warmup={"file": "warm.json"}) == b'{"from": "request.json"}'
    (tmp_path / "request.json").unlink()
    with pytest.raises(MissingSample, match="or a warmup request"):
        sample_request(str(tmp_path), warmup={"file": "missing.json"})
    with pytest.raises(MissingSample, match="request.json"):
        sample_request(str(tmp_path))


def test_the_controller_wakes_when_a_workflows_expectation_ends() -> None:
    from dilu.controller.reconciler import wake_in_s
    from dilu.messages import FunctionActivity
    from dilu.workflows.hints import WorkflowHint

    activity = {"a": FunctionActivity(workflow=WorkflowHint(100.3)),
                "b": FunctionActivity(workflow=WorkflowHint(100.8)),
                "c": FunctionActivity(workflow=WorkflowHint(99.0)), "d": FunctionActivity()}
    assert wake_in_s(activity, now=100.0, interval_s=0.5) == pytest.approx(0.31)   # a's ends first
    assert wake_in_s({"c": activity["c"], "d": activity["d"]}, now=100.0, interval_s=0.5) == 0.5
