"""Which instance ids name a socket file: only plain ones, never a path."""

from dilu.local_sockets import socket_name


def test_only_a_plain_instance_id_names_a_socket() -> None:
    assert socket_name("resnet-1a2b3c4d5e") == "resnet-1a2b3c4d5e.sock"
    for hostile in ("../etc/passwd", "a/b", "", ".hidden", "x" * 200, "a\x00b"):
        assert socket_name(hostile) is None, hostile
