"""The instance's Prometheus metrics, built off the cold-start path.

Importing prometheus_client costs about 60 ms, a fifth of an instance's own start-up. The
histograms are therefore built in a background thread once the instance is ready (or at the
first scrape, whichever comes first); observations made before that are buffered and replayed.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

LATENCY_BUCKETS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class InstanceMetrics:
    """``observe(latency_s, batch_size)`` from the event loop; ``render()`` for ``/metrics``;
    ``queued`` (set once the handler is loaded) counts the requests waiting for a batch slot,
    ``abandoned`` those stopped because their caller left."""

    def __init__(self, buffer: int = 10_000) -> None:
        self.queued: Callable[[], int] = lambda: 0
        self.abandoned = 0      # requests whose caller left before their answer (counted on the event loop)
        self.dropped: Callable[[], int] = lambda: 0     # of those, inputs dropped before their batch ran
        self._lock = threading.Lock()
        self._pending: deque[tuple[float, int]] = deque(maxlen=buffer)
        self._built: tuple[Any, Any, Any] | None = None  # (registry, latency, batch sizes)

    def observe(self, latency_s: float, batch_size: int) -> None:
        built = self._built
        if built is None:
            with self._lock:
                if self._built is None:
                    self._pending.append((latency_s, batch_size))
                    return
                built = self._built
        built[1].observe(latency_s)
        built[2].observe(batch_size)

    def build_in_background(self) -> None:
        threading.Thread(target=self._build, name="dilu-metrics", daemon=True).start()

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        self._build()
        return generate_latest(self._built[0]), CONTENT_TYPE_LATEST

    def _build(self) -> None:
        from prometheus_client import CollectorRegistry, Gauge, Histogram

        with self._lock:
            if self._built is not None:
                return
            registry = CollectorRegistry()
            latency = Histogram("dilu_instance_request_seconds", "Request time inside the instance",
                                registry=registry, buckets=LATENCY_BUCKETS)
            sizes = Histogram("dilu_instance_batch_size", "Batch size each request rode in",
                              registry=registry, buckets=BATCH_BUCKETS)
            Gauge("dilu_instance_queued_requests", "Requests waiting in the instance for a batch slot",
                  registry=registry).set_function(lambda: self.queued())
            Gauge("dilu_instance_abandoned_requests", "Requests stopped because their caller left (total)",
                  registry=registry).set_function(lambda: self.abandoned)
            Gauge("dilu_instance_dropped_inputs", "Inputs of abandoned requests dropped before their batch ran (total)",
                  registry=registry).set_function(lambda: self.dropped())
            for latency_s, batch_size in self._pending:
                latency.observe(latency_s)
                sizes.observe(batch_size)
            self._pending.clear()
            self._built = (registry, latency, sizes)
