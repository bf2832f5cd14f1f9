"""A batch-class function: a real PyTorch training loop on the CPU (or the GPU when it has one).

It trains a small MLP to classify points of two interleaved spirals, one optimiser step per
mini-batch, in a background thread started by ``load()``, and reports every step's samples with
``report_progress``: the profiler sizes its compute slice by that rate, and ``dilu describe``
shows it. A request answers with the training state (steps, samples, the latest loss).
"""

from __future__ import annotations

import math
import threading

import torch

from dilu import Handler


def spirals(count: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Two interleaved spirals with a little noise: ``count`` points, labels 0 and 1."""
    turns = torch.rand(count, generator=generator) * 3 * math.pi
    label = torch.randint(0, 2, (count,), generator=generator)
    angle = turns + label * math.pi
    points = torch.stack([turns * torch.cos(angle), turns * torch.sin(angle)], dim=1) / (3 * math.pi)
    return points + 0.02 * torch.randn(count, 2, generator=generator), label


class SpiralTrainer(Handler):
    def load(self) -> None:
        torch.manual_seed(int(self.options.get("seed", 0)))
        self.batch = int(self.options.get("batch", 256))
        hidden = int(self.options.get("hidden", 128))
        self.model = torch.nn.Sequential(torch.nn.Linear(2, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                                         torch.nn.ReLU(), torch.nn.Linear(hidden, 2)).to(self.device)
        self.optimiser = torch.optim.Adam(self.model.parameters(), lr=float(self.options.get("lr", 0.003)))
        self.generator = torch.Generator().manual_seed(1)
        self.steps, self.samples, self.loss = 0, 0, None
        self.lock = threading.Lock()
        threading.Thread(target=self._train, name="training-loop", daemon=True).start()

    def _train(self) -> None:
        torch.set_num_threads(1)  # one core's worth per instance: its slice decides how much of it runs
        while True:
            points, labels = spirals(self.batch, self.generator)
            loss = torch.nn.functional.cross_entropy(self.model(points.to(self.device)), labels.to(self.device))
            self.optimiser.zero_grad()
            loss.backward()
            self.optimiser.step()
            with self.lock:
                self.steps += 1
                self.samples += self.batch
                self.loss = float(loss)
            self.report_progress(self.batch)

    def predict(self, inputs: list) -> list:
        with self.lock:
            state = {"steps": self.steps, "samples": self.samples,
                     "loss": None if self.loss is None else round(self.loss, 4)}
        return [state for _ in inputs]
