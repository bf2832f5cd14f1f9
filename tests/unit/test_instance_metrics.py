"""Instance metrics built off the cold-start path: nothing observed before the build is lost."""

from __future__ import annotations

from worker.instance.metrics import InstanceMetrics


def test_observations_before_and_after_the_build_are_all_counted() -> None:
    metrics = InstanceMetrics()
    metrics.observe(0.01, 4)
    metrics.observe(0.02, 4)
    text, media_type = metrics.render()
    metrics.observe(0.03, 8)
    text, _ = metrics.render()
    assert "text/plain" in media_type
    assert b"dilu_instance_request_seconds_count 3.0" in text
    assert b'dilu_instance_batch_size_bucket{le="4.0"} 2.0' in text


def test_the_buffer_is_bounded() -> None:
    metrics = InstanceMetrics(buffer=5)
    for _ in range(50):
        metrics.observe(0.01, 1)
    text, _ = metrics.render()
    assert b"dilu_instance_request_seconds_count 5.0" in text


def test_the_queue_gauge_reads_the_runner_at_each_scrape() -> None:
    metrics = InstanceMetrics()
    assert b"dilu_instance_queued_requests 0.0" in metrics.render()[0], "before the handler loads"
    waiting = [7]
    metrics.queued = lambda: waiting[0]
    assert b"dilu_instance_queued_requests 7.0" in metrics.render()[0]
    waiting[0] = 0
    assert b"dilu_instance_queued_requests 0.0" in metrics.render()[0]
