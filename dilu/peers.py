"""Who is on the other end of a TCP connection from this host: the uid that owns its socket.

An open platform (no key yet) is open to this machine's users, not to its functions: a request
whose socket belongs to an instance's uid is refused (``gateway.auth``; a worker without a
cluster key likewise, ``worker.api``). The kernel says who owns
a socket through sock_diag (what ``ss -e`` reads): one exact lookup of the connection's four
addresses, microseconds, no privilege needed. The answer is kept per connection for a second (a
connection's addresses are not reused while it or its TIME_WAIT lasts).
"""

from __future__ import annotations

import ipaddress
import socket
import struct
import time
from collections.abc import Callable

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 1
NLMSG_ERROR = 2
TCP_ESTABLISHED = 1
NO_COOKIE = 0xFFFFFFFF
_HEADER = struct.Struct("=IHHII")                    # nlmsghdr
_REQUEST = struct.Struct("=BBBBI")                   # inet_diag_req_v2, before its socket id
_SOCKET_ID = struct.Struct(">HH16s16s")              # ports and addresses, network order
_TAIL = struct.Struct("=III")                        # interface and cookie
UID_OFFSET = 4 + _SOCKET_ID.size + _TAIL.size + 12   # inet_diag_msg: after the id, expires, queues
CACHE_S = 1.0
CACHE_MAX = 4096


def _packed(host: str) -> tuple[int, bytes]:
    address = ipaddress.ip_address(host)
    if address.version == 6 and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    family = socket.AF_INET if address.version == 4 else socket.AF_INET6
    return family, address.packed.ljust(16, b"\0")


def owner_uid(client: tuple[str, int], server: tuple[str, int]) -> int | None:
    """The uid owning the client's end of the connection ``client`` -> ``server``, when that end
    is a socket of this host (a loopback caller); None when the kernel knows no such socket."""
    try:
        family, client_address = _packed(client[0])
        _, server_address = _packed(server[0])
    except ValueError:
        return None   # a Unix socket or a name: not a TCP peer
    request = _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << TCP_ESTABLISHED) + \
        _SOCKET_ID.pack(client[1], server[1], client_address, server_address) + _TAIL.pack(0, NO_COOKIE, NO_COOKIE)
    message = _HEADER.pack(_HEADER.size + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0) + request
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as diag:
            diag.settimeout(1.0)
            diag.send(message)
            reply = diag.recv(8192)
    except OSError:
        return None
    if len(reply) < _HEADER.size + UID_OFFSET + 4:
        return None
    _, kind, _, _, _ = _HEADER.unpack_from(reply)
    if kind == NLMSG_ERROR or kind != SOCK_DIAG_BY_FAMILY:
        return None
    return struct.unpack_from("=I", reply, _HEADER.size + UID_OFFSET)[0]


class PeerUids:
    """``owner_uid`` with a short per-connection memory (open platforms ask on every request)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._known: dict[tuple, tuple[float, int | None]] = {}

    def of(self, client: tuple[str, int], server: tuple[str, int]) -> int | None:
        key, now = (client, server), self._clock()
        known = self._known.get(key)
        if known is not None and now - known[0] < CACHE_S:
            return known[1]
        if len(self._known) >= CACHE_MAX:
            self._known.clear()
        uid = owner_uid(client, server)
        self._known[key] = (now, uid)
        return uid
