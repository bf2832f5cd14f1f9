"""The token manager's memory as a shim gets it (worker/tokens/region.py): what the kernel lets a
registered process do with each memfd, and what the manager makes of absurd counters."""

from __future__ import annotations

import logging
import mmap
import os
import socket
import struct
from pathlib import Path

import pytest

from tests.shim_harness import running_manager
from tests.waiting import eventually
from worker.tokens.region import ABI


def register(manager, instance: str) -> tuple[socket.socket, list[int]]:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(5)
    conn.connect(str(manager.socket_path))
    conn.sendall(f"HELLO {ABI} {os.getpid()} {instance}\n".encode())
    reply, fds, _, _ = socket.recv_fds(conn, 256, 4)
    assert reply.startswith(b"OK") and len(fds) == 4, reply
    return conn, fds


def test_what_is_handed_over_read_only_stays_read_only_and_nothing_can_shrink(tmp_path: Path) -> None:
    with running_manager(tmp_path, "GPU-memfds") as manager:
        conn, (board, grant, usage, signal) = register(manager, "alpha")
        for fd in (board, grant):
            with pytest.raises(PermissionError):
                mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            with pytest.raises(PermissionError):
                os.pwrite(fd, b"x", 0)
        for fd in (board, grant, usage, signal):
            with pytest.raises(PermissionError):
                os.ftruncate(fd, 0)          # the manager's mapping would fault past the end
            assert os.fstat(fd).st_mode & 0o777 == 0o600
        mmap.mmap(usage, 4096).close()       # its own usage and signal it may write
        mmap.mmap(signal, 4096).close()
        for fd in (board, grant, usage, signal):
            os.close(fd)
        conn.close()


def test_absurd_counters_of_one_instance_leave_the_others_served(tmp_path: Path, caplog) -> None:
    manager_log = logging.getLogger("worker.tokens.manager")
    with running_manager(tmp_path, "GPU-absurd") as manager:
        manager.set_slice("liar", "batch", 0.5, 1.0)
        manager.set_slice("honest", "latency", 0.5, 1.0)
        liar, liar_fds = register(manager, "liar")
        honest, honest_fds = register(manager, "honest")
        usage = mmap.mmap(liar_fds[2], 4096)
        signal = mmap.mmap(liar_fds[3], 4096)
        with caplog.at_level(logging.ERROR, logger=manager_log.name):
            for consumed in (2 ** 63 - 1, -(2 ** 63), 0):     # the last one: a rewind after a huge count
                struct.pack_into("<qqqqqq", usage, 0, consumed, -1, -(2 ** 62), -(2 ** 62), 2 ** 63 - 1, -5)
                struct.pack_into("<i", signal, 0, -(2 ** 31))
                start = manager.periods
                eventually(lambda start=start: manager.periods > start + 3, timeout=10, what="periods to go on")
            view = manager.telemetry()
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], "a period failed"
        assert view["liar"]["launches"] == 0 and view["liar"]["requests_in_flight"] == 0
        assert view["liar"]["tokens"] == 2 ** 63 - 1, "a rewind does not undo what it reported"
        assert view["honest"]["tokens"] == 0 and view["honest"]["state"] != "waiting"
        usage.close()
        signal.close()
        for fd in liar_fds + honest_fds:
            os.close(fd)
        liar.close()
        honest.close()
