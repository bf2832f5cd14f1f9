"""Texture: a small convolutional stack, then the spread of its responses.

Input: {"image": 3 x 24 x 24 numbers}. Output: {"features": 8 numbers}.
"""

import torch

from dilu import Handler, InputError


class Texture(Handler):
    def load(self):
        torch.manual_seed(12)
        conv = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3))
        self.features = lambda x: conv(x).flatten(2).std(dim=2)

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
