"""The runtime pool's template process (``python -m worker.instance --zygote``).

It imports what spares preload (the instance server, torch, ...) once, then forks a spare
whenever the worker asks: a fork shares those imports copy-on-write, so a new spare is ready in
milliseconds and costs no CPU, where starting an interpreter and importing torch again costs
seconds of CPU (on a small host, the pool's refills would otherwise compete with serving).

Protocol, over the Unix socket on stdin (one line per message):
  worker -> zygote  "FORK\\n" with three or four fds (SCM_RIGHTS): the spare's stdin, its log, its
                    listener, and the Unix socket it also listens on when it has one
  zygote -> worker  "READY\\n" once the imports are done; "FORKED <pid>\\n" per fork;
                    "EXIT <pid> <code>\\n" when a spare (or the instance it became) ends, with the
                    exit code as subprocess reports it (negative: killed by that signal)
Nothing runs in the zygote but imports: no thread, no torch operation, so forking it is safe.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
from collections.abc import Callable

from worker.sandbox import die_with_parent

MAX_MESSAGE = 4096


def serve_forks(control: socket.socket, become_spare: Callable[[int, int | None], None]) -> None:
    """The zygote's loop: forks on request, reports exits; returns when the worker hangs up."""
    control.sendall(b"READY\n")
    # A child's exit wakes the loop at once (the signal writes a byte to this pipe): until the
    # worker hears of it, the stopped instance counts as holding its memory (it polled every
    # 50 ms, and exits were seen in batches).
    exited, exited_signal = os.pipe()
    os.set_blocking(exited, False)
    os.set_blocking(exited_signal, False)
    signal.set_wakeup_fd(exited_signal)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    while True:
        _report_exits(control)
        readable, _, _ = select.select([control, exited], [], [], 1.0)
        if exited in readable:
            _drain(exited)
        if control not in readable:
            continue
        message, fds, _, _ = socket.recv_fds(control, MAX_MESSAGE, 4)
        if not message:
            return
        if len(fds) not in (3, 4):
            for fd in fds:
                os.close(fd)
            continue
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.close(exited)
            os.close(exited_signal)
            _in_child(control, fds, become_spare)
        for fd in fds:
            os.close(fd)
        control.sendall(f"FORKED {pid}\n".encode())


def _in_child(control: socket.socket, fds: list[int], become_spare: Callable[[int, int | None], None]) -> None:
    stdin, log, listener, *unix = fds
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.setsid()                  # its own process group: the worker signals the group
        die_with_parent()            # the zygote's death (and so the worker's) ends it
        control.close()
        os.dup2(stdin, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(stdin)
        os.close(log)
        sys.stdin = os.fdopen(0, "r", closefd=False)
        become_spare(listener, unix[0] if unix else None)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - report it in the instance's log, then end
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def _report_exits(control: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        control.sendall(f"EXIT {pid} {os.waitstatus_to_exitcode(status)}\n".encode())


def ignore_interrupts() -> None:
    """A Ctrl-C in the worker's terminal reaches its whole process group; the zygote ends with
    the worker instead (its control socket closes)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
