"""What an instance's exit leaves out: only finalizers that undo the process's own registrations."""

import weakref

import pytest

from worker.instance.server import TEARDOWN_ONLY, _skip_teardown_finalizers

pytestmark = pytest.mark.unit


class _Thing:
    pass


def test_torchs_registration_finalizers_are_skipped_at_exit_and_others_are_kept() -> None:
    import torch  # noqa: F401 - registers its operator libraries, each with an exit finalizer

    thing = _Thing()
    mine = weakref.finalize(thing, lambda: None)
    torchs = [f for f, info in weakref.finalize._registry.items()
              if getattr(info.func, "__module__", None) in TEARDOWN_ONLY]
    assert torchs, "importing torch registers finalizers to skip"
    _skip_teardown_finalizers()
    assert mine.atexit, "a finalizer of anyone else still runs at exit"
    assert not any(f.atexit for f in torchs)
    mine.detach()
