"""Triton-shaped statistics of what a gateway answered, and the configuration it derives."""

from __future__ import annotations

from dilu.spec import SpecModel
from gateway.statistics import VERSIONS_KEPT, InvocationStats
from gateway.v2.inference import Model
from gateway.v2.model_info import batch_bound, configuration, statistics


def test_stages_are_counted_with_their_durations() -> None:
    stats = InvocationStats()
    # arrived at 1.0, checked at 1.001, routed at 1.003, answered at 1.013, handed back at 1.014
    stats.record("f", 2, True, 1.0, 1.001, 1.003, 1.013, 1.014, "4", now_ms=5000)
    stats.record("f", 2, False, 2.0, 0.0, 0.0, 0.0, 2.5, None, now_ms=6000)
    wire = stats.of("f")[2].to_wire("f", "2")
    inference = wire["inference_stats"]
    assert inference["success"]["count"] == 1 and abs(inference["success"]["ns"] - 14_000_000) < 1000
    assert abs(inference["queue"]["ns"] - 2_000_000) < 1000
    assert abs(inference["compute_infer"]["ns"] - 10_000_000) < 1000
    assert inference["fail"]["count"] == 1 and abs(inference["fail"]["ns"] - 500_000_000) < 1000
    assert wire["inference_count"] == 1 and wire["last_inference"] == 5000
    assert [batch["batch_size"] for batch in wire["batch_stats"]] == [4]


def test_a_request_that_never_reached_an_instance_counts_no_instance_stages() -> None:
    stats = InvocationStats()
    stats.record("f", 1, True, 1.0, 1.001, 0.0, 0.0, 1.002, None, now_ms=1)
    inference = stats.of("f")[1].to_wire("f", "1")["inference_stats"]
    assert inference["compute_input"]["count"] == 1 and inference["queue"]["count"] == 0
    assert inference["compute_infer"]["count"] == 0


def test_only_the_latest_versions_are_kept() -> None:
    stats = InvocationStats()
    for version in range(1, VERSIONS_KEPT + 3):
        stats.record("f", version, True, 0.0, 0.0, 0.0, 0.0, 0.001, None, now_ms=1)
    assert sorted(stats.of("f")) == list(range(3, VERSIONS_KEPT + 3))


def _model(**spec) -> Model:
    base = {"name": "m", "handler": "h:H", "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
            "outputs": [{"name": "y", "datatype": "BYTES", "shape": [-1], "labels": "labels.txt"}]}
    return Model(name="m", version="3", status="ready", spec=SpecModel.model_validate({**base, **spec}))


def test_the_configuration_leaves_the_batch_axis_out_only_when_every_tensor_has_it() -> None:
    batched = configuration(_model(batching={"max_batch_size": 8, "max_wait_ms": 2}))
    assert batched["max_batch_size"] == 8 and batched["input"][0]["dims"] == [3]
    assert batched["output"][0] == {"name": "y", "data_type": "TYPE_STRING", "dims": [], "label_filename": "labels.txt"}
    assert batched["dynamic_batching"] == {"max_queue_delay_microseconds": 2000}
    single = _model(inputs=[{"name": "x", "datatype": "FP32", "shape": [3, 224, 224], "format": "NCHW"}],
                    batching={"max_batch_size": 8})
    assert batch_bound(single.spec) == 0 and configuration(single)["input"][0]["dims"] == [3, 224, 224]
    assert configuration(single)["input"][0]["format"] == "FORMAT_NCHW"


def test_a_model_that_answered_nothing_has_zero_statistics_at_its_version() -> None:
    (only,) = statistics(_model(), {})
    assert only["version"] == "3" and only["inference_stats"]["success"] == {"count": 0, "ns": 0}
