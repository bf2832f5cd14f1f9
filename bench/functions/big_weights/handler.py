"""A model of large weights for bench/weights.py: its forward pass reads every weight once.

``source`` says how it gets them: ``artifact`` (dilu.weights(): the spec's safetensors
artifact, mapped), ``torch.load`` (unpickled from ``path``), ``torch.load-mmap`` (torch.load with
mmap=True, a user's other choice).
"""

import torch

import dilu


class BigWeights:
    def __init__(self, source: str = "artifact", path: str = "") -> None:
        self.source, self.path = source, path

    def load(self) -> None:
        if self.source == "artifact":
            self.weights = dilu.weights()
        else:
            self.weights = torch.load(self.path, weights_only=True, mmap=self.source == "torch.load-mmap")

    def predict(self, inputs):
        total = 0.0
        for name in sorted(self.weights):
            matrix = self.weights[name]
            total += float((matrix @ torch.ones(matrix.shape[1], dtype=matrix.dtype)).sum())
        return [{"total": total, "tensors": len(self.weights)} for _ in inputs]
