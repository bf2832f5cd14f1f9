"""An instance's private /tmp (worker.sandbox.private_temp), in a forked root child: its own
empty tmpfs, and the platform's own folders there (a checkout in /tmp) still visible, read-only."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import pytest

from worker.sandbox import kept_in_temp, private_temp


def test_the_folders_kept_are_those_right_inside_the_temp_folders() -> None:
    assert kept_in_temp(["/tmp/clone/.venv/bin/python", "/tmp/clone", "/usr/bin/python3", "/tmp",
                         "/var/tmp/x/y", "/tmpfoo/bar"]) == ("/tmp/clone", "/var/tmp/x")


@pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace of its own needs root")
def test_a_private_temp_hides_the_hosts_files_but_keeps_the_platform_read_only() -> None:
    kept = Path(tempfile.mkdtemp(prefix="dilu-kept-", dir="/tmp"))
    (kept / "code.py").write_text("platform")
    hidden = Path(tempfile.mkdtemp(prefix="dilu-hidden-", dir="/tmp"))
    (hidden / "secret").write_text("another tenant's")
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:      # report what the child saw as one line, then leave without cleanup
        os.close(read_end)
        seen = []
        try:
            private_temp(1 << 20, (str(kept),))
            seen.append((kept / "code.py").read_text())
            seen.append(str((hidden / "secret").exists()))
            try:
                (kept / "new").write_text("x")
                seen.append("written")
            except OSError as exc:
                seen.append(errno.errorcode[exc.errno])
            Path("/tmp/own").write_text("mine")
            seen.append(Path("/tmp/own").read_text())
        except BaseException as exc:  # noqa: BLE001 - the parent shows it
            seen.append(repr(exc))
        os.write(write_end, "|".join(seen).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as reader:
        seen = reader.read().split("|")
    os.waitpid(child, 0)
    try:
        assert seen == ["platform", "False", "EROFS", "mine"], seen
        assert not Path("/tmp/own").exists() and not (kept / "new").exists(), "nothing reached the host"
    finally:
        for folder in (kept, hidden):
            for item in folder.iterdir():
                item.unlink()
            folder.rmdir()
