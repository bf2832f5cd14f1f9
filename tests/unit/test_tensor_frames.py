"""The tensor frame between gateway and instance, and handlers that take arrays: a batch is one
stacked array per input, and each request gets its own rows back."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dilu import tensor_frames as frames
from dilu.handler import InputError
from worker.instance.arrays import ArrayHandler, from_json


def _frame(*tensors: frames.Tensor) -> tuple[str, bytes | memoryview]:
    return frames.encode(tensors)


def test_a_frame_round_trips_every_datatype_over_its_own_bytes() -> None:
    sent = [frames.Tensor("f", "FP32", np.arange(6, dtype=np.float32).reshape(2, 3)),
            frames.Tensor("h", "FP16", np.array([[1.5, -0.0]], dtype=np.float16)),
            frames.Tensor("u", "UINT64", np.array([2**64 - 1], dtype=np.uint64)),
            frames.Tensor("b", "BOOL", np.array([True, False])),
            frames.Tensor("s", "BYTES", np.array([[b"caf\xc3\xa9", b""]], dtype=object))]
    header, body = _frame(*sent)
    got = frames.decode(header, body)
    assert [(t.name, t.datatype) for t in got] == [(t.name, t.datatype) for t in sent]
    for before, after in zip(sent, got, strict=True):
        assert after.array.shape == before.array.shape
        assert after.array.tolist() == before.array.tolist()
    # Numbers are not copied out of the body: the array is a view of it.
    assert got[0].array.base is not None and not got[0].array.flags.writeable
    # One numeric tensor's body is the array's own memory: nothing is copied to send it.
    image = np.ones((2, 3), dtype=np.float32)
    _, body = _frame(frames.Tensor("image", "FP32", image))
    assert isinstance(body, memoryview) and np.shares_memory(np.frombuffer(body, np.float32), image)


@pytest.mark.parametrize(("header", "message"), [
    (None, "has no x-dilu-tensors header"),
    ("[" * 70000, "longer than"),
    ("[1,", "is not JSON"),
    ("{}", "at most 256 tensors"),
    ("[1,2]", "is not an object"),
])
def test_a_malformed_frame_is_refused_naming_what_is_wrong(header: str | None, message: str) -> None:
    with pytest.raises(frames.FrameError, match=message):
        frames.decode(header, b"")


@pytest.mark.parametrize(("entry", "data", "message"), [
    ({"name": "x", "datatype": "FP32", "shape": [2], "size": 4}, b"\0" * 4, "4 bytes given, shape"),
    ({"name": "x", "datatype": "FP32", "shape": [1], "size": 8}, b"\0" * 4, "run past the end"),
    ({"name": "x", "datatype": "FP99", "shape": [1], "size": 4}, b"\0" * 4, "unknown datatype"),
    ({"name": "x", "datatype": "FP32", "shape": [-1], "size": 4}, b"\0" * 4, "sizes >= 0"),
    ({"name": "x", "datatype": "FP32", "shape": [1], "size": 4}, b"\0" * 8, "4 bytes that no tensor"),
    ({"name": "x", "datatype": "BYTES", "shape": [2], "size": 5}, b"\1\0\0\0a", "1 BYTES elements given"),
])
def test_a_tensor_that_does_not_match_its_header_is_refused(entry: dict, data: bytes, message: str) -> None:
    with pytest.raises(frames.FrameError, match=message):
        frames.decode(json.dumps([entry]), data)


class RecordingSums:
    """Sums each row; remembers the shapes of the batches it was given."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, ...]] = []

    def predict(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.batches.append(batch["x"].shape)
        return {"sums": batch["x"].sum(axis=1)}


def _handler(inner: object) -> ArrayHandler:
    return ArrayHandler(inner, {"x": "FP32"}, {"sums": "FP32"})


def test_a_batch_reaches_the_handler_stacked_and_each_request_gets_its_own_rows() -> None:
    inner = RecordingSums()
    requests = [{"x": np.full((rows, 3), rows, dtype=np.float32)} for rows in (1, 2, 3)]
    results = _handler(inner).predict(requests)
    assert inner.batches == [(6, 3)]          # one call, one array: three requests stacked
    assert [r["sums"].tolist() for r in results] == [[3.0], [6.0, 6.0], [9.0, 9.0, 9.0]]


def test_requests_whose_other_dimensions_differ_run_as_separate_batches() -> None:
    inner = RecordingSums()
    requests = [{"x": np.ones((1, 3), np.float32)}, {"x": np.ones((1, 4), np.float32)},
                {"x": np.ones((2, 3), np.float32)}]
    results = _handler(inner).predict(requests)
    assert sorted(inner.batches) == [(1, 4), (3, 3)]
    assert [r["sums"].tolist() for r in results] == [[3.0], [4.0], [3.0, 3.0]]


def test_json_requests_become_arrays_of_the_declared_datatype() -> None:
    inner = RecordingSums()
    result = _handler(inner).predict([{"x": [[1, 2], [3, 4]]}])[0]
    assert result["sums"].dtype == np.float32 and result["sums"].tolist() == [3.0, 7.0]
    with pytest.raises(InputError, match="missing: x"):
        from_json({"y": [1]}, {"x": "FP32"})
    with pytest.raises(InputError, match="not a FP32 tensor"):
        from_json({"x": [["a"]]}, {"x": "FP32"})
    with pytest.raises(InputError, match=r"shape \[1, 1\] does not fit the declared shape \[-1, 3\]"):
        from_json({"x": [[1]]}, {"x": "FP32"}, {"x": [-1, 3]})


def test_an_output_without_the_batchs_rows_is_an_error_naming_it() -> None:
    class Total:
        def predict(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return {"sums": batch["x"].sum(keepdims=True).reshape(1)}

    requests = [{"x": np.ones((1, 2), np.float32)}, {"x": np.ones((1, 2), np.float32)}]
    with pytest.raises(ValueError, match="output 'sums' has 1 rows for a batch of 2"):
        _handler(Total()).predict(requests)


def test_torch_handlers_get_writable_tensors_and_may_answer_with_them() -> None:
    torch = pytest.importorskip("torch")

    class TorchSums:
        def predict(self, batch: dict) -> dict:
            assert isinstance(batch["x"], torch.Tensor)
            batch["x"].mul_(2)        # a frame's read-only bytes would refuse this
            return {"sums": batch["x"].sum(dim=1)}

    view = np.frombuffer(np.ones(4, np.float32).tobytes(), np.float32).reshape(2, 2)
    result = ArrayHandler(TorchSums(), {"x": "FP32"}, {"sums": "FP32"}, "torch").predict([{"x": view}])[0]
    assert result["sums"].tolist() == [4.0, 4.0] and view.tolist() == [[1.0, 1.0], [1.0, 1.0]]
