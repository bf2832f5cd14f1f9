"""The layer rule as a running process sees it: a role's process loads only its own role's code
(import-linter checks the same statically in `scripts/lint`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def _loaded(module: str) -> set[str]:
    """The top-level packages of this project a fresh interpreter has loaded after importing ``module``."""
    code = (f"import sys, {module}\n"
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules} & {'dilu', 'gateway', 'worker', 'cli'})))")
    return set(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                              timeout=120).stdout.split())


@pytest.mark.parametrize(("role", "expected"), [
    ("cli.roles.gateway", {"cli", "dilu", "gateway"}),
    ("cli.roles.worker", {"cli", "dilu", "worker"}),
    ("cli.roles.controller", {"cli", "dilu"}),
    ("gateway.app", {"dilu", "gateway"}),
    ("dilu.controller.reconciler", {"dilu"}),
])
def test_a_role_loads_only_its_own_code_and_the_core(role: str, expected: set[str]) -> None:
    assert _loaded(role) == expected
