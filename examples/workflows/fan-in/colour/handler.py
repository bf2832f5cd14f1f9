"""Colour statistics: per-channel means and spreads through a 1x1 convolution.

Input: {"image": 3 x 24 x 24 numbers}. Output: {"features": 8 numbers}.
"""

import torch

from dilu import Handler, InputError


class Colour(Handler):
    def load(self):
        torch.manual_seed(11)
        self.features = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 1), torch.nn.AdaptiveAvgPool2d(1))

    def predict(self, inputs):
        results = []
        for item in inputs:
            try:
                image = torch.tensor(item["image"], dtype=torch.float32).reshape(1, 3, 24, 24)
            except (KeyError, TypeError, ValueError, RuntimeError):
                results.append(InputError("image must be 3 x 24 x 24 numbers"))
                continue
            with torch.inference_mode():
                features = self.features(image).reshape(-1)[:8]
            results.append({"features": [round(float(v), 5) for v in features]})
        return results
