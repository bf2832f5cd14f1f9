"""Which folders an instance's view covers so that it reaches the platform (worker.reach.covers_for)."""

from __future__ import annotations

from worker.reach import Cover, covers_for, describe

CLOSED = {"/root", "/root/.pyenv", "/home/ann", "/srv/a/b"}


def closed_here(folder: str) -> bool:
    return folder not in CLOSED


def test_a_python_under_roots_home_is_reached_through_one_cover_of_it() -> None:
    paths = ["/root/.pyenv/versions/3.12/bin/python3.12", "/root/.pyenv/versions/3.12", "/root/dilu/.venv",
             "/root/dilu", "/usr/lib/python3"]
    assert covers_for(paths, closed_here) == (
        Cover("/root", ("/root/.pyenv/versions/3.12", "/root/dilu")),)    # the outermost closed folder


def test_paths_in_open_folders_need_no_cover_and_each_closed_folder_gets_its_own() -> None:
    assert covers_for(["/usr/bin/python3", "/opt/dilu"], closed_here) == ()
    assert covers_for(["/home/ann/env", "/srv/a/b/c/d", "relative/path"], closed_here) == (
        Cover("/home/ann", ("/home/ann/env",)), Cover("/srv/a/b", ("/srv/a/b/c/d",)))


def test_the_log_line_names_what_instances_see() -> None:
    covers = (Cover("/root", ("/root/env", "/root/dilu")),)
    assert describe(covers) == "/root shows them only /root/env, /root/dilu (read-only)"
    assert Cover.from_json(covers[0].to_json()) == covers[0]
