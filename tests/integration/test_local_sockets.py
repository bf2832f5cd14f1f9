"""A process instance also listens on a Unix socket named by its id, in a folder only the
worker's user may enter; the gateway's forwarder reaches it there, and over TCP where it has
none. Real instance processes: started fresh, from a fresh spare, and from a zygote's fork."""

from __future__ import annotations

import json
import os
import re
import socket
import stat
from pathlib import Path

import pytest

from dilu.local_sockets import SocketFolder
from gateway.forward import Forwarder, NotDelivered
from tests.builders import make_start
from tests.integration.test_process_instances import OK, _cpu_agent, until_state
from tests.waiting import async_eventually
from worker.backends.process import ProcessBackend


def _closed_port(endpoint: str) -> str:
    """``endpoint`` with a port nothing listens on: an answer can only come another way."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return re.sub(r":\d+/", f":{port}/", endpoint, count=1)


async def _answer(forwarder: Forwarder, url: str, instance_id: str, n: int) -> dict:
    reply = await forwarder.post(url + "/infer", json.dumps({"n": n}).encode(), 30, instance_id=instance_id)
    assert reply.status == 200, reply.body
    return json.loads(reply.body)


async def test_each_instance_answers_on_its_socket_and_the_socket_goes_with_it(tmp_path: Path) -> None:
    folder_path = tmp_path / ("a-long-home-folder-" * 6) / "sockets"     # past a socket address's 108 bytes
    backend = ProcessBackend(state_dir=tmp_path, spares=1, spares_max=1, sockets=SocketFolder(folder_path))
    agent = _cpu_agent(backend, tmp_path, "w-sockets")
    without_spares = _cpu_agent(ProcessBackend(state_dir=tmp_path / "fresh", sockets=SocketFolder(folder_path)),
                                tmp_path, "w-fresh")
    forwarder = Forwarder(sockets=SocketFolder(folder_path))
    try:
        async def zygote_ready() -> bool:
            return backend.pool_status()["zygote"] == "ready"

        started = {}
        await async_eventually(zygote_ready, timeout=60, what="the zygote to finish its imports")
        started["i-spare"] = await agent.start_instance(make_start("i-spare", OK))     # the spare started fresh
        assert backend.pool().spares[0].fd == -1, "the next spare is the zygote's fork"
        started["i-forked"] = await agent.start_instance(make_start("i-forked", OK))
        started["i-fresh"] = await without_spares.start_instance(make_start("i-fresh", OK))   # the slow way
        for n, (instance_id, status) in enumerate(started.items()):
            await until_state(without_spares if instance_id == "i-fresh" else agent, instance_id, "ready")
            assert stat.S_ISSOCK((folder_path / f"{instance_id}.sock").stat().st_mode)
            answer = await _answer(forwarder, _closed_port(status.endpoint), instance_id, n)
            assert answer["input"] == {"n": n}, f"{instance_id} answers through its socket"
        names = sorted(p.name for p in folder_path.iterdir())
        waiting = [spare.socket_file for spare in backend.pool().spares]
        assert names == sorted(["i-forked.sock", "i-fresh.sock", "i-spare.sock", *waiting]), \
            "a spare's socket took its instance's name; the spare waiting has its own"
        assert stat.S_IMODE(folder_path.stat().st_mode) == 0o700

        # Without a socket of its own (another host's instance) it is reached over TCP; with
        # neither, nothing was delivered.
        other = started["i-fresh"].endpoint
        assert (await _answer(forwarder, other, "i-elsewhere", 7))["input"] == {"n": 7}
        with pytest.raises(NotDelivered):
            await _answer(forwarder, _closed_port(other), "i-elsewhere", 8)

        await agent.stop_instance("i-spare", drain=False)
        await until_state(agent, "i-spare", "stopped")
        assert not (folder_path / "i-spare.sock").exists(), "an ended instance leaves no socket behind"
    finally:
        await forwarder.close()
        await agent.shutdown()
        await without_spares.shutdown()
    assert not list(folder_path.iterdir()), "a stopped worker leaves no socket behind"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_another_user_cannot_reach_an_instance_socket(instance_visible_dir: Path) -> None:
    """A function's instances run as their own users: none may enter the folder, so none can
    reach another instance past its TCP key. The sockets are bound open to anyone (umask 0), and
    the same user reaches one in an open folder beside it: the folder is what keeps it out."""
    before = os.umask(0)
    try:
        folder = SocketFolder(instance_visible_dir / "sockets")
        victim = folder.bind("i-victim.sock")
        (instance_visible_dir / "open").mkdir(mode=0o755)
        beside = socket.socket(socket.AF_UNIX)
        beside.bind(str(instance_visible_dir / "open" / "i-beside.sock"))
        beside.listen(1)
    finally:
        os.umask(before)
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(300_123)
            os.setuid(300_123)
            socket.socket(socket.AF_UNIX).connect(str(instance_visible_dir / "open" / "i-beside.sock"))
            socket.socket(socket.AF_UNIX).connect(str(instance_visible_dir / "sockets" / "i-victim.sock"))
            os._exit(1)
        except PermissionError:
            os._exit(0)
        except BaseException:  # noqa: BLE001 - any other outcome (the open one refused) fails the test
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    victim.close()
    beside.close()
    assert os.waitstatus_to_exitcode(status) == 0, {1: "another user reached the socket",
                                                    2: "the open socket beside it was not reached"}.get(
        os.waitstatus_to_exitcode(status))


def test_a_sweep_removes_only_the_sockets_nothing_listens_on(tmp_path: Path) -> None:
    """What a worker that died left behind goes at the next worker's start; a live one stays."""
    folder = SocketFolder(tmp_path / "sockets")
    live, dead = folder.bind("i-live.sock"), folder.bind("i-dead.sock")
    dead.close()
    try:
        assert folder.sweep() == 1
        assert sorted(p.name for p in (tmp_path / "sockets").iterdir()) == ["i-live.sock"]
    finally:
        live.close()
