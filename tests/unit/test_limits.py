"""Input bounds: JSON nesting (strings do not count), NaN/Infinity, YAML size, aliases, depth and
duplicate keys; each error names its limit."""

from __future__ import annotations

import json

import pytest

from dilu.limits import (
    MAX_JSON_DEPTH,
    LimitExceeded,
    check_finite_json,
    check_json_depth,
    check_yaml,
    json_depth,
    load_finite_json,
    reject_constant,
)
from dilu.spec import SpecError, make_spec


@pytest.mark.parametrize(("body", "depth"), [
    (b'{"x": 1}', 1), (b"[[[1]]]", 3), (b'{"a": [{"b": []}]}', 4), (b'"[[[[["', 0),
    (b'{"s": "]]]", "t": [[1], [2]]}', 3), (b'{"q": "a\\"[[[b"}', 1), (b"1", 0),
])
def test_json_depth(body: bytes, depth: int) -> None:
    assert json_depth(body) == depth


def test_deep_json_is_refused_naming_the_limit() -> None:
    check_json_depth(json.dumps([[[0] * 500] * 20] * 3).encode())   # wide, shallow: fine
    with pytest.raises(LimitExceeded, match=f"deeper than {MAX_JSON_DEPTH}"):
        check_json_depth(b"[" * 1000 + b"]" * 1000)


@pytest.mark.parametrize("text", ['{"x": NaN}', '[Infinity]', '{"y": -Infinity}'])
def test_nan_and_infinity_are_not_json(text: str) -> None:
    with pytest.raises(LimitExceeded, match="not valid JSON"):
        json.loads(text, parse_constant=reject_constant)


@pytest.mark.parametrize("text", ['{"x": 1e400}', '[-1e309]', '{"a": {"b": [1, 2e308]}}'])
def test_numbers_past_a_double_are_refused_not_made_infinite(text: str) -> None:
    with pytest.raises(LimitExceeded, match="outside the range of a 64-bit float"):
        load_finite_json(text)
    assert load_finite_json('{"x": 1.5e300, "n": 12}') == {"x": 1.5e300, "n": 12}


@pytest.mark.parametrize(("body", "problem"), [
    (b'{"x": NaN}', "NaN is not valid JSON"),
    (b'[1e400]', "outside the range of a 64-bit float"),
    (b'{"x": 1,}', "Expecting property name"),
])
def test_the_fast_check_refuses_what_the_reader_refuses_in_its_words(body: bytes, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        check_finite_json(body)


def test_the_fast_check_takes_what_the_reader_takes() -> None:
    for body in (b'{"x": [1.5e300, 12, "\\ud800", null]}', b'12345678901234567890123', b'"text"'):
        check_finite_json(body)         # a lone surrogate escape: valid JSON the C parser refuses
        load_finite_json(body)


BASE = "name: fn\nhandler: handler:H\n"


@pytest.mark.parametrize(("text", "message"), [
    (BASE + "model: {x: " + "[" * 40 + "]" * 40 + "}\n", "nests deeper than 32"),
    (BASE + "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
     "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n",
     "more than 10000 YAML nodes"),
    (BASE + "name: other\n", "duplicate key 'name' at line 3"),
    (BASE + "model: {blob: '" + "x" * 70_000 + "'}\n", "over the limit of 65536"),
])
def test_hostile_yaml_is_refused(text: str, message: str) -> None:
    with pytest.raises(LimitExceeded, match=message):
        check_yaml(text)
    with pytest.raises(SpecError, match=message):
        make_spec(text)


@pytest.mark.parametrize(("extra", "message"), [
    ("slo: {p99_ms: .inf}\n", "slo.p99_ms"),
    ("resources: {sm_request: 5.0e-324, sm_limit: 0.5}\n", "resources.sm_request"),
])
def test_unreasonable_numbers_are_refused(extra: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        make_spec(BASE + extra)
