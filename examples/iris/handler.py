"""Iris species from four measurements: a nearest-centroid classifier in PyTorch.

The centroids are the per-species means of Fisher's Iris data (50 flowers each). Each request
holds ``features``: rows of four numbers; the answer holds, per row, ``probabilities`` (softmax
of the negative squared distances, scaled by ``temperature``) and the ``species`` name. Rows of
all requests in a batch are classified in one tensor operation.
"""

import torch

from dilu import Handler, InputError

SPECIES = ("setosa", "versicolor", "virginica")
CENTROIDS = ((5.006, 3.428, 1.462, 0.246),
             (5.936, 2.770, 4.260, 1.326),
             (6.588, 2.974, 5.552, 2.026))


def _rows(item):
    rows = item.get("features") if isinstance(item, dict) else None
    if not isinstance(rows, list) or not all(
            isinstance(row, list) and len(row) == 4 and all(isinstance(v, (int, float)) for v in row) for row in rows):
        raise InputError("features must be a list of rows of 4 numbers (sepal length, sepal width, "
                         "petal length, petal width)")
    return rows


class IrisClassifier(Handler):
    def load(self):
        self.centroids = torch.tensor(CENTROIDS, dtype=torch.float32)
        self.temperature = float(self.options.get("temperature", 1.0))

    def predict(self, inputs):
        checked = []
        for item in inputs:
            try:
                checked.append(_rows(item))
            except InputError as exc:
                checked.append(exc)
        rows = [row for item in checked if not isinstance(item, InputError) for row in item]
        with torch.inference_mode():
            features = torch.tensor(rows, dtype=torch.float32).reshape(-1, 4)
            distances = torch.cdist(features, self.centroids) ** 2
            probabilities = torch.softmax(-distances / self.temperature, dim=1)
        results, start = [], 0
        for item in checked:
            if isinstance(item, InputError):
                results.append(item)
                continue
            part = probabilities[start:start + len(item)]
            start += len(item)
            results.append({"probabilities": part.tolist(),
                            "species": [SPECIES[i] for i in part.argmax(dim=1).tolist()]})
        return results
