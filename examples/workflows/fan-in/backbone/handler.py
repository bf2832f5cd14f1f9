"""Cleans and reduces an image for the feature extractors (a denoising convolutional stack at full
resolution, then pooling to 24 x 24; weights from a fixed seed): the fan-out's source and the
heaviest node of the workflow.

Input: {"image": 3 x 128 x 128 numbers}. Output: {"image": 3 x 24 x 24 numbers}.
"""

import torch

from dilu import Handler, InputError

SIZE = 128
OUT = 24


class Backbone(Handler):
    def load(self):
        torch.manual_seed(10)
        self.stack = torch.nn.Sequential(
            torch.nn.Conv2d(3, 128, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(128, 256, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(256, 128, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(128, 3, 3, padding=1))
        self.stack.eval()

    def predict(self, inputs):
        results = []
        for item in inputs:
            try:
                image = torch.tensor(item["image"], dtype=torch.float32).reshape(1, 3, SIZE, SIZE)
            except (KeyError, TypeError, ValueError, RuntimeError):
                results.append(InputError(f"image must be 3 x {SIZE} x {SIZE} numbers"))
                continue
            with torch.inference_mode():
                cleaned = image + 0.1 * self.stack(image)        # a residual correction of the input
                reduced = torch.nn.functional.adaptive_avg_pool2d(cleaned, OUT).reshape(3, OUT, OUT)
            results.append({"image": [[[round(float(v), 4) for v in row] for row in channel] for channel in reduced]})
        return results
