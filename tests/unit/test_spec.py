"""model.yaml parsing: defaults, validation errors that name the field and line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dilu.spec import ClusterDefaults, SpecError, SpecModel, json_schema, make_spec, parse_memory

MINIMAL = "name: hello\nhandler: handler:Echo\n"


def test_minimal_spec_gets_documented_defaults() -> None:
    spec = make_spec(MINIMAL)
    assert spec.function_class == "latency"
    assert spec.scaling.min_instances == 0 and spec.scaling.keep_alive_s == 60
    assert spec.batching.max_batch_size == 1
    assert spec.resources.gpu == "auto" and spec.resources.memory == 2 * 2**30


def test_reference_yaml_equals_the_defaults() -> None:
    reference = Path(__file__).resolve().parents[2] / "docs" / "model.reference.yaml"
    spec = make_spec(reference.read_text())
    assert spec == make_spec(f"name: {spec.name}\nhandler: {spec.handler}\n")


def test_cluster_default_applies_only_where_the_user_is_silent() -> None:
    defaults = ClusterDefaults(keep_alive_s=5)
    assert make_spec(MINIMAL, defaults).scaling.keep_alive_s == 5
    explicit = MINIMAL + "scaling:\n  keep_alive_s: 30\n"
    assert make_spec(explicit, defaults).scaling.keep_alive_s == 30


@pytest.mark.parametrize(("name", "text", "expected"), [
    ("malformed yaml", "name: [unclosed\nhandler: x:Y\n", "malformed YAML at line"),
    ("not a mapping", "- just\n- a list\n", "expected a mapping"),
    ("missing handler", "name: hello\n", "handler: required field is missing"),
    ("unknown top-level field", MINIMAL + "replicas: 3\n", "replicas (line 3): unknown field"),
    ("typo in nested field", MINIMAL + "scaling:\n  max_instance: 2\n", "scaling.max_instance (line 4): unknown field"),
    ("mistyped integer", MINIMAL + "batching:\n  max_batch_size: lots\n", "batching.max_batch_size (line 4)"),
    ("bad class", MINIMAL + "class: realtime\n", "class (line 3)"),
    ("bad name", "name: Hello_World\nhandler: handler:Echo\n", "name (line 1)"),
    ("bad handler form", "name: hello\nhandler: handler.Echo\n", "handler (line 2)"),
    ("bad memory", MINIMAL + "resources:\n  memory: lots\n", "resources.memory (line 4)"),
    ("request above limit", MINIMAL + "resources:\n  sm_request: 0.8\n  sm_limit: 0.5\n",
     "sm_request must be <= sm_limit"),
    ("min above max", MINIMAL + "scaling:\n  min_instances: 5\n  max_instances: 2\n", "min_instances must be <="),
    ("reserved env", MINIMAL + "env:\n  LD_PRELOAD: x\n", "reserved by the platform"),
    ("warm-up without a request", MINIMAL + "warmup:\n  count: 2\n", "either inline (request) or as a file"),
    ("warm-up with both", MINIMAL + "warmup:\n  request: {x: 1}\n  file: w.json\n", "either inline"),
    ("warm-up file outside the code", MINIMAL + "warmup:\n  file: ../secrets.json\n", "no '..'"),
    ("warm-up file absolute", MINIMAL + "warmup:\n  file: /etc/passwd\n", "relative"),
    ("warm-up count bounded", MINIMAL + "warmup:\n  request: 1\n  count: 1000\n", "warmup.count (line 5)"),
    ("arrays without tensors", MINIMAL + "arrays: numpy\n", "declare inputs and outputs"),
    ("arrays of an unknown kind", MINIMAL + "arrays: jax\n", "arrays (line 3)"),
    ("arrays batched on a fixed first axis", MINIMAL + "arrays: numpy\nbatching: {max_batch_size: 4}\n"
     "inputs: [{name: x, datatype: FP32, shape: [1, 3]}]\noutputs: [{name: y, datatype: FP32, shape: [-1]}]\n",
     "first dimension is -1 (not so for x)"),
])
def test_invalid_specs_name_the_problem(name: str, text: str, expected: str) -> None:
    with pytest.raises(SpecError) as caught:
        make_spec(text)
    assert expected in str(caught.value), f"{name}: {caught.value}"


@pytest.mark.parametrize(("value", "expected"), [
    (1024, 1024), ("512Mi", 512 * 2**20), ("2Gi", 2 * 2**30), ("1.5Gi", int(1.5 * 2**30)),
    ("2G", 2 * 10**9), ("100k", 100_000), ("64MiB", 64 * 2**20),
])
def test_parse_memory(value: int | str, expected: int) -> None:
    assert parse_memory(value) == expected


@pytest.mark.parametrize("value", ["", "lots", "-1Gi", 0, True, "1Pi"])
def test_parse_memory_rejects(value: object) -> None:
    with pytest.raises(ValueError):
        parse_memory(value)  # type: ignore[arg-type]


def test_schema_uses_yaml_names_and_forbids_extras() -> None:
    schema = json_schema()
    assert "class" in schema["properties"] and "function_class" not in schema["properties"]
    assert schema.get("additionalProperties") is False
    assert set(schema["required"]) == {"name", "handler"}


@pytest.mark.parametrize("example", sorted((Path(__file__).resolve().parents[2] / "examples").glob("*/model.yaml")),
                         ids=lambda p: p.parent.name)
def test_shipped_examples_are_valid(example: Path) -> None:
    from cli.artifacts import weights_digested

    text, _, _ = weights_digested(example.read_text(), example.parent)    # a weights file: as deploy sends it
    spec = make_spec(text)
    assert spec.name == example.parent.name
    assert isinstance(SpecModel.model_validate(yaml.safe_load(text)), SpecModel)


def test_a_stored_spec_reads_back_typed_and_follows_in_place_changes() -> None:
    from dilu.db.models import FunctionRow
    from tests.builders import make_spec_dict

    row = FunctionRow(name="fn", version=1, spec=make_spec_dict(batching={"max_batch_size": 4}), source_dir="/x")
    assert row.typed_spec.batching.max_batch_size == 4 and row.typed_spec.function_class == "latency"
    row.spec = {**row.spec, "resources": {**row.spec["resources"], "sm_request": 0.2, "sm_limit": 0.4}}
    assert (row.typed_spec.resources.sm_request, row.typed_spec.resources.sm_limit) == (0.2, 0.4)


def test_a_text_generator_must_be_able_to_stream() -> None:
    from dilu.source import streaming_refusal

    plain = "class Echo:\n    def predict(self, inputs):\n        return inputs\n"
    assert "has no start and step()" in streaming_refusal(plain, "handler:Echo")
    half = "from dilu import Handler\nclass Gen(Handler):\n    def start(self, request):\n        return {}\n"
    assert "has no step()" in streaming_refusal(half, "handler:Gen")
    whole = "class Gen:\n    def start(self, r):\n        return r\n    def step(self, states):\n        return []\n"
    assert streaming_refusal(whole, "handler:Gen") is None
    inherited = "from base import Streaming\nclass Gen(Streaming):\n    pass\n"
    assert streaming_refusal(inherited, "handler:Gen") is None       # it may inherit them: not refused
    assert streaming_refusal("def broken(:\n", "handler:Gen") is None  # the load reports a syntax error
