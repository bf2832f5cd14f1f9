"""The CLI's pure parts: reading a stream's frames, the notes under `dilu describe`'s instance
table, and what `dilu init` refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.scaffold import ScaffoldError, write_scaffold
from cli.stream import Chunk, Failed, Finished, failure_message, read_frame
from cli.telemetry import telemetry_notes


def test_only_the_exact_terminators_end_a_stream() -> None:
    assert read_frame('{"done": true, "chunks": 3}') == Finished(3)
    assert read_frame('{"error": "boom", "status": 500}') == Failed("boom", 500)
    assert read_frame('{"done": true, "chunks": 3, "text": "x"}') == Chunk({"done": True, "chunks": 3, "text": "x"})
    assert read_frame('{"error": "a field of the answer"}') == Chunk({"error": "a field of the answer"})
    assert read_frame("[1, 2]") == Chunk([1, 2])


def test_a_stream_without_its_terminator_is_called_cut_not_finished() -> None:
    assert "cut after 2 chunk(s)" in failure_message(None, 2) and "incomplete" in failure_message(None, 2)
    assert failure_message(Failed("boom", 500), 1) == "the stream failed after 1 chunk(s) (status 500): boom"


def _instance(used: float, granted: float, limit: float = 0.75, held_ms: float = 0) -> dict:
    return {"id": "f-1", "sm_limit": limit,
            "telemetry": {"used_share": used, "granted_share": granted, "held_ms": held_ms}}


def test_a_latency_instance_past_its_limit_is_explained() -> None:
    (note,) = telemetry_notes("latency", [_instance(used=0.92, granted=0.75)])
    assert "0.92, past its limit 0.75" in note and "never waits for tokens" in note
    assert telemetry_notes("latency", [_instance(used=0.76, granted=0.75)]) == []    # sampling noise


def test_a_held_batch_instance_below_its_grant_is_explained() -> None:
    (note,) = telemetry_notes("batch", [_instance(used=0.10, granted=0.75, limit=1.0, held_ms=4200)])
    assert "0.10 of the 0.75 granted" in note and "latency work" in note
    assert telemetry_notes("batch", [_instance(used=0.10, granted=0.75, limit=1.0)]) == []   # never held
    assert telemetry_notes("batch", [{"id": "f-2", "sm_limit": 1.0, "telemetry": None}]) == []


def test_init_refuses_a_bad_name_and_a_folder_in_use(tmp_path: Path) -> None:
    with pytest.raises(ScaffoldError, match="not a function name"):
        write_scaffold("Bad Name", tmp_path / "a")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "mine.txt").write_text("keep me")
    with pytest.raises(ScaffoldError, match="already exists"):
        write_scaffold("b", tmp_path / "b")
    assert (tmp_path / "b" / "mine.txt").read_text() == "keep me"
    written = write_scaffold("fresh", tmp_path / "fresh")
    assert json.loads((tmp_path / "fresh" / "request.json").read_text()) == {"x": [1.0, 2.0, 3.0]}
    assert "name: fresh" in (tmp_path / "fresh" / "model.yaml").read_text() and len(written) == 3


def test_up_says_what_it_kept_from_earlier_runs_and_how_to_start_afresh() -> None:
    from cli.carried import CarriedState, carried_state_lines

    home = Path("/home/me/.dilu")
    assert carried_state_lines(None, home) == [] and carried_state_lines(CarriedState(0, (), 0), home) == []
    kept, afresh = carried_state_lines(CarriedState(3, ("a", "b"), 1), home)
    assert kept == ("kept from earlier runs in /home/me/.dilu: 3 function(s); 2 of them failed before (a, b): "
                    "deployed again now; 1 API key(s): authentication is on, so the CLI needs DILU_API_KEY")
    assert "remove /home/me/.dilu" in afresh and "DILU_HOME=" in afresh
    (many, _) = carried_state_lines(CarriedState(9, tuple("abcdefg"), 0), home)
    assert "7 of them failed before (a, b, c, d, e, ...)" in many
