"""`dilu init NAME`: a folder holding a working function to start from (handler.py, model.yaml,
request.json), which `dilu deploy NAME/model.yaml` deploys as it is."""

from __future__ import annotations

import re
from pathlib import Path

from dilu.spec import NAME_PATTERN

HANDLER = '''"""{name}: a function to make your own. Replace the network in load() with your model and
the checks in predict() with your inputs; docs/spec.md has the whole handler contract."""

import torch

from dilu import Handler, InputError

FEATURES = 3


class Model(Handler):
    def load(self):
        # Called once per instance, before any request: load weights here (a file beside this
        # handler, `weights:` in model.yaml, see docs/spec.md#weights) and warm up.
        torch.manual_seed(0)
        self.net = torch.nn.Linear(FEATURES, 2).to(self.device).eval()

    def predict(self, inputs):
        # One call per batch: up to batching.max_batch_size requests, each a decoded JSON body.
        # Answer one result per request, in order; an InputError in a request's place is its 422.
        rows, results = [], []
        for item in inputs:
            x = item.get("x") if isinstance(item, dict) else None
            if not (isinstance(x, list) and len(x) == FEATURES and all(isinstance(v, (int, float)) for v in x)):
                results.append(InputError(f'send {{"x": [...]}} with {FEATURES} numbers'))
            else:
                results.append(len(rows))
                rows.append(x)
        if rows:
            with torch.inference_mode():
                scores = self.net(torch.tensor(rows, dtype=torch.float32, device=self.device)).tolist()
        return [r if isinstance(r, InputError) else {"scores": scores[r]} for r in results]
'''

SPEC = '''# `dilu spec check model.yaml` validates this file; docs/model.reference.yaml has every field.
name: {name}
handler: handler:Model
class: latency            # inference with a latency target; `batch` for training and offline work
slo:
  p99_ms: 100
resources:
  memory: 512Mi
  gpu: auto               # a GPU when one is free, else the CPU
scaling:
  min_instances: 0        # scale to zero when idle
  max_instances: 2
  keep_alive_s: 300
batching:
  max_batch_size: 8       # concurrent requests served by one predict() call
  max_wait_ms: 2
'''

REQUEST = '{"x": [1.0, 2.0, 3.0]}\n'


class ScaffoldError(ValueError):
    """The name or the folder cannot take a new function; the message says why."""


def write_scaffold(name: str, folder: Path) -> list[Path]:
    """Writes the three files into ``folder`` (created; it must not exist or be empty) and returns
    their paths. Nothing is overwritten."""
    if not re.match(NAME_PATTERN, name):
        raise ScaffoldError(f"{name!r} is not a function name: a-z, 0-9, - and _, at most 63, starting and "
                            "ending with a letter or digit")
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ScaffoldError(f"{folder} already exists and is not an empty folder: nothing was written")
    folder.mkdir(parents=True, exist_ok=True)
    # replace, not format: the templates are Python and YAML full of braces
    files = {"handler.py": HANDLER.replace("{name}", name), "model.yaml": SPEC.replace("{name}", name),
             "request.json": REQUEST}
    written = []
    for file_name, text in files.items():
        path = folder / file_name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
