"""Imports a function's handler class from its source folder."""

from __future__ import annotations

import importlib
import os
import sys
import time
from typing import Any


class HandlerError(Exception):
    """The handler could not be imported, built or loaded; the message is shown to the user."""


def import_handler(source_dir: str, handler: str) -> type:
    """Resolves ``module:Class`` with ``source_dir`` first on the import path."""
    module_name, _, class_name = handler.partition(":")
    if source_dir not in sys.path:
        sys.path.insert(0, source_dir)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise HandlerError(f"cannot import handler module {module_name!r}: {type(exc).__name__}: {exc}") from exc
    check_inside(module, source_dir, module_name)
    try:
        return getattr(module, class_name)
    except AttributeError:
        raise HandlerError(f"handler class {class_name!r} not found in module {module_name!r}") from None


def check_inside(module: Any, source_dir: str, module_name: str) -> None:
    """The handler must come from the function's own code: a module name that is already taken
    (``os``, ``json``, a library) resolves elsewhere and is refused. Image functions (no
    ``source_dir``) import from the image, which is theirs."""
    if not source_dir:
        return
    location = getattr(module, "__file__", None)
    root = os.path.realpath(source_dir)
    if location is None or os.path.commonpath([os.path.realpath(location), root]) != root:
        raise HandlerError(f"handler module {module_name!r} resolves to {location or 'a built-in module'}, outside "
                           f"the function's code: rename the module")


def build_handler(source_dir: str, handler: str, options: dict[str, Any],
                  marks: dict[str, float] | None = None) -> Any:
    """Imports, instantiates with ``options`` and calls ``load()`` once; records the wall-clock
    time each stage ended in ``marks`` (``handler_imported``, ``loaded``)."""
    marks = {} if marks is None else marks
    cls = import_handler(source_dir, handler)
    marks["handler_imported"] = time.time()
    try:
        instance = cls(**options)
    except Exception as exc:
        raise HandlerError(f"{handler}({', '.join(options)}) failed: {type(exc).__name__}: {exc}") from exc
    if not callable(getattr(instance, "predict", None)):
        raise HandlerError(f"handler {handler!r} has no predict(inputs) method")
    load = getattr(instance, "load", None)
    if callable(load):
        try:
            load()
        except Exception as exc:
            raise HandlerError(f"{handler}.load() failed: {type(exc).__name__}: {exc}") from exc
    marks["loaded"] = time.time()
    return instance
