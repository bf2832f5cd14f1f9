"""One slice type from the API to the token manager: checked where it enters, the same on every
wire, clamped only where it is enforced."""

from __future__ import annotations

import math

import pytest

from dilu.messages import StartInstance
from dilu.slices import DEFAULT_SLICE, ComputeSlice, SliceError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("request_", "limit", "problem"), [
    (0.5, 0.2, "sm_request must be <= sm_limit"),
    (0.0, 0.5, "sm_request must be a number from 0.01 to 1"),
    (0.5, 1.5, "sm_limit must be a number from 0.01 to 1"),
    (math.nan, 0.5, "sm_request must be a number"),
    ("0.5", 0.5, "sm_request must be a number"),
    (True, 0.5, "sm_request must be a number"),
])
def test_a_slice_that_is_not_one_is_refused_naming_the_problem(request_: object, limit: object, problem: str) -> None:
    with pytest.raises(SliceError, match=problem):
        ComputeSlice.checked(request_, limit)


def test_a_slice_travels_as_the_apis_two_numbers() -> None:
    compute = ComputeSlice.checked(0.2, 0.6)
    assert compute.to_wire() == {"sm_request": 0.2, "sm_limit": 0.6}
    assert ComputeSlice.from_wire(compute.to_wire()) == compute
    with pytest.raises(SliceError, match="sm_request and sm_limit"):
        ComputeSlice.from_wire({"sm_request": 0.2})


def test_a_start_order_carries_its_slice_and_reads_an_earlier_releases_form() -> None:
    order = StartInstance("i-1", "f", 1, {}, "/x", 2**20, compute=ComputeSlice(0.2, 0.6))
    assert StartInstance.from_dict(order.to_dict()) == order
    legacy = {**order.to_dict(), "sm_request": 0.3, "sm_limit": 0.5}
    del legacy["compute"]
    assert StartInstance.from_dict(legacy).compute == ComputeSlice(0.3, 0.5)
    del legacy["sm_request"], legacy["sm_limit"]
    assert StartInstance.from_dict(legacy).compute == DEFAULT_SLICE
