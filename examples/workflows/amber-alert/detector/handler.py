"""Finds people and vehicles in a frame (a convolutional network of about 7 M weights, from a
fixed seed: the heaviest node, as detection is in the real pipeline).

Input: {"frame": 3 x 128 x 128 numbers, "language": "en" | "es" | ...}. Output: the objects found
with their scores, a 16-number description of the most likely one (what face and pose
recognition read), and the language passed on.
"""

import torch

from dilu import Handler, InputError

LABELS = ("person", "vehicle")
SIZE = 128


class Detector(Handler):
    def load(self):
        torch.manual_seed(1)
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(64, 128, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(128, 256, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(256, 256, 3, padding=1), torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(256, 512, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(512, 512, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(512, 512, 3, padding=1), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(512, 16))
        self.head = torch.nn.Linear(16, len(LABELS))
        self.body.eval()

    def predict(self, inputs):
        frames = []
        for item in inputs:
            try:
                frames.append(torch.tensor(item["frame"], dtype=torch.float32).reshape(3, SIZE, SIZE))
            except (KeyError, TypeError, ValueError, RuntimeError):
                frames.append(None)
        ok = [f for f in frames if f is not None]
        results = []
        with torch.inference_mode():
            features = self.body(torch.stack(ok)) if ok else None
            scores = torch.sigmoid(self.head(features)) if ok else None
        k = 0
        for item, frame in zip(inputs, frames, strict=True):
            if frame is None:
                results.append(InputError(f"frame must be 3 x {SIZE} x {SIZE} numbers"))
                continue
            objects = [{"label": label, "score": round(float(s), 4)} for label, s in zip(LABELS, scores[k],
                                                                                         strict=True)]
            results.append({"objects": objects, "features": [round(float(v), 5) for v in features[k]],
                            "language": str(item.get("language", "en"))})
            k += 1
        return results
