"""Handwritten digits, 0-9, from 8x8 images: a perceptron with trained weights.

The weights (model.safetensors, written by train.py: 97.5 % on the 360 held-out images) come
through `weights:` in model.yaml, so they travel apart from the code and are mapped, not read.
Each request holds ``image``: 8 rows of 8 pixels from 0 (white) to 16 (black), as the UCI
digits are; the answer holds the ``digit`` and the ten ``probabilities``. A batch's images are
classified in one tensor operation.
"""

import torch

import dilu
from dilu import Handler, InputError

SIDE, DARKEST = 8, 16


def _pixels(item):
    image = item.get("image") if isinstance(item, dict) else None
    if not (isinstance(image, list) and len(image) == SIDE and all(
            isinstance(row, list) and len(row) == SIDE and all(
                isinstance(v, (int, float)) and 0 <= v <= DARKEST for v in row) for row in image)):
        raise InputError(f"image must be {SIDE} rows of {SIDE} pixels, each from 0 (white) to {DARKEST} (black)")
    return [v for row in image for v in row]


class DigitClassifier(Handler):
    def load(self):
        w = dilu.weights()
        self.layers = (w["hidden.weight"], w["hidden.bias"], w["out.weight"], w["out.bias"])

    def predict(self, inputs):
        checked = []
        for item in inputs:
            try:
                checked.append(_pixels(item))
            except InputError as exc:
                checked.append(exc)
        rows = [item for item in checked if not isinstance(item, InputError)]
        if rows:
            hidden_w, hidden_b, out_w, out_b = self.layers
            with torch.inference_mode():
                x = torch.tensor(rows, dtype=torch.float32, device=hidden_w.device) / DARKEST
                logits = torch.relu(x @ hidden_w.T + hidden_b) @ out_w.T + out_b
                probabilities = torch.softmax(logits, dim=1).tolist()
        answers, at = [], 0
        for item in checked:
            if isinstance(item, InputError):
                answers.append(item)
                continue
            p = probabilities[at]
            at += 1
            answers.append({"digit": max(range(10), key=p.__getitem__), "probabilities": p})
        return answers
