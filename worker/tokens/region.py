"""The shared-memory region of one GPU's token manager (mirror of shim/include/dilu_shm.h).

A slot is an instance (all its processes share it); a process entry is one registered process.
The manager is the only writer of the header (but ``release_gen``, which latency shims bump),
of each slot's ``granted``, ``granted_at_ns``, ``rate_per_s``, ``pid``, ``gen``, ``mem_returned``,
``processes``, ``flags`` and ``window``, and of each process entry's ``pid`` and ``slot``; shims
only add to ``consumed``, ``launches``, ``blocked_ns``, ``held_ns``, ``inflight`` and
``mem_used`` (a slot's, and their own process entry's) and store ``outstanding``. Aligned 8-byte
loads and stores are atomic on the platforms Dilu runs on, so no locks cross the boundary.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform

MAGIC = 0x554C4944
ABI = 4
SLOT_LATENCY = 1      # never waits for tokens while it has a request in flight
SLOT_FLOOR = 2        # a batch instance below its floor: not held for latency work
MAX_SLOTS = 64
MAX_PROCS = 256
_FUTEX_WAKE = 1
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine(), 202)
_libc = ctypes.CDLL(None, use_errno=True)


class Header(ctypes.Structure):
    _fields_ = [("magic", ctypes.c_uint32), ("abi", ctypes.c_uint32), ("slots", ctypes.c_uint32),
                ("period_us", ctypes.c_uint32), ("heartbeat_ns", ctypes.c_int64),
                ("refill_gen", ctypes.c_uint32), ("release_gen", ctypes.c_uint32), ("latency_mask", ctypes.c_uint64),
                ("pad", ctypes.c_uint8 * 24)]


class Slot(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_int32), ("gen", ctypes.c_uint32), ("granted", ctypes.c_int64),
                ("consumed", ctypes.c_int64), ("launches", ctypes.c_int64), ("blocked_ns", ctypes.c_int64),
                ("mem_used", ctypes.c_int64), ("rate_per_s", ctypes.c_int64), ("granted_at_ns", ctypes.c_int64),
                ("mem_returned", ctypes.c_int64), ("processes", ctypes.c_int32), ("flags", ctypes.c_uint32),
                ("window", ctypes.c_int64), ("held_ns", ctypes.c_int64), ("outstanding", ctypes.c_int64),
                ("inflight", ctypes.c_int32), ("reserved0", ctypes.c_uint32), ("reserved", ctypes.c_int64 * 2)]

    @property
    def memory_in_use(self) -> int:
        """The instance's bytes over all its live processes."""
        return self.mem_used - self.mem_returned


class Proc(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_int32), ("slot", ctypes.c_uint32), ("mem_used", ctypes.c_int64)]


assert ctypes.sizeof(Header) == 64 and ctypes.sizeof(Slot) == 128 and ctypes.sizeof(Proc) == 16
PROCS_OFFSET = ctypes.sizeof(Header) + MAX_SLOTS * ctypes.sizeof(Slot)
SIZE = PROCS_OFFSET + MAX_PROCS * ctypes.sizeof(Proc)


class Region:
    """A memfd-backed region; ``fd`` is what registration hands to each shim."""

    def __init__(self, period_us: int) -> None:
        self.fd = os.memfd_create("dilu-tokens", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, SIZE)
        self._map = mmap.mmap(self.fd, SIZE)
        self.header = Header.from_buffer(self._map, 0)
        self.slots = [Slot.from_buffer(self._map, ctypes.sizeof(Header) + i * ctypes.sizeof(Slot))
                      for i in range(MAX_SLOTS)]
        self.procs = [Proc.from_buffer(self._map, PROCS_OFFSET + i * ctypes.sizeof(Proc)) for i in range(MAX_PROCS)]
        self.header.abi = ABI
        self.header.slots = MAX_SLOTS
        self.header.period_us = period_us
        self.header.magic = MAGIC  # last: a shim checks it before trusting the rest
        self._futex_address = ctypes.addressof(self.header) + Header.refill_gen.offset
        self._release_address = ctypes.addressof(self.header) + Header.release_gen.offset

    def refilled(self, now_ns: int) -> None:
        """Publishes a refill: heartbeat, generation bump, and a wake-up for waiting launches."""
        self.header.heartbeat_ns = now_ns
        self.header.refill_gen = (self.header.refill_gen + 1) & 0xFFFFFFFF
        _libc.syscall(_SYS_FUTEX, ctypes.c_void_p(self._futex_address), _FUTEX_WAKE, 0x7FFFFFFF, None, None, 0)

    def wake_held(self) -> None:
        """Wakes launches held for latency work so they look again (a floor granted, a latency
        instance gone); ``release_gen`` is the latency shims' to bump, so it is left alone."""
        _libc.syscall(_SYS_FUTEX, ctypes.c_void_p(self._release_address), _FUTEX_WAKE, 0x7FFFFFFF, None, None, 0)

    def close(self) -> None:
        del self.header
        self.slots.clear()
        self.procs.clear()
        self._map.close()
        os.close(self.fd)


def allowed_at(slot: Slot, now_ns: int) -> int:
    """The slot's credit at ``now_ns``: the last rebase plus what has accrued since (as the shim sees it)."""
    return slot.granted + slot.rate_per_s * max(0, now_ns - slot.granted_at_ns) // 1_000_000_000


def rebase(slot: Slot, now_ns: int, rate_per_s: int, depth: int, forgive_debt: bool = False) -> None:
    """Moves the accrual base to ``now_ns`` with a new rate; an idle slot banks at most ``depth``;
    ``forgive_debt``: what it consumed beyond its credit is not owed.

    ``granted_at_ns`` is written before ``granted`` so a shim that reads between the two sees too
    little credit for an instant, never too much."""
    allowed = min(allowed_at(slot, now_ns), slot.consumed + depth)
    if forgive_debt:
        allowed = max(allowed, slot.consumed)
    slot.granted_at_ns = now_ns
    slot.granted = allowed
    slot.rate_per_s = rate_per_s
