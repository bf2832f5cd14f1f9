"""Which of the modules a worker can preload a function's code needs.

A runtime pool that preloads torch holds hundreds of MiB per process; it is worth it only while
a function that imports torch runs on the worker. So the worker reads the function's Python
sources (bounded: ``MAX_FILES`` files of at most ``MAX_FILE_BYTES``) for the top-level modules
they import, and matches them against what it offers to preload. A library built on an offered
module counts as importing it (``BUILT_ON``): ``transformers`` brings ``torch``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path

MAX_FILES = 256
MAX_FILE_BYTES = 1 << 20
BUILT_ON: dict[str, frozenset[str]] = {
    "torch": frozenset({"torchvision", "torchaudio", "transformers", "timm", "diffusers", "sentence_transformers",
                        "lightning", "pytorch_lightning", "accelerate", "peft", "ultralytics"}),
}


def imported_modules(sources: Iterable[str]) -> frozenset[str]:
    """The top-level names of the modules ``sources`` import, anywhere in them (pure); a source
    that does not parse adds nothing."""
    names: set[str] = set()
    for source in sources:
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return frozenset(names)


def preloads_needed(offered: tuple[str, ...], imported: frozenset[str], arrays: str | None = None) -> tuple[str, ...]:
    """The offered modules a function needs, in the offered order (pure): those it imports, or
    a library built on; ``arrays: torch`` in its spec needs torch."""
    used = set(imported) | ({arrays} if arrays else set())
    return tuple(module for module in offered
                 if module.split(".")[0] in used or used & BUILT_ON.get(module, frozenset()))


def python_sources(folder: str | Path) -> Iterator[str]:
    """The text of the Python files under ``folder``, within the bounds above; unreadable ones
    are skipped."""
    root = Path(folder)
    if not root.is_dir():
        return
    for path in islice(root.rglob("*.py"), MAX_FILES):
        try:
            if path.is_symlink() or path.stat().st_size > MAX_FILE_BYTES:
                continue
            yield path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
