"""Checks that a spec's handler module exists in the folder it is deployed from."""

from __future__ import annotations

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
