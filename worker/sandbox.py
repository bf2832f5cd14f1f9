"""Where and as whom process-runtime instances run when the worker is root.

Instance code never runs as root: a root worker starts each instance process as its function's
own unprivileged user (``worker.uids``) in a folder of its own, ``<root>/<instance>/`` (owned by
that user, mode 0700) holding ``code/`` (the function's files, hard-linked from the bundle cache
where they are readable to all, copied otherwise) and ``home/`` (its HOME and TMPDIR). The
worker's own state (database, bundle cache, logs) and other functions' instances stay out of its
reach; ``<root>/run/`` holds what every instance must reach (the token manager's socket, the
simulated GPU's clock).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import stat
import sys
import tempfile
from pathlib import Path

from worker import reach as reach_module
from worker.mounts import MS_REC, MS_SLAVE, bind_read_only, tmpfs
from worker.reach import Cover
from worker.uids import InstanceUser, UidRegistry

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_CLONE_NEWNS = 0x00020000
PRIVATE_TEMP = ("/tmp", "/var/tmp", "/dev/shm")      # the folders every user may write
SANDBOX_PARENT = Path("/run")   # root's own, and out of PRIVATE_TEMP: instances must still reach their folder


def die_with_parent() -> None:
    """The calling process gets SIGTERM when its parent dies: instances must not outlive a
    worker killed with SIGKILL. Set after any credential change (which clears it)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def set_dumpable() -> None:
    """Marks the calling process dumpable (a credential change cleared it)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 1)
    except (OSError, AttributeError):
        pass


def private_temp(size_bytes: int, keep: tuple[str, ...] = (), reach: tuple[Cover, ...] = ()) -> None:
    """Gives the calling root process (about to become an instance) a mount namespace of its own
    with a fresh tmpfs of ``size_bytes`` on each of ``PRIVATE_TEMP``: what one function writes there,
    no other sees. Its mounts are slaves of the host's, so nothing it mounts reaches the host.
    ``keep``: folders inside those (the platform's own install, where it lives under /tmp) that
    stay visible in the new ones, read-only (``kept_in_temp``); ``reach``: folders others cannot
    traverse, seen holding only the platform's own paths (``worker.reach``). Raises OSError when
    the kernel refuses (no CAP_SYS_ADMIN)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNS) != 0 or libc.mount(b"none", b"/", None, MS_REC | MS_SLAVE, None) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"a mount namespace of its own: {os.strerror(error)}")
    held = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY)) for path in keep if os.path.isdir(path)]
    reached = reach_module.hold(reach)
    options = f"size={size_bytes},mode=1777".encode()
    for target in PRIVATE_TEMP:
        if os.path.isdir(target):
            tmpfs(target, options)
    for path, fd in held:     # the originals, reached through descriptors opened before the tmpfs hid them
        os.makedirs(path, mode=0o755, exist_ok=True)
        bind_read_only(fd, path)
    reach_module.apply(reached)


def kept_in_temp(paths: list[str]) -> tuple[str, ...]:
    """The folders right inside ``PRIVATE_TEMP`` that hold any of ``paths`` (the Python and the
    code instances run): a private /tmp must not hide the platform itself (pure)."""
    kept = set()
    for path in paths:
        for temp in PRIVATE_TEMP:
            if path.startswith(temp + "/"):
                kept.add(f"{temp}/{path[len(temp) + 1:].split('/', 1)[0]}")
    return tuple(sorted(kept))


def platform_paths(python: str) -> list[str]:
    """Where what an instance runs comes from: the Python (``python``, its prefix and the real
    interpreter) and Dilu's own packages."""
    python = shutil.which(python) or python
    real = os.path.realpath(python)
    return [os.path.realpath(p) for p in (python, os.path.dirname(os.path.dirname(python)), real,
                                          os.path.dirname(os.path.dirname(real)), sys.prefix, sys.base_prefix,
                                          str(Path(__file__).resolve().parent.parent))]


def platform_reach(python: str) -> tuple[Cover, ...]:
    """The covers an instance needs to reach the platform (``worker.reach``): none unless its
    Python or Dilu lies below a folder others cannot traverse."""
    return reach_module.covers_for(platform_paths(python))


def private_temp_problem(python: str) -> str | None:
    """Why instances cannot get a private /tmp and /dev/shm here (tried in a child), or None."""
    import subprocess

    probe = subprocess.run([python, "-c", "from worker.sandbox import private_temp; private_temp(1 << 20)"],
                           capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    if probe.returncode == 0:
        return None
    return (probe.stderr.strip().splitlines() or [f"exit status {probe.returncode}"])[-1]


def become(uid: int, gid: int) -> None:
    """Drop every group and become ``uid:gid`` (no way back): in a child before exec, or in a
    root spare at its assignment."""
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)


def _readable_by_all(path: Path) -> bool:
    mode = path.stat().st_mode
    return bool(mode & stat.S_IROTH) and (not mode & stat.S_IXUSR or bool(mode & stat.S_IXOTH))


def _link_or_copy(source: str, target: str) -> None:
    # A hard link costs nothing and shares the (read-only to others) inode; a file others cannot
    # read is copied and made readable, since its only reader is this instance.
    path = Path(source)
    if _readable_by_all(path):
        try:
            os.link(source, target)
            return
        except OSError:
            pass
    shutil.copy2(source, target)
    os.chmod(target, 0o755 if path.stat().st_mode & stat.S_IXUSR else 0o644)


SANDBOX_PREFIX = "dilu-instances-"     # each worker's root of its instances' folders

class Sandboxes:
    """The folders of one worker's instances, under a root made for it in /run (out of what instances
    see privately: /tmp, /var/tmp, /dev/shm), or the temp folder where /run is not writable."""

    def __init__(self, users: UidRegistry) -> None:
        self.users = users
        # mkdtemp: a new folder only this process made (no one can have planted it), then opened
        # to traversal only: others cannot list it, each instance reaches its own folder.
        parent = SANDBOX_PARENT if os.access(SANDBOX_PARENT, os.W_OK) else None
        self.root = Path(tempfile.mkdtemp(prefix=SANDBOX_PREFIX, dir=parent))
        self.root.chmod(0o711)
        self.shared = self.root / "run"
        self.shared.mkdir(mode=0o711)

    def create(self, instance_id: str, source_dir: str, user: InstanceUser) -> tuple[Path, Path]:
        """(code folder, home folder) of a new instance of ``user``'s function, its code in place."""
        folder = self.root / instance_id
        folder.mkdir(mode=0o700)
        code, home = folder / "code", folder / "home"
        if source_dir:
            shutil.copytree(source_dir, code, symlinks=False, copy_function=_link_or_copy,
                            ignore_dangling_symlinks=True)
            for path in [code, *code.rglob("*")]:
                if path.is_dir():
                    path.chmod(0o755)
        else:
            code.mkdir(mode=0o755)
        home.mkdir(mode=0o700)
        os.chown(home, user.uid, user.gid)
        os.chown(folder, user.uid, user.gid)
        return code, home

    def place_weights(self, instance_id: str, path: str) -> Path:
        """The instance's view of its weights file (hard-linked when on one file system: the
        cache's file is readable by all; copied otherwise)."""
        target = self.root / instance_id / "weights.safetensors"
        _link_or_copy(path, str(target))
        return target

    def remove(self, instance_id: str) -> None:
        shutil.rmtree(self.root / instance_id, ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def interpreter_problem(python: str) -> str | None:
    """Why ``python`` cannot import Dilu's instance runtime even as the worker's own user (not the
    Python Dilu is installed in, or no Python at all), or None when it can."""
    return _failure_of([python, "-c", "import worker.instance.server"])


def _failure_of(command: list[str]) -> str | None:
    """The last line a probe printed when it failed (an ImportError, a refused mount), or None."""
    import subprocess

    try:
        probe = subprocess.run(command, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, cwd="/")
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{command[0]}: {exc}"
    if probe.returncode != 0:
        return (probe.stderr.strip().splitlines() or [f"exit status {probe.returncode}"])[-1]
    return None


def runtime_problem(python: str, user: InstanceUser, reach: tuple[Cover, ...] = ()) -> str | None:
    """Why ``user`` cannot start the instance runtime with ``python`` in an instance's view of the
    host (its private /tmp, ``reach``'s covers), tried in a root child that takes that view and
    that user and then starts the interpreter afresh; None when it can."""
    import json

    plan = {"python": python, "uid": user.uid, "gid": user.gid, "keep": list(kept_in_temp(platform_paths(python))),
            "reach": [cover.to_json() for cover in reach]}
    code = "import json, sys; from worker.sandbox import probe_as_instance; probe_as_instance(json.loads(sys.argv[1]))"
    return _failure_of([python, "-c", code, json.dumps(plan)])


def probe_as_instance(plan: dict) -> None:
    """``runtime_problem``'s child: the instance's view and user, then the runtime's imports."""
    private_temp(1 << 20, tuple(plan["keep"]), tuple(Cover.from_json(c) for c in plan["reach"]))
    become(int(plan["uid"]), int(plan["gid"]))
    os.execv(plan["python"], [plan["python"], "-c", "import worker.instance.server"])
