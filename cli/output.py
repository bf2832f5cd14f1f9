"""How list and describe commands print: a table for people, or the gateway's JSON for scripts
(``-o json``), the same objects the HTTP API returns."""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from typing import Annotated, Any

import typer


class Output(StrEnum):
    table = "table"
    json = "json"


OutputOption = Annotated[Output, typer.Option("--output", "-o", help="table (for people) or json (for scripts)")]


def print_json(data: Any) -> None:
    """``data`` as indented JSON on stdout, nothing else (no colour, no wrapping)."""
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
