"""One user per function on a host: uids from the range, recorded, reused, never shared."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dilu.config import parse_range
from worker.uids import UidRegistry


def test_each_function_keeps_its_own_uid_across_workers_and_restarts(tmp_path: Path) -> None:
    registry_file, home = tmp_path / "uids.json", tmp_path / "home"
    home.mkdir()
    first = UidRegistry(registry_file, (400000, 400009), home)
    a, b = first.user_for("a"), first.user_for("b")
    assert a.uid != b.uid and a.gid == a.uid and {a.uid, b.uid} <= set(range(400000, 400010))
    again = UidRegistry(registry_file, (400000, 400009), home)      # another worker, or after a restart
    assert again.user_for("a") == a and again.user_for("b") == b

    other_home = tmp_path / "other"
    other_home.mkdir()
    other = UidRegistry(registry_file, (400000, 400009), other_home)   # another platform on this host
    assert other.user_for("a").uid not in {a.uid, b.uid}


def test_concurrent_first_starts_never_share_a_uid(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    registries = [UidRegistry(tmp_path / "uids.json", (400000, 400099), home) for _ in range(8)]
    with ThreadPoolExecutor(8) as pool:
        users = list(pool.map(lambda n: registries[n % 8].user_for(f"fn-{n}"), range(40)))
    assert len({user.uid for user in users}) == 40


def test_a_full_range_is_said_and_a_gone_platform_gives_its_uids_back(tmp_path: Path) -> None:
    gone, home = tmp_path / "gone", tmp_path / "home"
    gone.mkdir()
    home.mkdir()
    UidRegistry(tmp_path / "uids.json", (400000, 400001), gone).user_for("x")
    UidRegistry(tmp_path / "uids.json", (400000, 400001), gone).user_for("y")
    with pytest.raises(RuntimeError, match="every uid of the instance range 400000-400001 is taken"):
        UidRegistry(tmp_path / "uids.json", (400000, 400001), home).user_for("z")
    gone.rmdir()
    assert UidRegistry(tmp_path / "uids.json", (400000, 400001), home).user_for("z").uid in (400000, 400001)
    assert len(json.loads((tmp_path / "uids.json").read_text())) == 1


@pytest.mark.parametrize("text", ["0-10", "10-5", "abc", "999-2000", "1000-2147483647"])
def test_ranges_that_reach_root_or_system_users_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="uid range"):
        parse_range(text)
