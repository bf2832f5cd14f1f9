"""One GPU's token manager: registers shims, refills their budgets every period, reports usage.

A thread runs the period loop (the control loop must not wait behind the worker's event loop):
each period it reads every slot's consumption, asks ``dilu.policy.vertical.allocate`` for
shares, turns shares into token budgets (tokens are grid blocks; ``capacity_per_s`` is what the
whole device runs per second), and publishes the refill. Slice changes from the controller are
picked up at the next period, so they take effect within two periods.

Registration protocol (Unix socket, one connection per process, kept open: EOF = exit):
  shim -> manager   "HELLO <abi> <pid> <instance-id>\\n"
  manager -> shim   "OK <slot> <generation>\\n" with the region's fd (SCM_RIGHTS), or "ERR <why>\\n"
"""

from __future__ import annotations

import logging
import os
import selectors
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dilu.policy.vertical import InstanceSlice, VerticalContext, VerticalParams, VerticalState, allocate
from worker.tokens.region import ABI, MAX_SLOTS, Region, allowed_at, rebase

log = logging.getLogger(__name__)
TELEMETRY_WINDOW_PERIODS = 200
# Budgets add up to slightly less than the device can run, so its queue drains instead of
# backing up into launches (a saturated queue blocks launches unevenly and skews the shares).
HEADROOM = 0.02


@dataclass
class _Client:
    sock: socket.socket
    slot: int
    pid: int
    instance_id: str
    last_consumed: int
    deltas: deque = field(default_factory=lambda: deque(maxlen=TELEMETRY_WINDOW_PERIODS))


class TokenManager:
    def __init__(self, *, gpu_uuid: str, socket_path: Path, capacity_per_s: float,
                 params: VerticalParams | None = None) -> None:
        self.gpu_uuid = gpu_uuid
        self.socket_path = Path(socket_path)
        self.capacity_per_s = capacity_per_s
        self.params = params or VerticalParams()
        self._region = Region(int(self.params.period_s * 1e6))
        self._lock = threading.Lock()
        self._slices: dict[str, InstanceSlice] = {}
        self._clients: dict[int, _Client] = {}  # by slot
        self._state = VerticalState()
        self._shares: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._selector = selectors.DefaultSelector()
        self._listener: socket.socket | None = None
        self.periods = 0
        self.events: deque[tuple[float, str]] = deque(maxlen=1000)  # (monotonic time, policy event)

    # ---- control API (any thread) ----
    def set_slice(self, instance_id: str, cls: str, request: float, limit: float, llm: bool = False) -> None:
        """Declares or changes an instance's slice; applied from the next period on."""
        with self._lock:
            self._slices[instance_id] = InstanceSlice(instance_id, cls, request, limit, llm)

    def remove_slice(self, instance_id: str) -> None:
        with self._lock:
            self._slices.pop(instance_id, None)

    def telemetry(self) -> dict[str, dict[str, Any]]:
        """Per instance: granted and used share, KLC, stretch, state, launches, waits, memory."""
        with self._lock:
            result: dict[str, dict[str, Any]] = {}
            per_period = self.capacity_per_s * self.params.period_s
            for client in self._clients.values():
                slot = self._region.slots[client.slot]
                window = len(client.deltas) or 1
                klc = self._state.klc.get(client.instance_id)
                waiting = slot.consumed > allowed_at(slot, time.monotonic_ns())
                recent = client.instance_id in self._state.last_active and \
                    time.monotonic() - self._state.last_active[client.instance_id] < 0.1
                entry = result.setdefault(client.instance_id, {
                    "granted_share": round(self._shares.get(client.instance_id, 0.0), 4),
                    "used_share": 0.0, "klc_ms": None, "stretch": None, "state": "idle",
                    "launches": 0, "tokens": 0, "blocked_ms": 0.0, "memory_bytes": 0, "processes": 0,
                    "batch_factor": round(self._state.batch_factor, 4)})
                entry["used_share"] = round(entry["used_share"] + sum(client.deltas) / (window * per_period), 4)
                entry["launches"] += slot.launches
                entry["tokens"] += slot.consumed
                entry["blocked_ms"] = round(entry["blocked_ms"] + slot.blocked_ns / 1e6, 3)
                entry["memory_bytes"] += slot.mem_used
                entry["processes"] += 1
                entry["state"] = "waiting" if waiting else "active" if recent else entry["state"]
                if klc is not None and klc.last_klc is not None:
                    entry["klc_ms"] = round(klc.last_klc * self.params.period_s * 1000, 1)
                    entry["stretch"] = round(klc.last_stretch or 1.0, 3)
            return result

    # ---- lifecycle ----
    def start(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        if self.socket_path.exists():
            self.socket_path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.socket_path))
        # Instances may run as another user (containers run unprivileged): connecting needs write
        # permission on the socket. Who may register is bounded by who can reach the folder.
        os.chmod(self.socket_path, 0o666)
        listener.listen(64)
        listener.setblocking(False)
        self._listener = listener
        self._selector.register(listener, selectors.EVENT_READ, None)
        # A fresh heartbeat before the first shim can register, so nobody sees a stale manager.
        self._region.refilled(time.monotonic_ns())
        self._thread = threading.Thread(target=self._run, name=f"tokens-{self.gpu_uuid}", daemon=True)
        self._thread.start()
        log.info("token manager for %s at %s (capacity %.0f tokens/s)", self.gpu_uuid, self.socket_path,
                 self.capacity_per_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        for client in list(self._clients.values()):
            client.sock.close()
        self._clients.clear()
        if self._listener is not None:
            self._listener.close()
        self._selector.close()
        try:
            self.socket_path.unlink()
        except FileNotFoundError:
            pass
        self._region.close()

    # ---- the loop (manager thread only) ----
    def _run(self) -> None:
        period = self.params.period_s
        next_at = time.monotonic()
        while not self._stop.is_set():
            next_at += period
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                next_at = time.monotonic()  # fell behind: do not try to catch up in a burst
            try:
                self._serve_sockets()
                self._period(time.monotonic())
            except Exception:
                log.exception("token period failed")

    def _period(self, now: float) -> None:
        with self._lock:
            slots = self._region.slots
            active: set[str] = set()
            for client in self._clients.values():
                slot = slots[client.slot]
                consumed = slot.consumed
                delta = consumed - client.last_consumed
                client.last_consumed = consumed
                client.deltas.append(max(0, delta))
                if delta > 0 or consumed > allowed_at(slot, time.monotonic_ns()):
                    active.add(client.instance_id)
            instances = {c.instance_id for c in self._clients.values()}
            slices = tuple(self._slices.get(i) or InstanceSlice(i, "batch", 0.0, 1.0) for i in sorted(instances))
            self._shares, self._state = allocate(
                VerticalContext(now, slices, frozenset(active), self.params), self._state)
            for event in self._state.events:
                self.events.append((now, event))
                log.info("%s: %s (batch factor %.3f)", self.gpu_uuid, event, self._state.batch_factor)
            now_ns = time.monotonic_ns()
            for client in self._clients.values():
                rate = int(self._shares.get(client.instance_id, 0.0) * self.capacity_per_s * (1 - HEADROOM))
                # Idle instances bank at most one period of tokens; debts carry over.
                rebase(slots[client.slot], now_ns, rate, int(rate * self.params.period_s))
            self.periods += 1
        self._region.refilled(time.monotonic_ns())

    def _serve_sockets(self) -> None:
        for key, _ in self._selector.select(timeout=0):
            if key.fileobj is self._listener:
                self._accept()
            else:
                self._client_event(key.data)

    def _accept(self) -> None:
        try:
            conn, _ = self._listener.accept()
        except BlockingIOError:
            return
        conn.settimeout(1.0)
        try:
            hello = conn.recv(256).decode("ascii", errors="replace").split()
        except OSError:
            conn.close()
            return
        if len(hello) != 4 or hello[0] != "HELLO" or hello[1] != str(ABI):
            conn.sendall(f"ERR expected HELLO {ABI} <pid> <instance>\n".encode())
            conn.close()
            return
        with self._lock:
            free = next((i for i in range(MAX_SLOTS) if i not in self._clients), None)
            if free is None:
                conn.sendall(b"ERR no free slot\n")
                conn.close()
                return
            slot = self._region.slots[free]
            slot.gen = (slot.gen + 1) & 0xFFFFFFFF
            slot.pid = int(hello[2])
            # Fresh counters; one period of budget up front so the first launch does not wait.
            slot.consumed = slot.launches = slot.blocked_ns = slot.mem_used = 0
            instance_id = hello[3]
            share = self._shares.get(instance_id)
            if share is None:
                known = self._slices.get(instance_id)
                share = known.limit if known else 1.0
            rate = int(share * self.capacity_per_s * (1 - HEADROOM))
            slot.granted_at_ns = time.monotonic_ns()
            slot.granted = int(rate * self.params.period_s)
            slot.rate_per_s = rate
            client = _Client(sock=conn, slot=free, pid=slot.pid, instance_id=instance_id, last_consumed=0)
            self._clients[free] = client
            generation = slot.gen
        socket.send_fds(conn, [f"OK {free} {generation}\n".encode()], [self._region.fd])
        conn.setblocking(False)
        self._selector.register(conn, selectors.EVENT_READ, client)
        log.info("%s: instance %s (pid %d) registered in slot %d", self.gpu_uuid, instance_id, client.pid, free)

    def _client_event(self, client: _Client) -> None:
        try:
            data = client.sock.recv(256)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            return  # shims send nothing after HELLO; ignore
        self._selector.unregister(client.sock)
        client.sock.close()
        with self._lock:
            self._clients.pop(client.slot, None)
            self._region.slots[client.slot].pid = 0
        log.info("%s: instance %s (pid %d) left slot %d", self.gpu_uuid, client.instance_id, client.pid, client.slot)


def socket_path_for(directory: Path, gpu_uuid: str) -> Path:
    """The manager's socket; shortened under /tmp when the path would exceed AF_UNIX's limit."""
    path = Path(directory) / f"{gpu_uuid}.sock"
    if len(str(path)) < 100:
        return path
    import hashlib

    digest = hashlib.sha1(str(path).encode()).hexdigest()[:16]
    return Path("/tmp") / f"dilu-{os.getuid()}-{digest}.sock"
