"""What every CLI command shares: the consoles, the gateway client (and one call that fails the
command with the gateway's message, and every page of a list), failing with a message, and
reading a JSON input given as text or @file."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, TextIO

import typer
from rich.console import Console
from rich.text import Text

from cli.client import CliError, GatewayClient
from dilu.config import CliSettings

OFF_TERMINAL_WIDTH = 1000


def _width(stream: TextIO) -> int | None:
    """Off a terminal (a pipe, a log, CI) rich would cut tables to 80 columns: there rows are
    printed whole, unless COLUMNS sets a width. On a terminal, its own width."""
    if os.environ.get("COLUMNS") or stream.isatty():
        return None
    return OFF_TERMINAL_WIDTH


# Plain text: what functions produce (errors, reasons, logs) is never read as rich markup, so
# '[/]' cannot crash a command nor '[link=...]' draw a link. Colour goes through ``styled``.
out = Console(markup=False, highlight=False, width=_width(sys.stdout))
err = Console(stderr=True, markup=False, highlight=False, width=_width(sys.stderr))


def styled(word: str, style: str, rest: str = "") -> Text:
    """``word`` in ``style`` followed by ``rest`` as plain text."""
    return Text.assemble((word, style), rest)


def client(timeout: float = 30.0) -> GatewayClient:
    settings = CliSettings()
    return GatewayClient(settings.url, timeout=timeout, api_key=settings.api_key)


def fail(message: str) -> None:
    err.print(styled("error:", "red", f" {message}"), soft_wrap=True)
    raise typer.Exit(1)


def call(method: str, path: str, *, timeout: float = 30.0, **kwargs: Any) -> Any:
    """One gateway request's JSON answer; any error (refused, unreachable, 4xx/5xx) ends the
    command with the gateway's message."""
    try:
        return client(timeout).json(method, path, **kwargs)
    except CliError as exc:
        fail(str(exc))


PAGE = 500


def every_item(path: str, page: int = PAGE) -> list[Any]:
    """Every item a list endpoint holds, ``page`` at a time (a catalogue of thousands is not one
    answer); any error ends the command with the gateway's message."""
    gateway, items, cursor = client(), [], None
    try:
        while True:
            reply = gateway.request("GET", path, params={"limit": page, **({"cursor": cursor} if cursor else {})})
            items += reply.json()
            cursor = reply.headers.get("x-next-cursor")
            if not cursor:
                return items
    except CliError as exc:
        fail(str(exc))


def read_file(path: Path) -> str:
    """A text file the command was given (a spec, a workflow); fails with a message naming it."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        fail(f"{path}: no such file")
    except (IsADirectoryError, UnicodeDecodeError, PermissionError) as exc:
        fail(f"{path}: cannot read it ({exc})")


def json_input(data: str) -> str:
    """``--data``: JSON text, or ``@file`` to read it from; fails with a message if it is not JSON."""
    if data.startswith("@"):
        try:
            data = Path(data[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            fail(f"cannot read {data[1:]}: {exc.strerror or exc}")
    try:
        json.loads(data)
    except ValueError as exc:
        fail(f"--data is not valid JSON: {exc}")
    return data
