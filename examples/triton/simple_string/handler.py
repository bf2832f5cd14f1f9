"""Triton's ``simple_string``: each element is an integer written as text; the answers are too."""

import numpy as np

from dilu import InputError


def _numbers(array, name):
    try:
        return np.vectorize(lambda item: int(item.decode() if isinstance(item, bytes) else item),
                            otypes=[np.int64])(array)
    except ValueError:
        raise InputError(f"{name}: every element must be an integer written as text") from None


def _texts(array):
    return np.vectorize(lambda number: str(number).encode(), otypes=[object])(array)


class SimpleString:
    def predict(self, batch):
        first, second = _numbers(batch["INPUT0"], "INPUT0"), _numbers(batch["INPUT1"], "INPUT1")
        return {"OUTPUT0": _texts(first + second), "OUTPUT1": _texts(first - second)}
