"""Four feature extractors over one image, one function each (colour.yaml, texture.yaml,
shape.yaml, edges.yaml name the class): small PyTorch modules, weights from fixed seeds.

Input: the backbone's output, {"image": 3 x 24 x 24 numbers}. Output: {"features": 8 numbers}.
"""

import torch

from dilu import Handler, InputError


class _Extractor(Handler):
    seed = 0

    def load(self):
        torch.manual_seed(self.seed)
        self.features = self.build()

    def build(self):  # pragma: no cover - each extractor has its own
        raise NotImplementedError

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


class Colour(_Extractor):
    """Per-channel statistics through a 1x1 convolution."""

    seed = 11

    def build(self):
        return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 1), torch.nn.AdaptiveAvgPool2d(1))


class Texture(_Extractor):
    """A small convolutional stack, then the spread of its responses."""

    seed = 12

    def build(self):
        conv = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3))
        return lambda x: conv(x).flatten(2).std(dim=2)


class Shape(_Extractor):
    """Strided convolutions pooled to one vector."""

    seed = 13

    def build(self):
        return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 5, stride=2), torch.nn.ReLU(),
                                   torch.nn.Conv2d(8, 8, 3, stride=2), torch.nn.AdaptiveMaxPool2d(1))


class Edges(_Extractor):
    """Fixed Sobel filters on the grey image, then learned pooling of their magnitudes."""

    seed = 14

    def build(self):
        sobel = torch.tensor([[-1.0, 0, 1], [-2, 0, 2], [-1, 0, 1]])
        kernels = torch.stack([sobel, sobel.T]).unsqueeze(1)
        mix = torch.nn.Linear(2, 8)
        return lambda x: mix(torch.nn.functional.conv2d(x.mean(dim=1, keepdim=True), kernels).abs().mean(dim=(2, 3)))
