"""Loading stages from an instance's start-up marks, and their running estimates (pure)."""

from __future__ import annotations

import pytest

from dilu.loading import stages_from_marks, total_s, update_estimates

pytestmark = pytest.mark.unit


def test_stages_from_marks() -> None:
    marks = {"process_start": 100.2, "runtime_imported": 100.5, "serving": 100.6, "handler_imported": 101.6,
             "loaded": 103.1, "ready": 103.15}
    assert stages_from_marks(100.0, marks) == {"spawn": 0.2, "runtime": 0.4, "imports": 1.0, "load": 1.5,
                                               "ready": 0.05}
    # A pre-started process was assigned after the start call (its process began earlier): 0, not negative.
    assert stages_from_marks(100.0, {"process_start": 99.0, "serving": 100.1})["spawn"] == 0.0
    assert stages_from_marks(100.0, {"loaded": "x"}) == {}


def test_device_and_warmup_stages_when_the_instance_went_through_them() -> None:
    marks = {"process_start": 100.2, "serving": 100.6, "handler_imported": 101.6, "device_ready": 102.4,
             "loaded": 103.0, "warmed": 103.9, "ready": 104.0}
    assert stages_from_marks(100.0, marks) == {"spawn": 0.2, "runtime": 0.4, "imports": 1.0, "device": 0.8,
                                               "load": 0.6, "warmup": 0.9, "ready": 0.1}


def test_running_estimates_weight_the_newest_start() -> None:
    first = update_estimates(None, {"load": 2.0, "imports": 1.0})
    assert first == {"load": {"mean_s": 2.0, "samples": 1}, "imports": {"mean_s": 1.0, "samples": 1}}
    second = update_estimates(first, {"load": 1.0})
    assert second["load"] == {"mean_s": 1.7, "samples": 2} and second["imports"]["samples"] == 1
    assert first["load"]["mean_s"] == 2.0          # the input is not changed
    assert total_s(second) == pytest.approx(2.7) and total_s(None) is None


def test_weights_stages_fetch_map_and_copy() -> None:
    """A GPU start with a weights artifact: the worker's fetch comes before the spawn, the map and
    the copy to the device between the device and the handler's load()."""
    marks = {"fetched": 101.0, "process_start": 101.2, "serving": 101.6, "handler_imported": 102.6,
             "device_ready": 103.0, "mapped": 103.01, "copied": 104.0, "loaded": 104.2, "ready": 104.3}
    assert stages_from_marks(100.0, marks) == {"fetch": 1.0, "spawn": 0.2, "runtime": 0.4, "imports": 1.0,
                                               "device": 0.4, "map": 0.01, "copy": 0.99, "load": 0.2,
                                               "ready": 0.1}
    # On the CPU the weights stay mapped (no copy), and the map follows the imports directly.
    cpu = {"process_start": 100.2, "serving": 100.6, "handler_imported": 101.6, "mapped": 101.7,
           "loaded": 101.8, "ready": 101.9}
    assert stages_from_marks(100.0, cpu) == {"spawn": 0.2, "runtime": 0.4, "imports": 1.0, "map": 0.1,
                                             "load": 0.1, "ready": 0.1}
