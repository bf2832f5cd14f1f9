"""Scores an image by how close its average colour is to each of the colours in labels.txt.

``ColourClassifier`` takes the image as an FP32 tensor, scaled any way an image client scales it
(0-255, 0-1, -1-1, mean-subtracted): the average colour is read relative to the image's own
range. ``FileColourClassifier`` takes image files as they are and decodes them (with Pillow).
"""

import io

import numpy as np

from dilu import InputError

PROTOTYPES = np.array([
    (1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 0), (0, 1, 1), (1, 0, 1),
    (1, 1, 1), (0, 0, 0), (0.5, 0.5, 0.5), (1, 0.5, 0), (0.5, 0, 0.5), (0.6, 0.3, 0.1),
], dtype=np.float32)


def colour_scores(image: np.ndarray) -> np.ndarray:
    """One score per prototype colour (1: the same colour) for a 3 x H x W image."""
    low, high = float(image.min()), float(image.max())
    colour = (image.reshape(3, -1).mean(axis=1) - low) / max(high - low, 1e-6)
    return (1.0 - np.linalg.norm(PROTOTYPES - colour, axis=1) / np.sqrt(3)).astype(np.float32)


class ColourClassifier:
    def predict(self, batch):
        return {"fc6_1": colour_scores(batch["data_0"])}


class FileColourClassifier:
    def load(self):
        try:
            from PIL import Image
        except ImportError:
            raise RuntimeError("this function decodes images with Pillow: pip install pillow") from None
        self.image = Image

    def predict(self, batch):
        rows = []
        for (data,) in batch["INPUT"]:
            try:
                picture = self.image.open(io.BytesIO(data)).convert("RGB")
            except OSError as exc:
                raise InputError(f"INPUT: not an image file Pillow reads: {exc}") from None
            pixels = np.asarray(picture, dtype=np.float32).transpose(2, 0, 1) / 255.0
            rows.append(colour_scores(pixels))
        return {"OUTPUT": np.stack(rows)}
