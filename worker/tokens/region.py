"""The shared memory of one GPU's token manager (mirror of shim/include/dilu_shm.h).

One board per GPU, and per instance a grant, a usage and a signal, each a memfd of its own: the
header file says who writes what and why nothing is shared that one instance could use against
another. The kernel enforces it: the board and every grant are sealed against writes once the
manager has mapped them (``F_SEAL_FUTURE_WRITE``: the manager's mapping stays writable, no
later one can be), every memfd is sealed against shrinking (a shim could otherwise cut the page
under the manager's mapping) and is 0600, so a read-only descriptor of a signal handed to another
user cannot be reopened for writing through /proc. Aligned 8-byte loads and stores are atomic on
the platforms Dilu runs on, so no locks cross the boundary.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import platform

MAGIC = 0x554C4944
ABI = 5
SLOT_LATENCY = 1      # never waits for tokens while it has a request in flight
SLOT_FLOOR = 2        # a batch instance below its floor: not held for latency work
MAX_SLOTS = 64
MAX_PROCS = 32        # processes of one instance registered at once
PAGE = 4096
_FUTEX_WAKE = 1
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine(), 202)
_MFD_NOEXEC_SEAL = 0x0008
_F_SEAL_SEAL, _F_SEAL_SHRINK, _F_SEAL_GROW, _F_SEAL_FUTURE_WRITE = 0x0001, 0x0002, 0x0004, 0x0010
_libc = ctypes.CDLL(None, use_errno=True)


class Board(ctypes.Structure):
    _fields_ = [("magic", ctypes.c_uint32), ("abi", ctypes.c_uint32), ("slots", ctypes.c_uint32),
                ("period_us", ctypes.c_uint32), ("heartbeat_ns", ctypes.c_int64),
                ("refill_gen", ctypes.c_uint32), ("reserved0", ctypes.c_uint32), ("latency_mask", ctypes.c_uint64),
                ("pad", ctypes.c_uint8 * 24), ("slot_gen", ctypes.c_uint32 * MAX_SLOTS)]


class Grant(ctypes.Structure):
    _fields_ = [("gen", ctypes.c_uint32), ("flags", ctypes.c_uint32), ("granted", ctypes.c_int64),
                ("granted_at_ns", ctypes.c_int64), ("rate_per_s", ctypes.c_int64), ("window", ctypes.c_int64),
                ("mem_returned", ctypes.c_int64), ("reserved", ctypes.c_int64 * 2)]


class Usage(ctypes.Structure):
    _fields_ = [("consumed", ctypes.c_int64), ("launches", ctypes.c_int64), ("blocked_ns", ctypes.c_int64),
                ("held_ns", ctypes.c_int64), ("mem_used", ctypes.c_int64), ("outstanding", ctypes.c_int64),
                ("reserved", ctypes.c_int64 * 2), ("proc_mem", ctypes.c_int64 * MAX_PROCS)]


class Signal(ctypes.Structure):
    _fields_ = [("inflight", ctypes.c_int32), ("release_gen", ctypes.c_uint32), ("reserved", ctypes.c_int64 * 7)]


assert ctypes.sizeof(Board) == 64 + 4 * MAX_SLOTS and ctypes.sizeof(Grant) == 64
assert ctypes.sizeof(Usage) == 64 + 8 * MAX_PROCS and ctypes.sizeof(Signal) == 64


class _Page:
    """One memfd page mapped read-write by the manager, viewed as ``kind``."""

    def __init__(self, name: str, kind: type[ctypes.Structure]) -> None:
        try:
            self.fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING | _MFD_NOEXEC_SEAL)
        except OSError:      # a kernel older than 6.3: no exec seal to ask for
            self.fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.fchmod(self.fd, 0o600)
        os.ftruncate(self.fd, PAGE)
        self._map = mmap.mmap(self.fd, PAGE)
        self.view = kind.from_buffer(self._map)
        self.address = ctypes.addressof(self.view)

    def seal(self, read_only: bool) -> None:
        """No shrinking or growing, ever; with ``read_only`` no writable mapping but the manager's."""
        seals = _F_SEAL_SHRINK | _F_SEAL_GROW | (_F_SEAL_FUTURE_WRITE if read_only else 0) | _F_SEAL_SEAL
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, seals)

    def read_only_fd(self) -> int:
        """A new descriptor of the page open for reading only (the caller closes it)."""
        return os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC)

    def close(self) -> None:
        del self.view
        self._map.close()
        os.close(self.fd)


def _wake(address: int) -> None:
    _libc.syscall(_SYS_FUTEX, ctypes.c_void_p(address), _FUTEX_WAKE, 0x7FFFFFFF, None, None, 0)


class InstanceRegion:
    """One instance's grant (sealed read-only for it), usage and signal, for generation ``gen``
    of its slot: fresh pages, so nothing an earlier instance in the slot kept reaches this one."""

    def __init__(self, slot: int, gen: int) -> None:
        self.slot, self.gen = slot, gen
        self._grant = _Page(f"dilu-grant-{slot}", Grant)
        self._usage = _Page(f"dilu-usage-{slot}", Usage)
        self._signal = _Page(f"dilu-signal-{slot}", Signal)
        self.grant: Grant = self._grant.view
        self.usage: Usage = self._usage.view
        self.signal: Signal = self._signal.view
        self.grant.gen = gen
        self._grant.seal(read_only=True)
        self._usage.seal(read_only=False)
        self._signal.seal(read_only=False)

    def fds(self) -> list[int]:
        """What a process of the instance is handed: grant, usage, signal (after the board's)."""
        return [self._grant.fd, self._usage.fd, self._signal.fd]

    def signal_reader_fd(self) -> int:
        """A read-only descriptor of the signal, for a batch instance's shim (the caller closes it)."""
        return self._signal.read_only_fd()

    def memory_in_use(self) -> int:
        """The instance's bytes over all its live processes (what it reports, never below 0)."""
        return max(0, self.usage.mem_used - self.grant.mem_returned)

    def wake_held(self) -> None:
        """Wakes batch launches held on this instance's requests, so they look again."""
        _wake(self._signal.address + Signal.release_gen.offset)

    def close(self) -> None:
        del self.grant, self.usage, self.signal
        for page in (self._grant, self._usage, self._signal):
            page.close()


class Region:
    """The GPU's board; ``fd`` is what registration hands to each shim first."""

    def __init__(self, period_us: int) -> None:
        self._board = _Page("dilu-board", Board)
        self.fd = self._board.fd
        self.header: Board = self._board.view
        self.header.abi = ABI
        self.header.slots = MAX_SLOTS
        self.header.period_us = period_us
        self.header.magic = MAGIC  # last: a shim checks it before trusting the rest
        self._board.seal(read_only=True)
        self._futex_address = self._board.address + Board.refill_gen.offset

    def refilled(self, now_ns: int) -> None:
        """Publishes a refill: heartbeat, generation bump, and a wake-up for waiting launches."""
        self.header.heartbeat_ns = now_ns
        self.header.refill_gen = (self.header.refill_gen + 1) & 0xFFFFFFFF
        _wake(self._futex_address)

    def close(self) -> None:
        del self.header
        self._board.close()


def allowed_at(grant: Grant, now_ns: int) -> int:
    """The instance's credit at ``now_ns``: the last rebase plus what has accrued since (as the shim sees it)."""
    return grant.granted + grant.rate_per_s * max(0, now_ns - grant.granted_at_ns) // 1_000_000_000


def rebase(grant: Grant, consumed: int, now_ns: int, rate_per_s: int, depth: int, forgive_debt: bool = False) -> None:
    """Moves the accrual base to ``now_ns`` with a new rate; an idle instance banks at most
    ``depth`` beyond what it ``consumed``; ``forgive_debt``: what it consumed beyond its credit
    is not owed.

    ``granted_at_ns`` is written before ``granted`` so a shim that reads between the two sees too
    little credit for an instant, never too much."""
    allowed = min(allowed_at(grant, now_ns), consumed + depth)
    if forgive_debt:
        allowed = max(allowed, consumed)
    grant.granted_at_ns = now_ns
    grant.granted = allowed
    grant.rate_per_s = rate_per_s
