"""Who may register with a GPU's token manager, and through which socket.

Every instance the worker starts on the GPU is admitted first (``Admission``): it gets a socket
of its own, that only its user can connect to, and a registration on it is accepted only from
a peer the kernel vouches for (``SO_PEERCRED``): the instance's uid and, where instances are
cgroups, a process inside the instance's group. The instance id a shim claims must be the
socket's; at most ``MAX_PROCESSES`` processes of one instance hold process entries at once, so no
instance can use up the slots and process entries the others need. The manager's own socket
(its path as configured) is for processes of the manager's own user (the worker, tools, tests):
mode 0600, so the kernel refuses everyone else.

``refusal`` is the pure rule; the rest is the thin I/O around it.
"""

from __future__ import annotations

import hashlib
import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

from worker.tokens.region import MAX_PROCS as MAX_PROCESSES  # processes of one instance registered at once


@dataclass(frozen=True)
class Admission:
    """What a registration for ``instance_id`` must come from. ``uid`` None: any user (the
    runtime runs instances under a name the manager cannot resolve); ``cgroup`` None: no group
    check (the instance is not a cgroup of the worker's)."""

    instance_id: str
    uid: int | None
    cgroup: str | None = None       # the tail of the instance's group path, as /proc/<pid>/cgroup shows it


@dataclass(frozen=True)
class Peer:
    pid: int
    uid: int
    cgroups: tuple[str, ...]        # the group paths of /proc/<pid>/cgroup, one per hierarchy


def refusal(admission: Admission | None, claimed: str, peer: Peer, processes: int) -> str | None:
    """Why a registration claiming ``claimed`` from ``peer`` on an instance's socket is refused
    (None: accepted); ``processes``: the instance's processes registered already (pure)."""
    if admission is None:
        return "this socket's instance is no longer on the GPU"
    if claimed != admission.instance_id:
        return f"this socket is instance {admission.instance_id}'s, not {claimed}'s"
    if admission.uid is not None and peer.uid != admission.uid:
        return f"instance {admission.instance_id} runs as uid {admission.uid}, the caller is uid {peer.uid}"
    if admission.cgroup is not None and not any(path.endswith("/" + admission.cgroup) for path in peer.cgroups):
        return f"the caller (pid {peer.pid}) is not a process of instance {admission.instance_id}"
    if processes >= MAX_PROCESSES:
        return f"instance {admission.instance_id} has {MAX_PROCESSES} processes registered already"
    return None


def peer_of(conn: socket.socket) -> Peer:
    """The connected process as the kernel knows it: pid and uid when it connected, its groups now."""
    pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        lines = []
    return Peer(pid=pid, uid=uid, cgroups=tuple(line.split(":", 2)[-1] for line in lines if line.count(":") >= 2))


def instance_socket_path(directory: Path, instance_id: str) -> Path:
    """Where an instance's socket lives: a folder of its own under ``directory`` (the docker
    runtime mounts that folder alone into the instance's container)."""
    return directory / hashlib.sha1(instance_id.encode()).hexdigest()[:16] / "tokens.sock"


def listen_for(path: Path, uid: int | None) -> socket.socket:
    """A listening socket at ``path`` that only ``uid`` (and root) can connect to: the socket
    is its, mode 0600. Its folder stays the manager's (0711: entered, never listed or changed by
    an instance, so no one can swap the socket for a link the manager would then chown).
    ``uid`` None (a user the manager cannot resolve): open to whoever reaches the folder, which
    only its container sees."""
    folder = path.parent
    for made in (folder.parent, folder):
        made.mkdir(exist_ok=True)
        made.chmod(0o711)        # entered, never listed: one instance cannot find another's socket
    path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(path))
        os.chmod(path, 0o600 if uid is not None else 0o666)     # the folder is root's: nothing swapped it
        if uid is not None and uid != os.geteuid():
            os.chown(path, uid, -1, follow_symlinks=False)
        listener.listen(MAX_PROCESSES)
    except OSError:
        listener.close()
        raise
    listener.setblocking(False)
    return listener
