"""Trains the digits classifier and writes model.safetensors beside this file.

The data is the UCI handwritten digits (data/digits.csv.gz: 1797 images of 8x8 pixels 0-16,
the label last; data/SOURCE.md has its source and licence). Every fifth image is held out; the
rest train a 64-64-10 perceptron. It is deterministic (one seed, full-batch Adam, CPU), takes a
few seconds, and prints the held-out accuracy:

    python examples/digits/train.py
"""

from __future__ import annotations

import gzip
from pathlib import Path

import torch
from safetensors.torch import save_file

HERE = Path(__file__).resolve().parent
EPOCHS = 400


def load_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """(images as rows of 64 floats in 0-1, labels)."""
    rows = [[int(v) for v in line.split(",")] for line in gzip.open(HERE / "data" / "digits.csv.gz", "rt")
            if line.strip()]
    data = torch.tensor(rows)
    return data[:, :64].float() / 16.0, data[:, 64]


def held_out(count: int) -> torch.Tensor:
    """Which images are held out of training: every fifth."""
    return torch.arange(count) % 5 == 0


def main() -> None:
    torch.manual_seed(0)
    images, labels = load_digits()
    test = held_out(len(labels))
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimiser = torch.optim.Adam(net.parameters(), lr=0.01, weight_decay=1e-4)
    for _ in range(EPOCHS):
        optimiser.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(images[~test]), labels[~test])
        loss.backward()
        optimiser.step()
    with torch.no_grad():
        accuracy = (net(images[test]).argmax(dim=1) == labels[test]).float().mean().item()
    hidden, out = net[0], net[2]
    save_file({"hidden.weight": hidden.weight.detach().contiguous(), "hidden.bias": hidden.bias.detach(),
               "out.weight": out.weight.detach().contiguous(), "out.bias": out.bias.detach()},
              HERE / "model.safetensors", metadata={"held_out_accuracy": f"{accuracy:.4f}"})
    print(f"held-out accuracy {accuracy:.4f} on {int(test.sum())} images; wrote {HERE / 'model.safetensors'}")


if __name__ == "__main__":
    main()
