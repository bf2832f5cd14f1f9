"""Checks that a spec's handler module exists in the folder it is deployed from, and (read, never
imported) that a text generator's handler class can stream."""

from __future__ import annotations

import ast
from pathlib import Path

from dilu.spec import SpecError


def handler_module_path(source_dir: Path, handler: str) -> Path | None:
    """The file that holds ``handler``'s module under ``source_dir``, or None."""
    module = handler.split(":", 1)[0]
    base = source_dir.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def check_handler_source(source_dir: str | Path, handler: str) -> None:
    """Raises SpecError naming the handler when its folder or module is missing."""
    folder = Path(source_dir)
    if not folder.is_absolute():
        raise SpecError([f"source_dir: {source_dir!r} must be an absolute path"])
    if not folder.is_dir():
        raise SpecError([f"source_dir: folder {str(folder)!r} does not exist"])
    if handler_module_path(folder, handler) is None:
        module = handler.split(":", 1)[0]
        raise SpecError([f"handler: module {module!r} not found in {str(folder)!r}"])


# Bases whose methods are known: a class built on anything else may inherit start() and step().
PLAIN_BASES = frozenset({"object", "Handler", "dilu.Handler"})


def streaming_refusal(module_source: str, handler: str) -> str | None:
    """Why ``handler`` (``module:Class``) cannot be a text generator, read from its module's
    source: its class defines no ``start`` and ``step`` and inherits them from nothing that could
    have them. None when it can stream, or when the source does not tell (pure)."""
    class_name = handler.split(":", 1)[1]
    try:
        tree = ast.parse(module_source)
    except SyntaxError:
        return None     # the instance's load reports it, with its line
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            if any(ast.unparse(base) not in PLAIN_BASES for base in node.bases):
                return None
            methods = {item.name for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}
            missing = [name for name in ("start", "step") if name not in methods]
            if missing:
                return (f"generates: text, but the handler class {class_name!r} has no {' and '.join(missing)}(): a "
                        "text generator streams its chunks (start(request) and step(states), see "
                        "docs/spec.md#streaming-handlers)")
    return None
