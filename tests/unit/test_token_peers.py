"""Who a GPU's token manager accepts on an instance's own socket (worker.tokens.peers.refusal)."""

from __future__ import annotations

import pytest

from worker.tokens.peers import MAX_PROCESSES, Admission, Peer, refusal

ALPHA = Admission("alpha-1", uid=60001, cgroup="dilu/alpha-1")
ITS_PROCESS = Peer(pid=10, uid=60001, cgroups=("/", "/worker/dilu/alpha-1", "/worker/dilu/alpha-1"))


def test_a_process_of_the_instance_under_its_uid_is_accepted() -> None:
    assert refusal(ALPHA, "alpha-1", ITS_PROCESS, processes=MAX_PROCESSES - 1) is None


@pytest.mark.parametrize(("label", "admission", "claimed", "peer", "processes", "reason"), [
    ("another instance's id", ALPHA, "beta-1", ITS_PROCESS, 0, "not beta-1's"),
    ("another user", ALPHA, "alpha-1", Peer(11, 60002, ITS_PROCESS.cgroups), 0, "the caller is uid 60002"),
    ("outside the instance's group", ALPHA, "alpha-1", Peer(12, 60001, ("/worker/dilu/beta-1",)), 0,
     "not a process of instance alpha-1"),
    ("a group whose name only ends like it", ALPHA, "alpha-1", Peer(13, 60001, ("/worker/xdilu/alpha-1",)), 0,
     "not a process of instance alpha-1"),
    ("past the processes an instance may register", ALPHA, "alpha-1", ITS_PROCESS, MAX_PROCESSES,
     f"{MAX_PROCESSES} processes registered already"),
    ("an instance no longer on the GPU", None, "alpha-1", ITS_PROCESS, 0, "no longer on the GPU"),
])
def test_refused(label: str, admission: Admission | None, claimed: str, peer: Peer, processes: int,
                 reason: str) -> None:
    why = refusal(admission, claimed, peer, processes)
    assert why is not None and reason in why, label


def test_without_a_known_uid_or_group_only_the_id_and_the_bound_are_checked() -> None:
    loose = Admission("c-1", uid=None, cgroup=None)
    assert refusal(loose, "c-1", Peer(5, 10001, ()), processes=0) is None
    assert refusal(loose, "c-2", Peer(5, 10001, ()), processes=0) is not None
