"""A small PyTorch function for the cold-start benchmark: a two-layer MLP on the CPU."""

import torch

from dilu import Handler


class TinyMlp(Handler):
    def load(self):
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).eval()

    def predict(self, inputs):
        with torch.inference_mode():
            x = torch.tensor([item["x"] for item in inputs], dtype=torch.float32)
            return [{"class": int(c)} for c in self.model(x).argmax(dim=1)]
