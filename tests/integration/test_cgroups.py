"""Whether a worker can give instances cgroups (CPU slices, memory and pids limits) is decided by
what it may write: a worker run by an ordinary user, on a host where a root worker already made
Dilu's groups, runs its instances without them instead of failing every start."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from worker.cgroups import CpuLimiter, InstanceGroups

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534


def test_a_group_made_by_root_is_not_taken_for_a_writable_one() -> None:
    if os.geteuid() != 0 or not CpuLimiter().available or not InstanceGroups().available:
        pytest.skip("needs root and a writable cgroup cpu controller, to make Dilu's group as root first")
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no system python3 an unprivileged user can run")
    # The module alone (it needs only the standard library), where that user can read it (not
    # under pytest's own temporary folder, which only root may enter).
    with tempfile.TemporaryDirectory(dir="/tmp") as folder:
        _probe_as_nobody(python, Path(folder))


def _probe_as_nobody(python: str, tmp_path: Path) -> None:
    copy = tmp_path / "worker"
    copy.mkdir()
    shutil.copy(ROOT / "worker" / "cgroups.py", copy / "cgroups.py")
    (copy / "__init__.py").write_text("")
    for path in (tmp_path, copy, copy / "cgroups.py", copy / "__init__.py"):
        path.chmod(0o755)
    probe = ("from worker.cgroups import CpuLimiter, InstanceGroups; limiter = CpuLimiter(); "
             "groups = InstanceGroups(); print(limiter.available, limiter.group('i-probe'), "
             "sorted(groups.available), groups.create('i-probe', 2**28, 64))")
    seen = subprocess.run([python, "-c", probe], cwd=tmp_path, user=NOBODY, group=NOBODY, capture_output=True,
                          text=True, timeout=30, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)})
    assert seen.returncode == 0, seen.stderr
    assert seen.stdout.split() == ["False", "None", "[]", "[]"]
    assert "no writable cgroup cpu controller" in seen.stderr
    assert "no writable cgroup memory or pids controller" in seen.stderr
