"""One GPU's token manager: registers shims, refills their budgets every period, reports usage.

A thread runs the period loop (the control loop must not wait behind the worker's event loop):
each period it reads every slot's consumption, asks ``dilu.policy.vertical.allocate`` for
shares, turns shares into token budgets (tokens are grid blocks; ``capacity_per_s`` is what the
whole device runs per second), asks ``dilu.policy.isolation.decide`` what each slot's release
rules are (which slots are latency work, each batch instance's window and floor), and
publishes the refill. Slice changes from the controller are picked up at the next period, so
they take effect within two periods. ``isolation=None`` keeps token-rate control alone (what
Dilu did before isolation, for comparison).

Registration protocol (Unix socket, one connection per process, kept open: EOF = exit):
  shim -> manager   "HELLO <abi> <pid> <instance-id>\\n"
  manager -> shim   "OK <slot> <generation> <process>\\n" with four fds (SCM_RIGHTS: the board, the
                    instance's grant, usage and signal; shim/include/dilu_shm.h), or "ERR <why>\\n"
  shim -> manager   "SIGNAL <slot>\\n" (a batch shim, for a latency slot's requests in flight)
  manager -> shim   "SIG <slot> <generation>\\n" with a read-only fd of its signal, or "NOSIG <slot> <generation>\\n"
Each instance registers on a socket of its own, made when the worker admits it (``admit``);
``worker.tokens.peers`` says who is accepted there. The manager's own socket is its user's.
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

from dilu.policy import isolation
from dilu.policy.calibration import TokenCost, observe, token_rate
from dilu.policy.isolation import BatchPeriod, IsolationContext, IsolationParams, IsolationState
from dilu.policy.vertical import InstanceSlice, VerticalContext, VerticalParams, VerticalState, allocate
from worker.tokens.peers import Admission, instance_socket_path, listen_for, peer_of, refusal
from worker.tokens.region import (
    ABI,
    MAX_PROCS,
    MAX_SLOTS,
    SLOT_FLOOR,
    SLOT_LATENCY,
    InstanceRegion,
    Region,
    allowed_at,
    rebase,
)

log = logging.getLogger(__name__)
TELEMETRY_WINDOW_PERIODS = 200
STATS_WINDOW_PERIODS = 2000      # the period loop's timing, over the last 10 s at 5 ms
STALE_S = 0.1                    # the shim's default staleness limit (DILU_SHIM_STALE_MS): a longer gap opens gates
CALIBRATE_EVERY_S = 0.2          # how often measured device time corrects each instance's cost per token
# Budgets add up to slightly less than the device can run, so its queue drains instead of
# backing up into launches (a saturated queue blocks launches unevenly and skews the shares).
HEADROOM = 0.02
HELLO_WAIT_S = 1.0               # a connection that has not said HELLO by then is closed
MAX_SIGNAL_ASKS = 4              # signals answered per message a shim sends: no shim makes the loop busy


@dataclass
class _Instance:
    """One slot: an instance and its registered processes."""

    instance_id: str
    slot: int
    shared: InstanceRegion
    last_consumed: int = 0                 # the most it ever reported: its own rewinds count for nothing
    processes: set[int] = field(default_factory=set)     # its process entries (usage.proc_mem indices)
    cost: TokenCost | None = None          # device time per token, once measured (closed loop)
    calibrated_consumed: int = 0           # tokens consumed at the last calibration
    last_held_ns: int = 0
    deltas: deque = field(default_factory=lambda: deque(maxlen=TELEMETRY_WINDOW_PERIODS))


@dataclass
class _Pending:
    """An accepted connection that has not said HELLO yet; ``instance_id``: the instance whose
    socket it came in on (None: the manager's own socket)."""

    sock: socket.socket
    instance_id: str | None
    since: float


@dataclass
class _Client:
    """One registered process (its socket's EOF is its exit)."""

    sock: socket.socket
    proc: int               # its entry in the instance's usage.proc_mem
    pid: int
    instance: _Instance
    key: int = 0            # its key in the manager's table of clients


class TokenManager:
    def __init__(self, *, gpu_uuid: str, socket_path: Path, capacity_per_s: float,
                 params: VerticalParams | None = None, device_time: Any = None,
                 isolation: IsolationParams | None = IsolationParams()) -> None:
        """``device_time``: a source of measured per-process device time (``busy_shares()``, as
        ``worker.tokens.nvml.NvmlDeviceTime``) that closes the loop; None: open-loop, every
        token costs ``1 / capacity_per_s`` of a device-second. ``isolation``: the release rules
        for batch work beside latency work; None: token-rate control alone."""
        self.gpu_uuid = gpu_uuid
        self.socket_path = Path(socket_path)
        self.capacity_per_s = capacity_per_s
        self.default_ns_per_token = 1e9 / capacity_per_s
        self._device_time = device_time
        self._calibrator: threading.Thread | None = None
        self.realtime = False       # run the period loop at real-time priority (its own process sets it)
        self.isolation = isolation
        self.params = params or VerticalParams(isolated=isolation is not None)
        self._isolation_state = IsolationState()
        self._floors: frozenset[str] = frozenset()
        self._region = Region(int(self.params.period_s * 1e6))
        self._lock = threading.Lock()
        self._slices: dict[str, InstanceSlice] = {}
        self._clients: dict[int, _Client] = {}  # by key
        self._next_client = 0
        self._slot_gens = [0] * MAX_SLOTS
        self._instances: dict[str, _Instance] = {}  # by the key of _instance_key
        self._state = VerticalState()
        self._shares: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._selector = selectors.DefaultSelector()
        self._listener: socket.socket | None = None
        self.instances_dir = instances_dir_for(self.socket_path)
        self._sockets_lock = threading.Lock()       # the selector: the loop thread and admit's callers
        self._admissions: dict[str, Admission] = {}
        self._listeners: dict[str, socket.socket] = {}
        self._pending: dict[int, _Pending] = {}    # by file descriptor
        self.periods = 0
        self.events: deque[tuple[float, str]] = deque(maxlen=1000)  # (monotonic time, policy event)
        self._lateness: deque[float] = deque(maxlen=STATS_WINDOW_PERIODS)   # s each period began late
        self._gaps: deque[float] = deque(maxlen=STATS_WINDOW_PERIODS)       # s between heartbeats
        self._stale_gaps = 0

    # ---- control API (any thread) ----
    def set_slice(self, instance_id: str, cls: str, request: float, limit: float, llm: bool = False) -> None:
        """Declares or changes an instance's slice; applied from the next period on. The one
        place a slice is clamped: it is enforced from here, whatever sent it."""
        limit = min(1.0, max(0.0, limit))
        with self._lock:
            self._slices[instance_id] = InstanceSlice(instance_id, cls, min(max(0.0, request), limit), limit, llm)

    def remove_slice(self, instance_id: str) -> None:
        """The instance is gone from the GPU: its slice, its admission and its socket."""
        with self._lock:
            self._slices.pop(instance_id, None)
        with self._sockets_lock:
            self._admissions.pop(instance_id, None)
            self._close_listener(instance_id, remove_folder=True)

    def admit(self, instance_id: str, uid: int | None, cgroup: str | None = None) -> str:
        """Opens the instance's own registration socket (``worker.tokens.peers``) and returns its
        path; registrations there are accepted from ``uid`` (and a process in ``cgroup``) only.
        Admitting an instance again (a restarted worker adopting it) makes the socket anew."""
        path = instance_socket_path(self.instances_dir, instance_id)
        with self._sockets_lock:
            self._close_listener(instance_id, remove_folder=False)
            listener = listen_for(path, uid)
            self._listeners[instance_id] = listener
            self._admissions[instance_id] = Admission(instance_id, uid, cgroup)
            self._selector.register(listener, selectors.EVENT_READ, instance_id)
        return str(path)

    def _close_listener(self, instance_id: str, remove_folder: bool) -> None:
        """Caller holds the sockets lock."""
        listener = self._listeners.pop(instance_id, None)
        if listener is None:
            return
        self._selector.unregister(listener)
        listener.close()
        path = instance_socket_path(self.instances_dir, instance_id)
        path.unlink(missing_ok=True)
        if remove_folder:
            try:
                path.parent.rmdir()
            except OSError:
                pass

    def telemetry(self) -> dict[str, dict[str, Any]]:
        """Per instance: granted and used share, KLC, stretch, state, launches, waits, memory
        (over all its processes), how many processes it has and its measured cost per token."""
        with self._lock:
            return {instance.instance_id: self._view(instance) for instance in self._instances.values()}

    def _view(self, instance: _Instance) -> dict[str, Any]:
        """One instance's telemetry (caller holds the lock)."""
        grant, usage, signal = instance.shared.grant, instance.shared.usage, instance.shared.signal
        name = instance.instance_id
        klc = self._state.klc.get(name)
        ns_per_token = instance.cost.ns_per_token if instance.cost else self.default_ns_per_token
        # Tokens times what each costs (measured, or the default): a share of device time.
        used = sum(instance.deltas) * ns_per_token / ((len(instance.deltas) or 1) * self.params.period_s * 1e9)
        waiting = usage.consumed > allowed_at(grant, time.monotonic_ns())
        recent = name in self._state.last_active and time.monotonic() - self._state.last_active[name] < 0.1
        measured_klc = klc is not None and klc.last_klc is not None
        return {"granted_share": round(self._shares.get(name, 0.0), 4), "used_share": round(used, 4),
                "klc_ms": round(klc.last_klc * self.params.period_s * 1000, 1) if measured_klc else None,
                "stretch": round(klc.last_stretch or 1.0, 3) if measured_klc else None,
                "state": "waiting" if waiting else "active" if recent else "idle",
                "launches": max(0, usage.launches), "tokens": max(instance.last_consumed, usage.consumed),
                "blocked_ms": round(max(0, usage.blocked_ns) / 1e6, 3),
                "memory_bytes": instance.shared.memory_in_use(), "processes": len(instance.processes),
                "ns_per_token": round(ns_per_token, 3), "batch_factor": round(self._state.batch_factor, 4),
                "requests_in_flight": max(0, signal.inflight), "held_ms": round(max(0, usage.held_ns) / 1e6, 3),
                "window_tokens": grant.window, "outstanding_tokens": max(0, usage.outstanding),
                "floor_due": name in self._floors}

    # ---- lifecycle ----
    def start(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        if self.socket_path.exists():
            self.socket_path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.socket_path))
        os.chmod(self.socket_path, 0o600)      # the manager's own user; instances have sockets of their own
        listener.listen(64)
        listener.setblocking(False)
        self._listener = listener
        self._selector.register(listener, selectors.EVENT_READ, None)
        # A fresh heartbeat before the first shim can register, so nobody sees a stale manager.
        self._region.refilled(time.monotonic_ns())
        self._thread = threading.Thread(target=self._run, name=f"tokens-{self.gpu_uuid}", daemon=True)
        self._thread.start()
        if self._device_time is not None:
            self._calibrator = threading.Thread(target=self._calibrate_loop, name=f"calibrate-{self.gpu_uuid}",
                                                daemon=True)
            self._calibrator.start()
        log.info("token manager for %s at %s (capacity %.0f tokens/s)", self.gpu_uuid, self.socket_path,
                 self.capacity_per_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self._calibrator is not None:
            self._calibrator.join(5)
        for client in list(self._clients.values()):
            client.sock.close()
        self._clients.clear()
        for instance in self._instances.values():
            instance.shared.close()
        self._instances.clear()
        if self._listener is not None:
            self._listener.close()
        with self._sockets_lock:
            for pending in self._pending.values():
                pending.sock.close()
            self._pending.clear()
            for instance_id in list(self._listeners):
                self._close_listener(instance_id, remove_folder=False)    # an adopting worker reuses them
        self._selector.close()
        try:
            self.socket_path.unlink()
        except FileNotFoundError:
            pass
        self._region.close()

    # ---- the loop (manager thread only) ----
    def period_stats(self) -> dict[str, Any]:
        """How regularly the period loop ran lately: how late periods began (p50, p99, max, in ms),
        the longest gap between heartbeats, and how many gaps exceeded the shim's staleness limit
        (each would have opened the gates) since the start."""
        with self._lock:
            late, gaps = sorted(self._lateness), list(self._gaps)
            stale = self._stale_gaps

        def quantile(q: float) -> float:
            return round(late[min(len(late) - 1, int(q * len(late)))] * 1000, 3) if late else 0.0

        return {"periods": self.periods, "jitter_ms": {"p50": quantile(0.5), "p99": quantile(0.99),
                                                        "max": round(late[-1] * 1000, 3) if late else 0.0},
                "max_gap_ms": round(max(gaps, default=0.0) * 1000, 3), "stale_gaps": stale}

    def _run(self) -> None:
        if self.realtime:
            _realtime_priority()
        period = self.params.period_s
        next_at = time.monotonic()
        last_beat = next_at
        while not self._stop.is_set():
            next_at += period
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            began = time.monotonic()
            if delay <= 0:
                next_at = began  # fell behind: do not try to catch up in a burst
            try:
                self._serve_sockets()
                self._period(began)
            except Exception:
                log.exception("token period failed")
            with self._lock:
                self._lateness.append(max(0.0, began - next_at) if delay > 0 else -delay)
                self._gaps.append(began - last_beat)
                self._stale_gaps += began - last_beat > STALE_S
            last_beat = began

    def _period(self, now: float) -> None:
        with self._lock:
            active: set[str] = set()
            for instance in self._instances.values():
                shared = instance.shared
                consumed = shared.usage.consumed
                delta = max(0, consumed - instance.last_consumed)
                instance.last_consumed += delta
                instance.deltas.append(delta)
                if delta > 0 or shared.signal.inflight > 0 or consumed > allowed_at(shared.grant, time.monotonic_ns()):
                    active.add(instance.instance_id)
            instances = {i.instance_id for i in self._instances.values()}
            slices = tuple(self._slice_of(i) for i in sorted(instances))
            self._shares, self._state = allocate(
                VerticalContext(now, slices, frozenset(active), self.params), self._state)
            for event in self._state.events:
                self.events.append((now, event))
                log.info("%s: %s (batch factor %.3f)", self.gpu_uuid, event, self._state.batch_factor)
            now_ns = time.monotonic_ns()
            for instance in self._instances.values():
                share = self._shares.get(instance.instance_id, 0.0)
                rate = int(token_rate(share, instance.cost, self.default_ns_per_token) * (1 - HEADROOM))
                # Idle instances bank at most one period of tokens; debts carry over, but for
                # latency work served under isolation (its launches never wait for tokens).
                latency = self._slice_of(instance.instance_id).cls == "latency"
                rebase(instance.shared.grant, instance.shared.usage.consumed, now_ns, rate,
                       int(rate * self.params.period_s), forgive_debt=self.isolation is not None and latency)
            self._publish_release_rules()
            self.periods += 1
        self._region.refilled(time.monotonic_ns())

    def _slice_of(self, instance_id: str) -> InstanceSlice:
        """The instance's slice; an undeclared one is batch work with the whole device as its limit."""
        return self._slices.get(instance_id) or InstanceSlice(instance_id, "batch", 0.0, 1.0)

    def _publish_release_rules(self) -> None:
        """Writes which slots are latency work and each batch instance's window and floor for the
        next period (``dilu.policy.isolation``). Caller holds the lock."""
        if self.isolation is None:
            return
        latency = [i for i in self._instances.values() if self._slice_of(i.instance_id).cls == "latency"]
        batch = [i for i in self._instances.values() if self._slice_of(i.instance_id).cls != "latency"]
        periods = []
        for instance in batch:
            reported = instance.shared.usage.held_ns
            held, instance.last_held_ns = reported - instance.last_held_ns, reported
            ns_per_token = instance.cost.ns_per_token if instance.cost else self.default_ns_per_token
            tokens = instance.deltas[-1] if instance.deltas else 0
            periods.append(BatchPeriod(instance.instance_id, self._slice_of(instance.instance_id).request,
                                       tokens * ns_per_token / 1e9, held > 0, ns_per_token))
        decision, self._isolation_state = isolation.decide(
            IsolationContext(self.params.period_s, bool(latency), tuple(periods), self._state.batch_factor,
                             self.isolation), self._isolation_state)
        granted = decision.floors - self._floors
        self._floors = decision.floors
        for instance in latency:
            instance.shared.grant.flags = SLOT_LATENCY
            instance.shared.grant.window = 0
        for instance in batch:
            instance.shared.grant.window = decision.windows.get(instance.instance_id, 0)
            instance.shared.grant.flags = SLOT_FLOOR if instance.instance_id in decision.floors else 0
        self._region.header.latency_mask = sum(1 << i.slot for i in latency)
        if granted:
            self._wake_held()

    # ---- the closed loop (its own thread: NVML calls may take milliseconds) ----
    def _calibrate_loop(self) -> None:
        last = time.monotonic()
        self._device_time.busy_shares()          # starts the first interval
        with self._lock:
            for instance in self._instances.values():
                instance.calibrated_consumed = instance.last_consumed
        while not self._stop.wait(CALIBRATE_EVERY_S):
            try:
                shares = self._device_time.busy_shares()
            except Exception:
                log.exception("device time measurement failed")
                continue
            now = time.monotonic()
            self._calibrate(shares, now - last)
            last = now

    def _calibrate(self, busy_by_pid: dict[int, float], interval_s: float) -> None:
        """One interval's measurement: each instance's device share (its processes' summed) and
        the tokens it consumed meanwhile correct its cost per token."""
        with self._lock:
            for instance in self._instances.values():
                consumed = instance.last_consumed
                tokens, instance.calibrated_consumed = consumed - instance.calibrated_consumed, consumed
                pids = {c.pid for c in self._clients.values() if c.instance is instance}
                share = sum(busy_by_pid.get(pid, 0.0) for pid in pids)
                instance.cost = observe(instance.cost, device_share=share, interval_s=interval_s, tokens=tokens,
                                        default_ns_per_token=self.default_ns_per_token)

    def _serve_sockets(self) -> None:
        with self._sockets_lock:
            ready = self._selector.select(timeout=0)
            for key, _ in ready:
                if key.fileobj is self._listener:
                    self._accept(self._listener, None)
                elif isinstance(key.data, str):
                    self._accept(key.fileobj, key.data)
                elif isinstance(key.data, _Pending):
                    self._hello(key.data)
                else:
                    self._client_event(key.data)
            self._drop_silent(time.monotonic())

    def _accept(self, listener: socket.socket, instance_id: str | None) -> None:
        """Takes a connection; its HELLO is read when it comes, so a caller that says nothing
        never holds up the period loop. Caller holds the sockets lock."""
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, OSError):
            return
        if instance_id is not None:
            waiting = sum(1 for p in self._pending.values() if p.instance_id == instance_id)
            registered = len(self._instances[instance_id].processes) if instance_id in self._instances else 0
            if waiting + registered >= MAX_PROCS:
                _refuse(conn, f"instance {instance_id} has {MAX_PROCS} processes registered already")
                return
        conn.setblocking(False)
        pending = self._pending[conn.fileno()] = _Pending(conn, instance_id, time.monotonic())
        self._selector.register(conn, selectors.EVENT_READ, pending)

    def _drop_silent(self, now: float) -> None:
        """Closes connections that did not say HELLO in time. Caller holds the sockets lock."""
        for fd, pending in list(self._pending.items()):
            if now - pending.since > HELLO_WAIT_S:
                del self._pending[fd]
                self._selector.unregister(pending.sock)
                pending.sock.close()

    def _hello(self, pending: _Pending) -> None:
        """Answers a HELLO: the region's fd and the process's slot, or why not. Caller holds the
        sockets lock."""
        conn = pending.sock
        try:
            hello = conn.recv(256).decode("ascii", errors="replace").split()
        except BlockingIOError:
            return
        except OSError:
            hello = []
        del self._pending[conn.fileno()]
        self._selector.unregister(conn)
        if len(hello) != 4 or hello[0] != "HELLO" or hello[1] != str(ABI):
            _refuse(conn, f"expected HELLO {ABI} <pid> <instance>")
            return
        claimed = hello[3]
        if pending.instance_id is None:      # the manager's own user: trusted with what it says
            pid = int(hello[2]) if hello[2].isdigit() else 0
        else:
            peer = peer_of(conn)
            instance = self._instances.get(pending.instance_id)
            why = refusal(self._admissions.get(pending.instance_id), claimed, peer,
                          len(instance.processes) if instance else 0)
            if why is not None:
                log.warning("%s: refused a registration as %s: %s", self.gpu_uuid, claimed, why)
                _refuse(conn, why)
                return
            pid = peer.pid
        conn.settimeout(1.0)
        with self._lock:
            reply = self._register(conn, pid, claimed)
        if reply is None:
            conn.close()
            return
        client, generation = reply
        try:
            socket.send_fds(conn, [f"OK {client.instance.slot} {generation} {client.proc}\n".encode()],
                            [self._region.fd, *client.instance.shared.fds()])
        except OSError:
            pass        # it left at once: its EOF is read below like any exit
        conn.setblocking(False)
        self._selector.register(conn, selectors.EVENT_READ, client)
        log.info("%s: instance %s (pid %d) registered in slot %d (process %d)", self.gpu_uuid, claimed,
                 pid, client.instance.slot, client.proc)

    def _register(self, conn: socket.socket, pid: int, instance_id: str) -> tuple[_Client, int] | None:
        """A process entry in its instance's slot (a new slot, with fresh memory, for the
        instance's first process); None when there is no room (the shim is told why). Caller
        holds the lock."""
        key = _instance_key(instance_id, pid)
        instance = self._instances.get(key)
        if instance is None:
            used = {i.slot for i in self._instances.values()}
            free = next((i for i in range(MAX_SLOTS) if i not in used), None)
            if free is None:
                conn.sendall(b"ERR no free slot\n")
                return None
            self._slot_gens[free] = (self._slot_gens[free] + 1) & 0xFFFFFFFF or 1
            instance = self._instances[key] = _Instance(instance_id, free, InstanceRegion(free, self._slot_gens[free]))
            self._fresh_slot(instance)
        proc = next((i for i in range(MAX_PROCS) if i not in instance.processes), None)
        if proc is None:
            conn.sendall(f"ERR instance {instance_id} has {MAX_PROCS} processes registered already\n".encode())
            return None
        instance.shared.usage.proc_mem[proc] = 0
        instance.processes.add(proc)
        self._next_client += 1
        client = self._clients[self._next_client] = _Client(sock=conn, proc=proc, pid=pid, instance=instance,
                                                            key=self._next_client)
        return client, instance.shared.gen

    def _fresh_slot(self, instance: _Instance) -> None:
        """Release rules and one period of budget up front, so the first launch does not wait."""
        index, instance_id, grant = instance.slot, instance.instance_id, instance.shared.grant
        # Its release rules from its first launch, not from the next period: a latency instance
        # must never be held, and batch work beside latency work must not queue up meanwhile.
        if self.isolation is not None:
            if self._slice_of(instance_id).cls == "latency":
                grant.flags = SLOT_LATENCY
                self._region.header.latency_mask |= 1 << index
                for other in self._instances.values():
                    self._bound_window(other)
            else:
                self._bound_window(instance)
        self._region.header.slot_gen[index] = instance.shared.gen
        share = self._shares.get(instance_id)
        if share is None:
            known = self._slices.get(instance_id)
            share = known.limit if known else 1.0
        rate = int(token_rate(share, None, self.default_ns_per_token) * (1 - HEADROOM))
        grant.granted_at_ns = time.monotonic_ns()
        grant.granted = int(rate * self.params.period_s)
        grant.rate_per_s = rate

    def _bound_window(self, instance: _Instance) -> None:
        """Bounds a batch instance's window now if latency work shares the GPU (the period's
        decision refines it: measured cost, batch factor, floor). Caller holds the lock."""
        grant = instance.shared.grant
        if self._region.header.latency_mask and self._slice_of(instance.instance_id).cls != "latency" \
                and grant.window == 0:
            ns_per_token = instance.cost.ns_per_token if instance.cost else self.default_ns_per_token
            grant.window = isolation.window_tokens(self.isolation.window_s, ns_per_token)

    def _wake_held(self) -> None:
        """Wakes batch launches held for latency work so they look again (a floor granted, a
        latency instance gone); they wait on the latency instances' signals. Caller holds the lock."""
        for instance in self._instances.values():
            if self._region.header.latency_mask & (1 << instance.slot):
                instance.shared.wake_held()

    def _client_event(self, client: _Client) -> None:
        """A registered process asked for signals, or left (EOF). Caller holds the sockets lock."""
        try:
            data = client.sock.recv(256)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            for line in data.decode("ascii", errors="replace").splitlines()[:MAX_SIGNAL_ASKS]:
                self._answer_signal(client, line.split())
            return
        self._selector.unregister(client.sock)
        client.sock.close()
        instance = client.instance
        with self._lock:
            self._clients.pop(client.key, None)
            # The process is gone: what it still held goes back to the instance.
            instance.shared.grant.mem_returned += max(0, instance.shared.usage.proc_mem[client.proc])
            instance.shared.usage.proc_mem[client.proc] = 0
            instance.processes.discard(client.proc)
            if not instance.processes:
                self._instances.pop(_instance_key(instance.instance_id, client.pid), None)
                # A latency instance that died serving must not hold anyone's launches (the next
                # period would drop it too; this is at once).
                self._region.header.latency_mask &= ~(1 << instance.slot)
                instance.shared.wake_held()
                instance.shared.close()
        log.info("%s: instance %s (pid %d) left slot %d", self.gpu_uuid, instance.instance_id, client.pid,
                 instance.slot)

    def _answer_signal(self, client: _Client, words: list[str]) -> None:
        """"SIGNAL <slot>": a read-only fd of that latency instance's signal, or why there is
        none. Anything else a shim sends is ignored. Caller holds the sockets lock."""
        if len(words) != 2 or words[0] != "SIGNAL" or not words[1].isdigit() or int(words[1]) >= MAX_SLOTS:
            return
        index = int(words[1])
        with self._lock:
            target = next((i for i in self._instances.values() if i.slot == index), None)
            latency = target is not None and bool(self._region.header.latency_mask & (1 << index))
            reader = target.shared.signal_reader_fd() if latency else None
            gen = self._slot_gens[index]
        try:
            if reader is None:
                client.sock.send(f"NOSIG {index} {gen}\n".encode())
            else:
                socket.send_fds(client.sock, [f"SIG {index} {gen}\n".encode()], [reader])
        except OSError:
            pass           # a shim that does not read its answers goes without
        finally:
            if reader is not None:
                os.close(reader)


def _realtime_priority() -> None:
    """The calling thread (the period loop) at a real-time priority, where allowed (root, or
    CAP_SYS_NICE): it then wakes on time however busy the host's cores are. It sleeps most of
    each period, and the kernel's real-time throttling keeps a runaway from taking a core."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    except (OSError, AttributeError) as exc:
        log.info("period loop at normal priority (%s)", exc)


def _refuse(conn: socket.socket, why: str) -> None:
    try:
        conn.setblocking(True)
        conn.settimeout(0.1)
        conn.sendall(f"ERR {why}\n".encode())
    except OSError:
        pass
    conn.close()


def _instance_key(instance_id: str, pid: int) -> str:
    """Processes without an instance id ("-") are each their own instance."""
    return instance_id if instance_id != "-" else f"-pid-{pid}"


def socket_path_for(directory: Path, gpu_uuid: str) -> Path:
    """The manager's socket; shortened when it or its instances' sockets (``instances_dir_for``)
    would exceed AF_UNIX's limit: under /run for root (whose instances each have a /tmp of
    their own), else under /tmp."""
    path = Path(directory) / f"{gpu_uuid}.sock"
    if len(str(path)) < SHORT_PATH:
        return path
    import hashlib

    digest = hashlib.sha1(str(path).encode()).hexdigest()[:16]
    return Path("/run" if os.geteuid() == 0 else "/tmp") / f"dilu-{os.getuid()}-{digest}.sock"


def instances_dir_for(socket_path: Path) -> Path:
    """Where the instances' own sockets live: beside the manager's."""
    return socket_path.with_suffix(".d")


SHORT_PATH = 72         # leaves room for an instance's socket (30 more characters) in AF_UNIX's 108
