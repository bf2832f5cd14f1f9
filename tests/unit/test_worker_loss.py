"""A silent worker is lost by evidence: past its TTL with nothing of it answering, or past the
hard limit whatever answers; never the controller's own in-process worker."""

from __future__ import annotations

from dilu.policy.worker_loss import lost_workers


def test_a_silent_worker_is_lost_only_when_nothing_of_it_answers() -> None:
    silent = {"quiet": 6.0, "hung-but-serving": 6.0, "late": 3.0, "long-gone": 61.0, "local": 100.0}
    lost = lost_workers(silent, ttl_s=5.0, hard_limit_s=60.0, answering={"hung-but-serving", "long-gone"},
                        local={"local"})
    assert lost == ["long-gone", "quiet"]
