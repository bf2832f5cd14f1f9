"""Ranks the image into one of five scenes from the features of every extractor (a fan-in node:
its input is {node name: {"features": [...]}}, one entry per extractor that ran)."""

import torch

from dilu import Handler, InputError

SCENES = ("street", "parking", "park", "station", "indoor")
EXTRACTORS = ("colour", "texture", "shape", "edges")


class Ranker(Handler):
    def load(self):
        torch.manual_seed(15)
        self.model = torch.nn.Sequential(torch.nn.Linear(8 * len(EXTRACTORS), 32), torch.nn.ReLU(),
                                         torch.nn.Linear(32, len(SCENES)))

    def predict(self, inputs):
        results = []
        for item in inputs:
            try:
                x = torch.tensor([v for name in EXTRACTORS for v in item[name]["features"]], dtype=torch.float32)
            except (KeyError, TypeError, ValueError):
                results.append(InputError(f"expected the features of {', '.join(EXTRACTORS)}"))
                continue
            with torch.inference_mode():
                scores = torch.softmax(self.model(x), dim=0)
            results.append({"scene": SCENES[int(scores.argmax())],
                            "scores": {s: round(float(p), 4) for s, p in zip(SCENES, scores, strict=True)}})
        return results
