"""Estimates a body pose from the detector's description (a small MLP; weights from a fixed seed).

Input: the detector's output. Output: 17 key points and a posture, and the language passed on.
"""

import torch

from dilu import Handler

POSTURES = ("standing", "walking", "sitting", "running")


class Poses(Handler):
    def load(self):
        torch.manual_seed(3)
        self.points = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 34))
        self.posture = torch.nn.Linear(34, len(POSTURES))

    def predict(self, inputs):
        x = torch.tensor([item["features"] for item in inputs], dtype=torch.float32)
        with torch.inference_mode():
            points = torch.tanh(self.points(x))
            posture = self.posture(points).argmax(dim=1)
        return [{"keypoints": [[round(float(a), 4), round(float(b), 4)] for a, b in p.reshape(17, 2)],
                 "posture": POSTURES[int(k)], "language": item["language"]}
                for item, p, k in zip(inputs, points, posture, strict=True)]
