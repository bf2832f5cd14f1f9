"""A GPU's token manager in a process of its own (what ``GpuControl`` runs by default).

The period loop refills every instance's tokens each 5 ms; a shim whose manager misses its
heartbeat for longer than its staleness limit (100 ms) opens its gate. In ``dilu up`` the worker
shares an interpreter with the gateway and the controller, so a long stretch of their work (a
burst of requests, a garbage collection over their heaps) would hold the interpreter lock past
that limit. Here the loop runs in a small process that does nothing else: its only other work is
answering the worker's control messages (slices, telemetry), a few per second.

Control channel: a Unix socket on the process's stdin, one JSON object per line.
  worker -> manager  {"op": "slice", "instance", "cls", "request", "limit"} | {"op": "remove", "instance"}
                     | {"op": "admit", "instance", "uid", "cgroup"} | {"op": "telemetry"} | {"op": "stats"}
                     | {"op": "events"}   (admit and these three are answered, in order)
  manager -> worker  "READY\\n" once its socket listens, then one JSON line per answered request
"""

from __future__ import annotations

import json
import logging
import os
import select
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from dilu.policy.isolation import IsolationParams
from worker.sandbox import die_with_parent

log = logging.getLogger(__name__)
START_TIMEOUT_S = 30.0
ANSWER_TIMEOUT_S = 2.0


class ManagerProcess:
    """The worker's handle on a token manager process; the same calls as ``TokenManager``."""

    def __init__(self, *, gpu_uuid: str, socket_path: Path, capacity_per_s: float, python: str | None = None,
                 measure: bool = False, env: dict[str, str] | None = None,
                 isolation: IsolationParams | None = IsolationParams(), log_level: str = "INFO") -> None:
        """``measure``: close the loop with NVML's per-process device time (``env`` is added to
        the process's environment: where a simulated GPU's NVML and clock are). ``isolation``:
        as ``TokenManager``'s (None: token-rate control alone)."""
        self.gpu_uuid = gpu_uuid
        self.socket_path = Path(socket_path)
        self.capacity_per_s = capacity_per_s
        self._python = python or sys.executable
        self._measure = measure
        self._env = env
        self._isolation = isolation
        self._log_level = log_level
        self._process: subprocess.Popen | None = None
        self._control: socket.socket | None = None
        self._reader: Any = None
        self._lock = threading.Lock()

    def start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._process = subprocess.Popen(
            [self._python, "-m", "worker.tokens", "--gpu", self.gpu_uuid, "--socket", str(self.socket_path),
             "--capacity", repr(self.capacity_per_s), *(["--measure"] if self._measure else []),
             *(["--window-us", repr(self._isolation.window_s * 1e6)] if self._isolation else ["--no-isolation"]),
             "--log-level", self._log_level],
            stdin=theirs, preexec_fn=die_with_parent, env={**os.environ, **(self._env or {})})
        theirs.close()
        self._control = ours
        self._reader = ours.makefile("rb")
        if not select.select([ours], [], [], START_TIMEOUT_S)[0] or self._reader.readline() != b"READY\n":
            self.stop()
            raise RuntimeError(f"the token manager of {self.gpu_uuid} did not start")
        log.info("token manager for %s in process %d at %s", self.gpu_uuid, self._process.pid, self.socket_path)

    def stop(self) -> None:
        with self._lock:      # not under a question being asked
            if self._control is not None:
                # The process ends on EOF: the reader made from the socket holds its descriptor
                # open too, so both are closed (the socket alone would not end it, and the wait
                # below would run out).
                if self._reader is not None:
                    self._reader.close()
                self._control.close()
                self._control = None
        if self._process is not None:
            try:
                self._process.wait(5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

    def set_slice(self, instance_id: str, cls: str, request: float, limit: float, llm: bool = False) -> None:
        self._send({"op": "slice", "instance": instance_id, "cls": cls, "request": request, "limit": limit,
                    "llm": llm})

    def remove_slice(self, instance_id: str) -> None:
        self._send({"op": "remove", "instance": instance_id})

    def admit(self, instance_id: str, uid: int | None, cgroup: str | None = None) -> str:
        """As ``TokenManager.admit``; answered, so the socket listens before the instance starts."""
        answer = self._ask({"op": "admit", "instance": instance_id, "uid": uid, "cgroup": cgroup})
        if not isinstance(answer, dict) or "socket" not in answer:
            why = answer.get("error") if isinstance(answer, dict) else "no answer"
            raise RuntimeError(f"the token manager of {self.gpu_uuid} could not admit {instance_id}: {why}")
        return answer["socket"]

    def telemetry(self) -> dict[str, dict[str, Any]]:
        return self._ask({"op": "telemetry"}) or {}

    def period_stats(self) -> dict[str, Any]:
        return self._ask({"op": "stats"}) or {}

    @property
    def events(self) -> list[tuple[float, str]]:
        """The vertical policy's recent events (monotonic time in the manager's process, text)."""
        return [tuple(event) for event in self._ask({"op": "events"}) or []]

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def _send(self, message: dict) -> None:
        with self._lock:
            if self._control is None:
                return
            try:
                self._control.sendall((json.dumps(message) + "\n").encode())
            except OSError as exc:
                log.warning("token manager of %s is gone: %s", self.gpu_uuid, exc)

    def _ask(self, message: dict) -> Any:
        with self._lock:
            if self._control is None:
                return None
            try:
                self._control.sendall((json.dumps(message) + "\n").encode())
                if not select.select([self._control], [], [], ANSWER_TIMEOUT_S)[0]:
                    return None
                line = self._reader.readline()
            except OSError:
                return None
            return json.loads(line) if line else None
