"""The runtime pool's size follows recent demand within its bounds, a preloading pool lives
while functions need it, and what a function's code needs is read from it (pure)."""

from __future__ import annotations

import pytest

from worker.backends.imports import imported_modules, preloads_needed
from worker.pool import PoolSizer, PreloadDemand

pytestmark = pytest.mark.unit


def test_the_pool_grows_with_takes_and_shrinks_after_the_window() -> None:
    pool = PoolSizer(minimum=1, maximum=3, window_s=60)
    assert pool.target(0) == 1
    pool.took(10)
    pool.took(11)
    assert pool.target(12) == 3
    pool.took(12)
    pool.took(13)
    assert pool.target(14) == 3            # never past the maximum
    assert pool.target(71.5) == 3          # the takes at 12 and 13 still count
    assert pool.target(73.5) == 1          # all older than the window: back to the minimum


def test_bounds_are_checked() -> None:
    assert PoolSizer(minimum=0, maximum=0).target(5) == 0
    with pytest.raises(ValueError, match="minimum <= maximum"):
        PoolSizer(minimum=3, maximum=2)


def test_a_preloading_pool_is_wanted_while_its_instances_run_and_for_its_keep_after() -> None:
    demand, key = PreloadDemand(keep_s=60), ("cpu", ("torch",))
    assert not demand.wanted(key, 0), "never needed: never wanted"
    demand.started(key, "a")
    demand.started(key, "b")
    demand.ended("a", 10)
    assert demand.wanted(key, 500), "b still runs"
    demand.ended("b", 600)
    assert demand.wanted(key, 659) and not demand.wanted(key, 660)
    demand.ended("unknown", 700)    # an instance of no preloading pool changes nothing
    assert not demand.wanted(key, 700)


def test_the_modules_a_functions_code_imports_are_read_from_its_source() -> None:
    sources = ["import os, torch.nn as nn\nfrom numpy import array\n",
               "def f():\n    import transformers\n    from . import sibling\n",
               "this is not python ("]
    assert imported_modules(sources) == {"os", "torch", "numpy", "transformers"}


def test_only_the_offered_modules_a_function_needs_are_preloaded_for_it() -> None:
    offered = ("torch", "numpy")
    assert preloads_needed(offered, frozenset({"os", "json"})) == ()
    assert preloads_needed(offered, frozenset({"numpy", "torch"})) == ("torch", "numpy"), "in the offered order"
    assert preloads_needed(offered, frozenset({"transformers"})) == ("torch",), "a library built on torch needs it"
    assert preloads_needed(offered, frozenset(), arrays="torch") == ("torch",), "arrays: torch needs torch"
    assert preloads_needed(("torch.nn",), frozenset({"torch"})) == ("torch.nn",)
