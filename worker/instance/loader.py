"""Imports a function's handler class from its source folder."""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from dilu.handler import Last, set_weights
from worker.instance.streams import is_streaming
from worker.instance.weights import map_weights, to_device


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


WARMUP_FILE_LIMIT = 16 * 2**20


def build_handler(source_dir: str, handler: str, options: dict[str, Any],
                  marks: dict[str, float] | None = None, *, device: str = "cpu",
                  warmup: dict[str, Any] | None = None, adapt: Callable[[Any], Any] | None = None,
                  weights: str | None = None) -> Any:
    """Imports, initialises the GPU (when the instance has one), maps the ``weights`` file and
    copies it to the device (when given), instantiates with ``options``, calls ``load()`` once,
    wraps the result in ``adapt`` when given and runs the warm-up requests through it; records the
    wall-clock time each stage ended in ``marks`` (``handler_imported``, ``device_ready``,
    ``mapped``, ``copied``, ``loaded``, ``warmed``)."""
    marks = {} if marks is None else marks
    cls = import_handler(source_dir, handler)
    marks["handler_imported"] = time.time()
    if device != "cpu" and _init_device():
        marks["device_ready"] = time.time()
    if weights:
        _load_weights(weights, device, marks)
    try:
        instance = cls(**options)
    except Exception as exc:
        raise HandlerError(f"{handler}({', '.join(options)}) failed: {type(exc).__name__}: {exc}") from exc
    if not callable(getattr(instance, "predict", None)) and not is_streaming(instance):
        raise HandlerError(f"handler {handler!r} has no predict(inputs) method (nor start() and step() to stream)")
    load = getattr(instance, "load", None)
    if callable(load):
        try:
            load()
        except Exception as exc:
            raise HandlerError(f"{handler}.load() failed: {type(exc).__name__}: {exc}") from exc
    marks["loaded"] = time.time()
    if adapt is not None:
        instance = adapt(instance)
    if warmup:
        run_warmup(instance, warmup, source_dir)
        marks["warmed"] = time.time()
    return instance


def _load_weights(path: str, device: str, marks: dict[str, float]) -> None:
    try:
        tensors = map_weights(path)
        marks["mapped"] = time.time()
        if to_device(tensors, device):
            marks["copied"] = time.time()
    except Exception as exc:
        raise HandlerError(f"weights: cannot load {os.path.basename(path)}: {type(exc).__name__}: {exc}") from exc
    set_weights(tensors)


def _init_device() -> bool:
    """Creates the CUDA context now, when the handler's module brought torch and a GPU is visible,
    so its cost is measured as its own stage rather than inside ``load()`` (False: nothing done)."""
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_available():
            return False
        torch.cuda.init()
        torch.zeros(1, device="cuda")    # the context exists once something lives on the device
        return True
    except Exception as exc:  # a broken device is the handler's load failure to report
        raise HandlerError(f"GPU initialisation failed: {type(exc).__name__}: {exc}") from exc


def read_warmup_request(warmup: dict[str, Any], source_dir: str) -> Any:
    """The warm-up request: inline, or a JSON file inside the function's code."""
    if warmup.get("file") is None:
        return warmup.get("request")
    root = os.path.realpath(source_dir or ".")
    path = os.path.realpath(os.path.join(root, warmup["file"]))
    if os.path.commonpath([path, root]) != root:
        raise HandlerError(f"warm-up file {warmup['file']!r} is outside the function's code")
    try:
        with open(path, "rb") as handle:
            data = handle.read(WARMUP_FILE_LIMIT + 1)
    except OSError as exc:
        raise HandlerError(f"warm-up file {warmup['file']!r}: {exc.strerror or exc}") from exc
    if len(data) > WARMUP_FILE_LIMIT:
        raise HandlerError(f"warm-up file {warmup['file']!r} is larger than {WARMUP_FILE_LIMIT} bytes")
    try:
        return json.loads(data)
    except ValueError as exc:
        raise HandlerError(f"warm-up file {warmup['file']!r} is not valid JSON: {exc}") from exc


def run_warmup(instance: Any, warmup: dict[str, Any], source_dir: str) -> None:
    """Runs the warm-up request ``count`` times; a failing one fails the load (a model that cannot
    answer its own example would fail its users too)."""
    request = read_warmup_request(warmup, source_dir)
    if is_streaming(instance):
        for _ in range(int(warmup.get("count") or 1)):
            _warm_stream(instance, request)
        return
    for _ in range(int(warmup.get("count") or 1)):
        try:
            results = instance.predict([request])
        except Exception as exc:
            raise HandlerError(f"warm-up request failed: {type(exc).__name__}: {exc}") from exc
        failed = next((r for r in results or [] if isinstance(r, BaseException)), None)
        if failed is not None:
            raise HandlerError(f"warm-up request failed: {failed}")


WARMUP_MAX_STEPS = 100_000


def _warm_stream(instance: Any, request: Any) -> None:
    """One streamed warm-up request, step by step to its last chunk."""
    try:
        state = instance.start(request)
        for _ in range(WARMUP_MAX_STEPS):
            (chunk,) = instance.step([state])
            if isinstance(chunk, BaseException):
                raise chunk
            if isinstance(chunk, Last):
                return
    except Exception as exc:
        raise HandlerError(f"warm-up request failed: {type(exc).__name__}: {exc}") from exc
    raise HandlerError(f"warm-up request did not end within {WARMUP_MAX_STEPS} steps")
