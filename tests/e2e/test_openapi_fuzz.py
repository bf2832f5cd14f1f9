"""The OpenAPI document tells the truth: a bounded schemathesis run (every check, every phase,
stateful included; see schemathesis.toml) against a running platform with keys on finds no server
error and no conformance failure."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import FIXTURE_FUNCTIONS, ROOT

ADMIN_KEY = "fuzz-admin-key-" + "k" * 20


def test_schemathesis_finds_nothing(start_platform, tmp_path: Path) -> None:
    platform = start_platform(env={"DILU_ADMIN_KEY": ADMIN_KEY})
    platform.env["DILU_API_KEY"] = ADMIN_KEY
    source = shutil.copytree(FIXTURE_FUNCTIONS / "ok", tmp_path / "ok")
    assert platform.cli("deploy", str(source / "model.yaml")).returncode == 0   # something to find

    st = shutil.which("st", path=str(Path(sys.executable).parent))
    assert st, "schemathesis is a test dependency"
    run = subprocess.run([st, "run", f"{platform.url}/openapi.json", "--max-examples", "10", "--seed", "7",
                          "-H", f"Authorization: Bearer {ADMIN_KEY}", "--no-color"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    summary = re.search(r"(\d+) generated, (\d+) passed", run.stdout)
    assert run.returncode == 0 and summary, run.stdout[-6000:]
    assert int(summary.group(1)) >= 200 and summary.group(1) == summary.group(2)
    assert "Stateful" in run.stdout and "Traceback" not in platform.role.log()
    print(summary.group(0))
    print(next((line for line in run.stdout.splitlines() if "operations" in line.lower()), ""))
