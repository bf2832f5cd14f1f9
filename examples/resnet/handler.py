"""A ResNet-style image classifier built in code (random weights, fixed seed; nothing downloaded).

Input: {"image": [[[float]]]} with shape 3 x H x W (H, W >= 8). Output: the top classes.
"""

import torch
from torch import nn

from dilu import Handler


class BasicBlock(nn.Module):
    def __init__(self, channels_in: int, channels_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels_out)
        self.conv2 = nn.Conv2d(channels_out, channels_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or channels_in != channels_out:
            self.shortcut = nn.Sequential(nn.Conv2d(channels_in, channels_out, 1, stride, bias=False),
                                          nn.BatchNorm2d(channels_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, num_classes: int, width: int, blocks: tuple[int, ...]) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        layers, channels = [], width
        for stage, count in enumerate(blocks):
            out_channels = width * 2**stage
            for index in range(count):
                layers.append(BasicBlock(channels, out_channels, 2 if index == 0 and stage > 0 else 1))
                channels = out_channels
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.layers(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(features, 1), 1))


class ResNetClassifier(Handler):
    def load(self) -> None:
        torch.manual_seed(int(self.options.get("seed", 0)))
        torch.set_num_threads(int(self.options.get("threads", 1)))
        self.top_k = int(self.options.get("top_k", 3))
        self.model = ResNet(int(self.options.get("num_classes", 10)), int(self.options.get("width", 16)),
                            tuple(self.options.get("blocks", (2, 2, 2)))).to(self.device).eval()

    def predict(self, inputs: list) -> list:
        images = []
        for item in inputs:
            image = torch.tensor(item["image"], dtype=torch.float32)
            if image.dim() != 3 or image.shape[0] != 3 or min(image.shape[1:]) < 8:
                raise ValueError(f"image must be 3 x H x W with H, W >= 8, got {tuple(image.shape)}")
            images.append(image)
        if len({tuple(i.shape) for i in images}) > 1:
            # Different sizes cannot share one tensor; run them one by one.
            return [self.predict([item])[0] for item in inputs]
        with torch.inference_mode():
            probabilities = torch.softmax(self.model(torch.stack(images).to(self.device)), dim=1).cpu()
        values, classes = probabilities.topk(min(self.top_k, probabilities.shape[1]), dim=1)
        return [{"top": [{"class": int(c), "probability": round(float(p), 6)} for c, p in zip(cs, vs, strict=True)]}
                for cs, vs in zip(classes, values, strict=True)]
