"""When a silent worker is lost: by evidence, not by one missed heartbeat.

A heartbeat comes from one thread of the worker; a starved host or a stopped worker process can
miss it while the worker's instances, separate processes, still serve. Dropping them then turns
a hiccup into an outage (every route gone, every request waiting for new instances). So a worker
silent past its TTL is lost only when neither its API nor any of its instances answers; one that
stays silent past ``hard_limit_s`` is lost whatever answers (the controller cannot manage what it
cannot reach), and a worker inside the controller's own process never is (if the controller
runs, so does it).
"""

from __future__ import annotations

from collections.abc import Mapping, Set


def lost_workers(silent_s: Mapping[str, float], ttl_s: float, hard_limit_s: float,
                 answering: Set[str], local: Set[str]) -> list[str]:
    """The workers to mark lost among those silent (``silent_s``: seconds since each last
    heartbeat): past ``ttl_s`` with no answer from it or its instances, or past ``hard_limit_s``."""
    return sorted(worker for worker, silent in silent_s.items()
                  if worker not in local and silent >= ttl_s and (silent >= hard_limit_s or worker not in answering))
