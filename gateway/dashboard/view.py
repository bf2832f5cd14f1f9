"""What the dashboard shows, assembled from rows and counters (pure; ``gateway.routes.dashboard``
does the reading).

Two things only the gateway keeps, in memory: recent latencies per function (for a windowed
p99 of what this gateway served) and a ring of compute-share samples per device (granted and used
share of each instance over the last minutes: the picture of vertical scaling).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

LATENCY_WINDOW_S = 60.0
RATE_WINDOW_S = 10
HISTORY_SAMPLES = 300


@dataclass
class LatencyWindow:
    """The latest latencies per function, each kept at most ``window_s`` and ``capacity`` deep."""

    window_s: float = LATENCY_WINDOW_S
    capacity: int = 4096
    _samples: dict[str, deque[tuple[float, float]]] = field(default_factory=dict)

    def observe(self, function: str, now: float, seconds: float) -> None:
        samples = self._samples.get(function)
        if samples is None:
            samples = self._samples[function] = deque(maxlen=self.capacity)
        samples.append((now, seconds))

    def p99_ms(self, function: str, now: float) -> float | None:
        """The 99th percentile (nearest rank) of the window, in ms; None without samples."""
        recent = sorted(s for t, s in self._samples.get(function, ()) if now - t <= self.window_s)
        if not recent:
            return None
        return round(recent[math.ceil(0.99 * len(recent)) - 1] * 1000, 3)

    def median_s(self, function: str, now: float) -> float | None:
        """The median of the window, in seconds; None without samples."""
        recent = sorted(s for t, s in self._samples.get(function, ()) if now - t <= self.window_s)
        return recent[len(recent) // 2] if recent else None

    def forget(self, function: str) -> None:
        self._samples.pop(function, None)


@dataclass(frozen=True)
class ShareSample:
    """One instance's compute share at one moment."""

    function: str
    granted: float
    used: float


@dataclass
class ShareHistory:
    """Samples of every device's instances, oldest first, at most ``capacity`` of them."""

    capacity: int = HISTORY_SAMPLES
    _samples: deque[tuple[float, dict[str, dict[str, ShareSample]]]] = field(default_factory=deque)

    def add(self, at: float, devices: dict[str, dict[str, ShareSample]]) -> None:
        self._samples.append((at, devices))
        while len(self._samples) > self.capacity:
            self._samples.popleft()

    def series(self, worker: str) -> dict[str, Any]:
        """``t`` (sample times) and, per instance seen on ``worker``, its granted and used shares
        aligned with ``t`` (None where the instance did not exist)."""
        times = [at for at, _ in self._samples]
        instances: dict[str, dict[str, Any]] = {}
        for position, (_, devices) in enumerate(self._samples):
            for instance, sample in devices.get(worker, {}).items():
                line = instances.setdefault(instance, {"instance": instance, "function": sample.function,
                                                       "granted": [None] * len(times), "used": [None] * len(times)})
                line["granted"][position] = sample.granted
                line["used"][position] = sample.used
        return {"t": times, "series": list(instances.values())}


def request_rate(per_second: dict[int, int], now: float, window_s: int = RATE_WINDOW_S) -> float:
    """Requests per second over the last ``window_s`` whole seconds (the current one excluded)."""
    end = int(now)
    return round(sum(per_second.get(second, 0) for second in range(end - window_s, end)) / window_s, 3)


def is_live(activity: Any, now: float) -> bool:
    """Whether a function's activity (a FunctionActivity, or None) shows requests now or lately."""
    return activity is not None and bool(activity.in_flight or activity.queued or request_rate(activity.requests, now))


def shown_functions(candidates: list, live: set[str], limit: int) -> list:
    """The functions the page lists, at most ``limit`` of ``candidates`` (rows, any order, each
    once): those with instances or requests first, then those not ready (deploying, profiling,
    failed), then the rest, each group by name. With thousands deployed the page stays small and
    what needs attention stays on it."""
    def rank(row: Any) -> tuple[int, str]:
        return (0 if row.name in live else 1 if row.status != "ready" else 2), row.name

    return sorted(candidates, key=rank)[:limit]


def _profile(row: Any) -> dict[str, Any] | None:
    if row is None:
        return None
    return {"status": row.status, "kind": row.kind, "sm_request": row.sm_request, "sm_limit": row.sm_limit,
            "batch": row.batch, "throughput_per_s": row.throughput_per_s,
            "latency_ms": None if row.latency_s is None else round(row.latency_s * 1000, 3)}


def build(*, now: float, gateway: str, workers: list, functions: list, instances: list, profiles: dict,
          events: list, activity: dict, telemetry: dict, latency: LatencyWindow, history: ShareHistory,
          streams: Callable[[str, float], dict[str, float] | None] | None = None,
          functions_total: int | None = None) -> dict:
    """The dashboard's one document: functions, devices (with their share history) and events.

    ``workers``, ``functions``, ``instances``, ``events``: database rows (``functions``: those
    shown, of ``functions_total``); ``profiles``: function
    name -> profile row of its current version; ``activity``: name -> FunctionActivity;
    ``telemetry``: instance id -> the token manager's view (GPU instances only); ``streams``:
    a function's recent stream timings (time to first chunk, between chunks), None before any.
    """
    serving = [i for i in instances if i.role == "serve"]
    function_docs = []
    for row in functions:
        mine = [i for i in serving if i.function == row.name]
        seen = activity.get(row.name)
        spec = row.spec or {}
        function_docs.append({
            "name": row.name, "version": row.version, "status": row.status, "error": row.error,
            "ready": sum(1 for i in mine if i.state == "ready"),
            "starting": sum(1 for i in mine if i.state == "starting"),
            "rate_per_s": request_rate(seen.requests, now) if seen else 0.0,
            "queued": seen.queued if seen else 0, "in_flight": seen.in_flight if seen else 0,
            "p99_ms": latency.p99_ms(row.name, now), "slo_p99_ms": (spec.get("slo") or {}).get("p99_ms"),
            "requests_total": row.requests_total, "profile": _profile(profiles.get(row.name)),
            "inference_protocol": bool(spec.get("inputs")),
            "streams": streams(row.name, now) if streams else None,
        })
    device_docs = []
    for worker in workers:
        on_it = [i for i in instances if i.worker_id == worker.id]
        device_docs.append({
            "worker": worker.id, "kind": worker.device_kind, "name": worker.device_name or worker.device_kind,
            "state": worker.state, "memory_bytes": worker.memory_bytes,
            "instances": [{
                "id": i.id, "function": i.function, "state": i.state, "role": i.role, "memory_bytes": i.memory_bytes,
                "sm_request": i.sm_request, "sm_limit": i.sm_limit,
                "granted": (telemetry.get(i.id) or {}).get("granted_share"),
                "used": (telemetry.get(i.id) or {}).get("used_share"),
            } for i in on_it],
            "history": history.series(worker.id),
        })
    return {
        "at": now, "gateway": gateway, "functions": function_docs, "devices": device_docs,
        "functions_total": len(function_docs) if functions_total is None else functions_total,
        "events": [{"at": e.at.isoformat(), "function": e.function, "action": e.action, "reason": e.reason,
                    "instance": e.instance_id} for e in reversed(events)],
        "instances": len([i for i in serving if i.state in ("starting", "ready")]),
    }


def sample(instances: list, telemetry: dict) -> dict[str, dict[str, ShareSample]]:
    """One history sample: per worker, the instances the token managers report on."""
    devices: dict[str, dict[str, ShareSample]] = {}
    for row in instances:
        view = telemetry.get(row.id)
        if view is None or view.get("granted_share") is None:
            continue
        devices.setdefault(row.worker_id, {})[row.id] = ShareSample(
            function=row.function, granted=float(view["granted_share"]), used=float(view.get("used_share") or 0.0))
    return devices
