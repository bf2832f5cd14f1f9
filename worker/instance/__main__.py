"""Entry point of an instance process: ``python -m worker.instance`` (see ``dilu.instance_protocol``).

With ``--spare`` the process imports the instance server, then waits for its assignment: one JSON
line on stdin with the config file, the environment to add and the working directory. The worker
keeps such spares ready so that a cold start skips the interpreter's start-up and these imports.
With ``--zygote`` it imports the same once and forks spares on the worker's request
(``worker.instance.zygote``).
"""

import json
import os
import socket
import sys
import time

from dilu.instance_protocol import ENV_LISTEN_FD, ENV_LISTEN_UNIX_FD, ENV_PRELOAD, InstanceEnvironment
from worker.instance.server import bind_listener, exit_now, preload, serve


def _import_common(modules: str) -> None:
    """Imports the libraries most functions use (torch, ...) while the spare waits, so an
    instance specialised from it skips them; one that fails to import is only noted."""
    import importlib

    for name in filter(None, (m.strip() for m in modules.split(","))):
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - a missing library must not end the spare
            print(f"dilu: spare could not preload {name}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


def _await_assignment(listener_fd: int | None = None, unix_fd: int | None = None) -> float | None:
    """A spare's wait: applies the assignment (environment, folder) and returns when it came;
    None when the worker closed the pipe (the spare is not needed). ``listener_fd`` and
    ``unix_fd``: the listeners' numbers in this process, when they differ from the worker's (a
    forked spare)."""
    line = sys.stdin.readline()
    if not line:
        return None
    assignment = json.loads(line)
    assigned_at = time.time()
    if assignment.get("private_temp"):   # while still root: its own /tmp and /dev/shm
        from worker.reach import Cover
        from worker.sandbox import private_temp

        private_temp(int(assignment["private_temp"]), tuple(assignment.get("keep_temp") or ()),
                     tuple(Cover.from_json(c) for c in assignment.get("reach") or ()))
    if assignment.get("user"):
        _become(*assignment["user"])
    os.environ.update(assignment["env"])
    if listener_fd is not None:
        os.environ[ENV_LISTEN_FD] = str(listener_fd)
        if unix_fd is not None:
            os.environ[ENV_LISTEN_UNIX_FD] = str(unix_fd)
        else:
            os.environ.pop(ENV_LISTEN_UNIX_FD, None)
    os.chdir(assignment["cwd"])
    return assigned_at


def _become(uid: int, gid: int) -> None:
    """A root spare takes its function's user before anything of the function runs (no way back).
    The switch leaves the process undumpable, its /proc owned by root, which would close even
    /proc/self/fd to the function; made dumpable again, it is like any process of that user:
    open to the function's own processes only."""
    from worker.sandbox import become, die_with_parent, set_dumpable

    become(uid, gid)
    die_with_parent()       # changing credentials cleared it
    set_dumpable()


def _serve_assignment(listener_fd: int, unix_fd: int | None) -> None:
    assigned_at = _await_assignment(listener_fd, unix_fd)
    if assigned_at is not None:
        _serve(assigned_at)


def main() -> None:
    assigned_at = None
    if "--zygote" in sys.argv[1:]:
        from worker.instance.zygote import ignore_interrupts, serve_forks

        ignore_interrupts()
        preload()
        _import_common(os.environ.get(ENV_PRELOAD, ""))
        serve_forks(socket.socket(fileno=0), _serve_assignment)
        return
    if "--spare" in sys.argv[1:]:
        preload()
        _import_common(os.environ.get(ENV_PRELOAD, ""))
        assigned_at = _await_assignment()
        if assigned_at is None:
            return
    _serve(assigned_at)


def _serve(assigned_at: float | None) -> None:
    environment = InstanceEnvironment.from_environ()
    config = environment.config()
    if config is None or (environment.listen_fd is None and environment.listen is None):
        sys.exit("worker.instance: DILU_INSTANCE_CONFIG(_JSON) and DILU_LISTEN_FD (or DILU_LISTEN) "
                 "must be set by the worker")
    listener = socket.socket(fileno=environment.listen_fd) if environment.listen_fd is not None \
        else bind_listener(*environment.listen)
    unix = socket.socket(fileno=environment.listen_unix_fd) if environment.listen_unix_fd is not None else None
    serve(config, listener, assigned_at, environment.key, environment.device, also=unix)
    exit_now()   # drained: nothing left to wait for


if __name__ == "__main__":
    main()
