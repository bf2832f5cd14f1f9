"""`dilu`: run the platform and manage functions."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from cli.artifacts import upload_weights
from cli.client import CliError, GatewayClient
from cli.common import call, client, err, every_item, fail, json_input, out, read_file, styled
from cli.output import Output, OutputOption, print_json
from cli.simulate import simulate
from cli.telemetry import telemetry_notes
from cli.workflow import workflow_app
from dilu.config import AllInOneSettings, CliSettings, ControllerSettings, GatewaySettings, WorkerSettings

app = typer.Typer(help="Dilu: serverless deep-learning functions on GPUs.", no_args_is_help=True,
                  pretty_exceptions_enable=False, add_completion=False)
spec_app = typer.Typer(help="The model.yaml function spec.", no_args_is_help=True)
app.add_typer(spec_app, name="spec")
keys_app = typer.Typer(help="API keys (the first one turns authentication on).", no_args_is_help=True)
app.add_typer(keys_app, name="keys")
app.command("simulate")(simulate)
app.add_typer(workflow_app, name="workflow")
_client, _fail = client, fail
FOLLOW_POLL_S = 1.0      # dilu logs -f: how often the logs are read again
FOLLOW_TAIL = 1000       # and how many of each instance's last lines each read takes


def _run(coroutine: Coroutine[Any, Any, None]) -> None:
    """Runs a role on uvloop when it is installed (it comes with uvicorn[standard])."""
    from cli.roles.serving import StartupError

    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    # A role started in the background by a non-interactive shell inherits SIGINT ignored; the
    # gateway and worker stop on it anyway (uvicorn sets its own handlers), and so must the rest.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(coroutine)
    except StartupError as exc:
        coroutine.close()
        _fail(str(exc))


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # One line per HTTP call between roles is noise unless asked for.
    logging.getLogger("httpx").setLevel(logging.DEBUG if verbose else logging.WARNING)


# ---------------------------------------------------------------- running the platform
@app.command()
def up(
    demo: Annotated[bool, typer.Option(help="Deploy the examples once the platform is up")] = False,
    host: Annotated[str | None, typer.Option(help="Gateway address (DILU_HOST)")] = None,
    port: Annotated[int | None, typer.Option(help="Gateway port; 0 picks a free one (DILU_PORT)")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run gateway, controller and workers in one process (SQLite + in-process state by default)."""
    from cli.roles.all_in_one import run_all_in_one

    _setup_logging(verbose)
    overrides = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    settings = AllInOneSettings(**overrides)
    from cli.carried import carried_state_lines, read_carried_state

    for line in carried_state_lines(read_carried_state(settings.effective_database_url), settings.home):
        out.print(line, highlight=False, soft_wrap=True)

    async def ready(url: str, grpc_address: str | None) -> None:
        out.print(f"Dilu is up at {url}  (state in {settings.home}; Ctrl-C stops it)", highlight=False)
        _say_grpc(grpc_address)
        if demo:
            await asyncio.to_thread(_deploy_examples, url, CliSettings().api_key or settings.admin_key)

    _run(run_all_in_one(settings, ready))


def _say_grpc(address: str | None) -> None:
    if address is not None:
        out.print(f"Inference protocol (v2) over gRPC at {address}; over HTTP under /v2", highlight=False)


def examples_dir() -> Path | None:
    """The repository's examples folder (present in a clone or an editable install)."""
    candidate = Path(__file__).resolve().parent.parent / "examples"
    return candidate if candidate.is_dir() else None


def _deploy_examples(url: str, api_key: str | None) -> None:
    folder = examples_dir()
    if folder is None:
        err.print("no examples folder found; --demo needs a clone of the repository")
        return
    client = GatewayClient(url, api_key=api_key)
    for spec_file in sorted(folder.glob("*/model.yaml")):
        try:
            text, _ = upload_weights(client, spec_file.read_text(encoding="utf-8"), spec_file.parent)
            function = client.json("POST", "/v1/functions", json={
                "yaml": text, "source_dir": str(spec_file.parent.resolve())})
            out.print(f"demo: deployed {function['name']}  ->  POST {function['invoke_url']}"
                      f"  (sample: {spec_file.parent / 'request.json'})", highlight=False)
        except CliError as exc:
            err.print(f"demo: {spec_file}: {exc}")


@app.command()
def gateway(verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False) -> None:
    """Run the gateway alone (needs DILU_DATABASE_URL and DILU_REDIS_URL shared with the others)."""
    from cli.roles.gateway import run_gateway

    _setup_logging(verbose)
    settings = GatewaySettings()

    async def ready(url: str, grpc_address: str | None) -> None:
        out.print(f"Dilu gateway at {url}", highlight=False)
        _say_grpc(grpc_address)

    _run(run_gateway(settings, ready))


@app.command()
def controller(verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False) -> None:
    """Run the controller alone."""
    from cli.roles.controller import run_controller

    _setup_logging(verbose)
    try:
        _run(run_controller(ControllerSettings()))
    except KeyboardInterrupt:
        pass


@app.command()
def worker(verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False) -> None:
    """Run a worker agent for each device of this host (API on DILU_PORT, DILU_PORT+1, ...)."""
    from cli.roles.worker import run_worker

    _setup_logging(verbose)

    async def ready(url: str, _grpc: str | None) -> None:
        out.print(f"Dilu worker at {url}", highlight=False)

    _run(run_worker(WorkerSettings(), ready))


@app.command()
def migrate() -> None:
    """Create or upgrade the database schema (the prestart step of a multi-role deployment)."""
    from sqlalchemy.exc import OperationalError

    from dilu.config import CommonSettings
    from dilu.db.engine import migrate as run_migrations

    url = CommonSettings().effective_database_url
    try:
        run_migrations(url)
    except OperationalError as exc:
        _fail(f"cannot migrate the database at {url.split('@')[-1]}: {str(exc.orig).strip().splitlines()[0]}")
    out.print(f"database at {url.split('@')[-1]} is up to date", highlight=False)


# ---------------------------------------------------------------- managing functions
def _names_image(spec_text: str) -> bool:
    """Whether the spec names a container image (then its code is not uploaded); the gateway
    validates the spec itself."""
    import yaml

    try:
        document = yaml.safe_load(spec_text)
    except yaml.YAMLError:
        return False
    return isinstance(document, dict) and bool(document.get("image"))


def _upload_bundle(client: GatewayClient, folder: Path, leave_out: tuple[Path, ...] = ()) -> str:
    """Packs ``folder`` (without the files ``leave_out`` names) and uploads it unless the gateway
    has it already; returns its digest."""
    from dilu.bundles import BundleError, digest_of, pack

    try:
        data = pack(folder, CliSettings().max_bundle_bytes, leave_out)
    except BundleError as exc:
        raise CliError(str(exc)) from None
    digest = digest_of(data)
    if client.request("HEAD", f"/v1/bundles/{digest}", allow_status=(404,)).status_code != 200:
        client.json("POST", "/v1/bundles", content=data, headers={"content-type": "application/gzip"})
    return digest


@app.command()
def deploy(
    file: Annotated[Path, typer.Argument(help="model.yaml")],
    wait: Annotated[bool, typer.Option(help="Wait until the function is ready or failed")] = True,
    timeout: Annotated[float, typer.Option(help="Seconds to wait")] = 600.0,
    local: Annotated[bool, typer.Option("--local", help="Send the folder's path instead of uploading it "
                                                        "(a platform on this machine only)")] = False,
) -> None:
    """Deploy (or update) a function and show its progress until it is ready.

    The spec's folder is packed (without what its .dilignore lists) and uploaded once per content;
    a spec that names an image uploads nothing."""
    text = read_file(file)
    client = _client()
    try:
        text, weights_file = upload_weights(client, text, file.resolve().parent)
        body = {"yaml": text}
        if local:
            body["source_dir"] = str(file.resolve().parent)
        elif not _names_image(text):
            body["bundle"] = _upload_bundle(client, file.resolve().parent,
                                            (weights_file,) if weights_file else ())
        function = client.json("POST", "/v1/functions", json=body)
        name, version = function["name"], function["version"]
        out.print(f"deploying {name} (version {version})", highlight=False)
        if not wait:
            return
        deadline = time.monotonic() + timeout
        with err.status(f"starting {name} ...") as status:
            while True:
                function = client.json("GET", f"/v1/functions/{name}")
                if function["version"] != version:
                    _fail(f"{name} was redeployed meanwhile (now version {function['version']})")
                if function["status"] == "ready":
                    break
                if function["status"] == "failed":
                    placed = str(function["error"] or "").startswith("no worker can ever hold")
                    _fail(f"{name} failed to start: {function['error']}\n       " + (
                        "change its resources, or add a worker that has them, then deploy it again" if placed
                        else f"see `dilu logs {name}` for the full output"))
                if time.monotonic() > deadline:
                    _fail(f"{name} was not ready within {timeout:g}s")
                if function["status"] == "profiling":
                    trials = (function.get("profile") or {}).get("trials", 0)
                    status.update(f"profiling {name}: {trials} trial(s) so far")
                else:
                    status.update(f"starting {name}: {function['starting_instances']} instance(s) loading")
                time.sleep(0.25)
    except CliError as exc:
        _fail(str(exc))
    profile = function.get("profile") or {}
    if profile.get("status") == "done":
        out.print(f"profiled: compute request {profile['sm_request']:g}, limit {profile['sm_limit']:g}, "
                  f"batch {profile['batch']} ({profile['trials']} trials)", highlight=False)
        if profile.get("batch_note"):
            out.print(f"  {profile['batch_note']}", highlight=False)
        if not profile.get("meets_slo", True):
            err.print(styled("warning", "yellow", f": no share meets the SLO; {name} runs on the whole device"))
    elif profile.get("status") == "failed":
        err.print(styled("warning", "yellow", f": profiling did not run ({profile.get('error')}); "
                                              "deployed with the default slice"))
    out.print(styled("ready", "green", f": {name}  ->  POST {function['invoke_url']}"))


@app.command("ls")
def list_functions(output: OutputOption = Output.table) -> None:
    """List functions."""
    functions = every_item("/v1/functions")
    if output is Output.json:
        return print_json(functions)
    table = Table("NAME", "VERSION", "STATUS", "READY", "STARTING", "REQUESTS", "CLASS")
    for f in functions:
        table.add_row(f["name"], str(f["version"]), f["status"], str(f["ready_instances"]),
                      str(f["starting_instances"]), str(f["requests_total"]), f["spec"]["class"])
    out.print(table)


@app.command()
def describe(name: str, output: OutputOption = Output.table) -> None:
    """Show a function: spec, status, instances and recent scaling events."""
    client = _client()
    try:
        function = client.json("GET", f"/v1/functions/{name}")
        instances = client.json("GET", f"/v1/functions/{name}/instances")
        events = client.json("GET", f"/v1/functions/{name}/events", params={"limit": 10})
    except CliError as exc:
        _fail(str(exc))
    if output is Output.json:
        return print_json({"function": function, "instances": instances, "events": events})
    out.print(styled(function["name"], "bold", f"  version {function['version']}  status {function['status']}"))
    if function["error"]:
        out.print(f"error: {function['error']}", highlight=False)
    out.print(f"invoke: POST {function['invoke_url']}", highlight=False)
    code = function.get("bundle") or function["spec"].get("image") or function["source_dir"]
    out.print(f"requests: {function['requests_total']}   code: {code}", highlight=False)
    profile = function.get("profile")
    if profile:
        if profile["status"] == "done":
            unit = "units/s of progress" if profile.get("kind") == "training" else "req/s"
            latency = "" if profile.get("kind") == "training" else f", p99 {profile['latency_ms']} ms"
            out.print(f"profile: request {profile['sm_request']:g}, limit {profile['sm_limit']:g}, batch "
                      f"{profile['batch']}, {profile['throughput_per_s']:.1f} {unit} per instance{latency}, "
                      f"{profile['trials']} trials", highlight=False)
            if profile.get("batch_note"):
                out.print(f"  {profile['batch_note']}", highlight=False)
        else:
            out.print(f"profile: {profile['status']} ({profile['trials']} trials)"
                      + (f": {profile['error']}" if profile.get("error") else ""), highlight=False)
    loading = function.get("loading") or {}
    if loading:
        parts = ", ".join(f"{stage} {loading[stage]['mean_s']:.2f}s" for stage in loading)
        starts = max(entry["samples"] for entry in loading.values())
        total = sum(entry["mean_s"] for entry in loading.values())
        out.print(f"loading: {total:.2f}s ({parts}; mean of {starts} start(s))", highlight=False)
    streams = function.get("streams")
    if streams:
        gap = "" if streams["chunk_gap_p50_ms"] is None else (
            f", between chunks p50 {streams['chunk_gap_p50_ms']:g} ms (p99 {streams['chunk_gap_p99_ms']:g})")
        out.print(f"streams: first chunk p50 {streams['first_chunk_p50_ms']:g} ms (p99 "
                  f"{streams['first_chunk_p99_ms']:g}){gap}; this gateway, last {streams['window_s']:g} s",
                  highlight=False)
    out.print_json(json.dumps(function["spec"]))
    table = Table("INSTANCE", "WORKER", "VERSION", "STATE", "ENDPOINT", "SLICE", "GRANTED", "USED", "KLC",
                  "HELD", "PROGRESS")
    for i in instances:
        view = i.get("telemetry") or {}
        slice_text = f"{i['sm_request']:g}/{i['sm_limit']:g}" if i.get("sm_limit") is not None else "-"

        def number(key: str, fmt: str, view: dict = view) -> str:
            return format(view[key], fmt) if view.get(key) is not None else "-"

        table.add_row(i["id"], i["worker_id"], str(i["version"]), i["state"], i["endpoint"] or "-", slice_text,
                      number("granted_share", ".2f"), number("used_share", ".2f"),
                      f"{view['klc_ms']:g} ms" if view.get("klc_ms") is not None else "-",
                      f"{view['held_ms']:.0f} ms" if view.get("held_ms") else "-",   # batch work held for latency work
                      f"{view['progress_per_s']:.1f}/s" if view.get("progress_per_s") is not None else "-")
    out.print(table)
    for note in telemetry_notes(function["spec"].get("class", "latency"), instances):
        out.print(f"  {note}", highlight=False)
    for e in events:
        out.print(f"{e['at']}  {e['action']:<14} {e['reason']}", highlight=False)


@app.command()
def invoke(
    name: str,
    data: Annotated[str, typer.Option("--data", "-d", help="JSON text, or @file to read it from a file")] = "{}",
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the answer (streams: for each chunk)")] = 300.0,
    stream: Annotated[bool, typer.Option("--stream", help="A streaming function's chunks, one JSON line each, "
                                                          "as they are made")] = False,
) -> None:
    """Invoke a function with one JSON input and print its JSON result."""
    data = json_input(data)
    if stream:
        return _invoke_streaming(name, data, timeout)
    try:
        response = _client(timeout).request("POST", f"/v1/functions/{name}/invoke", content=data.encode(),
                                            headers={"content-type": "application/json"})
    except CliError as exc:
        _fail(str(exc))
    sys.stdout.write(response.text + "\n")


def _invoke_streaming(name: str, data: str, timeout: float) -> None:
    """Prints each chunk as it comes; a failed or cut stream ends the command with exit status 1
    after the chunks it did send, so a partial answer never passes for a whole one."""
    from cli.stream import Chunk, Failed, Finished, failure_message, read_frame

    chunks, ending = 0, None
    try:
        for line in _client(timeout).lines("POST", f"/v1/functions/{name}/invoke", content=data.encode(),
                                           headers={"content-type": "application/json",
                                                    "accept": "application/x-ndjson"}):
            frame = read_frame(line)
            if isinstance(frame, Chunk):
                chunks += 1
                sys.stdout.write(json.dumps(frame.value, ensure_ascii=False) + "\n")
                sys.stdout.flush()
                continue
            ending = frame
            break
    except CliError as exc:
        _fail(str(exc))
    if not isinstance(ending, Finished):
        _fail(failure_message(ending if isinstance(ending, Failed) else None, chunks))


@app.command()
def init(
    name: Annotated[str, typer.Argument(help="The function's name (its URL segment)")],
    directory: Annotated[Path | None, typer.Option("--dir", help="Where to write it (default: ./NAME)")] = None,
) -> None:
    """Start a function of your own: a folder with handler.py, model.yaml and request.json."""
    from cli.scaffold import ScaffoldError, write_scaffold

    folder = directory or Path(name)
    try:
        written = write_scaffold(name, folder)
    except ScaffoldError as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(f"cannot write {folder}: {exc.strerror or exc}")
    out.print(f"wrote {', '.join(str(path) for path in written)}", highlight=False)
    out.print(f"next: dilu deploy {folder / 'model.yaml'} && dilu invoke {name} --data @{folder / 'request.json'}",
              highlight=False, soft_wrap=True)


@app.command()
def logs(
    name: str,
    tail: Annotated[int, typer.Option(help="Lines per instance")] = 100,
    instances: Annotated[int, typer.Option(help="How many of the newest instances")] = 3,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines until Ctrl-C")] = False,
) -> None:
    """Print the logs of a function's newest instances (failed ones included)."""
    result = call("GET", f"/v1/functions/{name}/logs", params={"tail": tail, "instances": instances})
    if not result["instances"] and not follow:
        out.print(f"{name} has no instances yet")
    seen: dict[str, list[str]] = {}
    for item in result["instances"]:
        out.print(f"==> {item['instance']} ({item['state']}) <==", highlight=False, style="bold")
        if item["error"]:
            out.print(f"error: {item['error']}", highlight=False)
        sys.stdout.write(item["log"].rstrip("\n") + "\n")
        sys.stdout.flush()
        seen[item["instance"]] = item["log"].splitlines()
    if follow:
        _follow(name, instances, seen)


def _follow(name: str, instances: int, seen: dict[str, list[str]]) -> None:
    """Polls the logs once a second and prints what is new, each instance's under its name."""
    from cli.follow import new_lines

    last = None
    try:
        while True:
            time.sleep(FOLLOW_POLL_S)
            result = call("GET", f"/v1/functions/{name}/logs", params={"tail": FOLLOW_TAIL, "instances": instances})
            for item in result["instances"]:
                current = item["log"].splitlines()
                fresh = new_lines(seen.get(item["instance"], []), current)
                seen[item["instance"]] = current
                if not fresh:
                    continue
                if item["instance"] != last:
                    out.print(f"==> {item['instance']} ({item['state']}) <==", highlight=False, style="bold")
                    last = item["instance"]
                sys.stdout.write("\n".join(fresh) + "\n")
                sys.stdout.flush()
    except KeyboardInterrupt:
        return


@app.command()
def rm(name: str) -> None:
    """Delete a function and stop its instances."""
    call("DELETE", f"/v1/functions/{name}")
    out.print(f"deleted {name}")


@app.command()
def scale(
    name: str,
    sm_request: Annotated[float, typer.Option(help="Guaranteed compute share, 0-1")],
    sm_limit: Annotated[float, typer.Option(help="Burst compute share, 0-1, >= --sm-request")],
) -> None:
    """Vertical scaling: resize the GPU compute slice of a function's running instances."""
    call("PATCH", f"/v1/functions/{name}/slice",
         json={"sm_request": sm_request, "sm_limit": sm_limit})
    out.print(f"{name}: compute slice request {sm_request:g}, limit {sm_limit:g} "
              "(running instances resize within milliseconds)", highlight=False)


@app.command()
def events(name: str, limit: Annotated[int, typer.Option()] = 50, output: OutputOption = Output.table) -> None:
    """Scaling decisions for a function, with their reasons."""
    items = call("GET", f"/v1/functions/{name}/events", params={"limit": limit})
    if output is Output.json:
        return print_json(items)
    for e in items:
        out.print(f"{e['at']}  {e['action']:<14} {e['reason']}", highlight=False)


@keys_app.command("create")
def keys_create(
    name: Annotated[str, typer.Argument(help="Who or what the key is for")],
    scope: Annotated[list[str], typer.Option("--scope", "-s", help="admin, read, invoke or invoke:<function>; "
                                                                   "repeatable")],
) -> None:
    """Create a key and print it (this once: only its hash is stored)."""
    created = call("POST", "/v1/keys", json={"name": name, "scopes": scope})
    out.print(created["key"], highlight=False, soft_wrap=True)
    err.print(f"key {created['id']} ({', '.join(created['scopes'])}): keep it, it is not shown again; "
              "use it with DILU_API_KEY", highlight=False)


@keys_app.command("ls")
def keys_ls(output: OutputOption = Output.table) -> None:
    """Active keys (ids, names, scopes; never the keys)."""
    keys = call("GET", "/v1/keys")
    if output is Output.json:
        return print_json(keys)
    table = Table("ID", "NAME", "SCOPES", "CREATED")
    for key in keys:
        table.add_row(key["id"], key["name"], ", ".join(key["scopes"]), key["created_at"][:19])
    out.print(table)


@keys_app.command("reopen")
def keys_reopen(
    yes: Annotated[bool, typer.Option("--yes", help="Confirm: anyone on this machine may then deploy code")] = False,
) -> None:
    """Open a platform whose keys were all revoked again (on its database, not over the API:
    only who can reach the database can do it). A gateway on a non-loopback address stays closed."""
    from sqlalchemy.exc import SQLAlchemyError

    from dilu.config import CommonSettings
    from dilu.db import repo
    from dilu.db.engine import make_engine, make_session_factory

    if not yes:
        _fail("reopening lets anyone on this machine deploy and run code: repeat with --yes")
    url = CommonSettings().effective_database_url
    engine = make_engine(url)
    try:
        with make_session_factory(engine)() as session:
            forgotten = repo.forget_revoked_keys(session=session)
    except ValueError as exc:
        _fail(str(exc))
    except SQLAlchemyError as exc:
        _fail(f"cannot reach the database at {url.split('@')[-1]}: {type(exc).__name__}")
    finally:
        engine.dispose()
    out.print(f"forgot {forgotten} revoked key(s): gateways on loopback addresses are open again "
              "within their key refresh")


@keys_app.command("revoke")
def keys_revoke(key_id: Annotated[str, typer.Argument(help="The key's id (dilu keys ls)")]) -> None:
    """Revoke a key at once."""
    call("DELETE", f"/v1/keys/{key_id}")
    out.print(f"revoked {key_id}", highlight=False)


@app.command()
def status(output: OutputOption = Output.table) -> None:
    """Platform status: workers, devices, functions, instances."""
    info: dict[str, Any] = call("GET", "/v1/status")
    if output is Output.json:
        return print_json(info)
    out.print(f"gateway {info['gateway']}   database {info['database']}   state {info['state_store']}",
              highlight=False)
    controller = info.get("controller") or {}
    out.print(f"controller: {controller['leader']} leads (term {controller['term']}, for "
              f"{controller['leading_for_s']:.0f} s)" if controller.get("leader") else
              "controller: none leads now (nothing is placed, scaled or recovered until one does)", highlight=False)
    table = Table("WORKER", "STATE", "DEVICE", "MEMORY", "INSTANCES", "RUNTIME POOL")
    for w in info["workers"]:
        pool = w.get("runtime_pool")
        pool_text = "-" if not pool else (
            f"{pool['spares']} ready (target {pool['target']}, {pool['min']}-{pool['max']})"
            + (f", {'+'.join(pool['preloaded'])} imported" if pool["preloaded"] else ""))
        table.add_row(w["id"], w["state"], f"{w['device']} ({w['device_name']})",
                      f"{w['memory_bytes'] / 2**30:.1f} GiB", str(w["instances"]), pool_text)
    out.print(table)
    for w in info["workers"]:
        manager = w.get("token_manager")
        if manager:
            jitter = manager.get("jitter_ms") or {}
            out.print(f"token manager of {w['id']} (its own {manager.get('runs_in', '?')}): periods began late by "
                      f"p50 {jitter.get('p50', 0):.2f} / p99 {jitter.get('p99', 0):.2f} / "
                      f"max {jitter.get('max', 0):.2f} ms"
                      f" lately; gaps past the shims' limit (gates opened): {manager.get('stale_gaps', 0)}",
                      highlight=False)
    by_status = ", ".join(f"{k}: {v}" for k, v in info["functions"]["by_status"].items()) or "none"
    out.print(f"functions: {info['functions']['total']} ({by_status})   instances: {info['instances']}",
              highlight=False)


@spec_app.command("schema")
def spec_schema() -> None:
    """Print the JSON schema of model.yaml."""
    from dilu.spec import json_schema

    sys.stdout.write(json.dumps(json_schema(), indent=2) + "\n")


@spec_app.command("check")
def spec_check(file: Path) -> None:
    """Validate a model.yaml locally (field errors name the line)."""
    from cli.artifacts import weights_digested
    from dilu.source import check_handler_source
    from dilu.spec import SpecError, make_spec

    try:
        # A weights file the spec names is checked as dilu deploy checks it, without sending it.
        text, _, _ = weights_digested(file.read_text(encoding="utf-8"), file.resolve().parent)
        spec = make_spec(text)
        check_handler_source(file.resolve().parent, spec.handler)
    except FileNotFoundError:
        _fail(f"{file}: no such file")
    except (SpecError, CliError) as exc:
        _fail(f"{file}: {exc}")
    out.print(f"{file}: ok ({spec.name})", highlight=False)


def main() -> None:
    from pydantic import ValidationError

    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
    except ValidationError as exc:
        if not exc.title.endswith("Settings"):
            raise
        # A DILU_* variable out of its range: name it, as a command's own errors do.
        problems = "; ".join(f"DILU_{'_'.join(map(str, e['loc'])).upper()}={e.get('input')!r}: {e['msg']}"
                             for e in exc.errors())
        err.print(styled("error:", "red", f" invalid setting: {problems}"), soft_wrap=True)
        sys.exit(2)
