"""`dilu workflow deploy|ls|describe|invoke|rm`: DAGs of deployed functions."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from cli.common import call, err, every_item, json_input, out, read_file, styled
from cli.output import Output, OutputOption, print_json

workflow_app = typer.Typer(help="Workflows: DAGs of deployed functions.", no_args_is_help=True)


@workflow_app.command("deploy")
def deploy(file: Annotated[Path, typer.Argument(help="workflow.yaml")]) -> None:
    """Deploy (or update) a workflow; its functions must be deployed already."""
    text = read_file(file)
    workflow = call("POST", "/v1/workflows", json={"yaml": text})
    out.print(styled("deployed", "green", f" workflow {workflow['name']} (version {workflow['version']}, "
                                         f"{workflow['nodes']} nodes)  ->  POST {workflow['invoke_url']}"))


@workflow_app.command("ls")
def list_workflows(output: OutputOption = Output.table) -> None:
    """List workflows."""
    items = every_item("/v1/workflows")
    if output is Output.json:
        return print_json(items)
    table = Table("NAME", "VERSION", "NODES", "OUTPUT")
    for item in items:
        output = item["spec"].get("output")
        table.add_row(item["name"], str(item["version"]), str(item["nodes"]),
                      ", ".join(output) if isinstance(output, list) else str(output or "(the last node)"))
    out.print(table)


@workflow_app.command("describe")
def describe(name: str, output: OutputOption = Output.table) -> None:
    """Show a workflow's nodes, their functions, parents and conditions, and (loading: slack) what
    the keep-alive rule last decided for each and why."""
    item = call("GET", f"/v1/workflows/{name}")
    if output is Output.json:
        return print_json(item)
    out.print(f"{item['name']}  version {item['version']}", highlight=False)
    table = Table("NODE", "FUNCTION", "AFTER", "WHEN", "TIMEOUT", "KEEP")
    keep = item.get("keep") or {}
    for node in item["spec"]["nodes"]:
        when = node.get("when")
        condition = "" if not when else f"{when['node']}.{when['field']} " + ", ".join(
            f"{k} {json.dumps(v)}" for k, v in when.items() if k not in ("node", "field"))
        decided = keep.get(node["name"])
        table.add_row(node["name"], node["function"], ", ".join(node.get("after", [])) or "(request)", condition,
                      f"{node['timeout_s']:g}s" if node.get("timeout_s") else "",
                      f"{decided['verdict']} ({decided['exposed_s']:.2f} s exposed)" if decided else "")
    out.print(table)
    for name, decided in keep.items():
        out.print(f"{name}: {decided['verdict']}: {decided['reason']}", highlight=False)


@workflow_app.command("invoke")
def invoke(
    name: str,
    data: Annotated[str, typer.Option("--data", "-d", help="JSON text, or @file to read it from a file")] = "{}",
    timings: Annotated[bool, typer.Option(help="Print each node's timings")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the answer")] = 300.0,
) -> None:
    """Run a workflow on one JSON input and print its output."""
    data = json_input(data)
    result = call("POST", f"/v1/workflows/{name}/invoke", content=data,
                  params={"timings": "true"} if timings else None,
                  headers={"content-type": "application/json"}, timeout=timeout)
    if not timings:
        sys.stdout.write(json.dumps(result) + "\n")
        return
    sys.stdout.write(json.dumps(result["output"]) + "\n")
    table = Table("NODE", "STATUS", "START ms", "END ms")
    for node, run in result["nodes"].items():
        table.add_row(node, run["status"], "" if run["started_ms"] is None else f"{run['started_ms']:.1f}",
                      "" if run["ended_ms"] is None else f"{run['ended_ms']:.1f}")
    err.print(table)
    err.print(f"total {result['total_ms']:.1f} ms", highlight=False)


@workflow_app.command("rm")
def rm(name: str) -> None:
    """Delete a workflow (its functions stay)."""
    call("DELETE", f"/v1/workflows/{name}")
    out.print(f"deleted workflow {name}")
