"""Cold starts, broken into their parts, for a no-op function and a small PyTorch function.

Starts `dilu up` (embedded default, child process), deploys both functions scaled to zero, and
for each of ``--rounds`` rounds waits until the function has no instance, then times one request
from send to reply. Its parts come from the instance row (created when the controller placed it)
and the instance's start-up marks (``/health``):

  placement   request sent -> instance row created (demand event, controller pass, scheduler)
  spawn       row created -> instance process created (worker start call, fork/exec)
  runtime     process created -> instance server serving (interpreter, Dilu's imports, HTTP server)
  imports     the handler module imported (torch, for the PyTorch function)
  load        the handler's load()
  routing     load done -> first request reaches predict (health probe, controller, routes, gateway)
  predict     the first predict() (in-instance time of the first request)

The platform's own part is everything but imports, load and predict. The worker's spare
process (started ahead, instance server imported; torch too, for a function that imports it,
once one has run on the worker) takes each CPU cold start;
``DILU_SPARE_PROCESSES=0`` (``--no-spares``) measures fresh processes instead. Beside them, the same
benchmark runs ``python -c "import torch"`` to show what importing torch costs on this machine.

Before the measured rounds each function has one cold start of its own, unmeasured: the first
torch function to run on a worker starts the pool of spares that preload torch. The platform's
memory (the `dilu up` process and all below it, RSS and PSS) is printed once the no-op function
is deployed and has run, and again once the torch function is too: what the spares that preload
torch cost, beside the cold starts they buy.

    python bench/cold_start.py [--rounds 3] [--no-spares] [--against TREE]

``--against TREE`` runs a second platform from another checkout of Dilu (a commit before a
change: ``git worktree add /tmp/before <commit>``) beside this one, the cold starts alternating
between the two, and prints the difference part by part: what the change costs a start.

Targets: the platform's part at most 150 ms; a PyTorch function's cold start at most 1.5 x
(import + load).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.process_memory import settled_memory_mib
from tests.platform import Platform  # reuses the harness that runs `dilu up`
from tests.waiting import eventually

FUNCTIONS = {
    "noop": (ROOT / "examples" / "echo", "handler:Echo", {"hello": "dilu"}),
    "tiny-torch": (ROOT / "bench" / "functions" / "tiny_torch", "handler:TinyMlp", {"x": [0.1] * 64}),
}
SPEC = ("name: {name}\nhandler: {handler}\nresources:\n  memory: 512Mi\n  gpu: false\n  sm_request: 0.1\n"
        "  sm_limit: 0.1\nscaling:\n  min_instances: 0\n  max_instances: 1\n  keep_alive_s: 1\n")
SPACING_S = 1.0
PARTS = ("placement", "spawn", "runtime", "imports", "load", "routing", "predict")


def stamp(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def one_cold_start(platform: Platform, name: str, body: dict) -> dict[str, float]:
    eventually(lambda: not [i for i in platform.instances(name) if i["state"] in ("starting", "ready")],
               timeout=60, interval=0.1, what=f"{name} to scale to zero")
    # The worker keeps one spare process (DILU_SPARE_PROCESSES); the one started behind the last
    # cold start needs about 0.3 s to import. Spacing the cold starts measures each with a spare
    # ready; back to back, the second would wait for it (or start fresh with spares at 0).
    time.sleep(SPACING_S)
    sent = time.time()
    reply = platform.http.post(f"/v1/functions/{name}/invoke", json=body)
    received = time.time()
    assert reply.status_code == 200, reply.text
    assert "x-dilu-queued-ms" in reply.headers, "the request did not meet a cold start"
    instance = next(i for i in platform.instances(name) if i["id"] == reply.headers["x-dilu-instance"])
    marks = httpx.get(instance["endpoint"] + "/health", timeout=10).json()["startup"]
    predict = float(reply.headers["x-dilu-latency-ms"]) / 1000
    parts = {
        "placement": stamp(instance["created_at"]) - sent,
        "spawn": marks["process_start"] - stamp(instance["created_at"]),
        "runtime": marks["serving"] - marks["process_start"],
        "imports": marks["handler_imported"] - marks["serving"],
        "load": marks["loaded"] - marks["handler_imported"],
        "routing": (received - predict) - marks["loaded"],
        "predict": predict,
        "total": received - sent,
    }
    parts["platform"] = parts["total"] - parts["imports"] - parts["load"] - parts["predict"]
    return parts


def import_torch_s(rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def start_platform(home: Path, no_spares: bool, tree: Path | None) -> Platform:
    """A platform, from ``tree`` when given."""
    # The production default, which the test harness turns off: spares may preload torch.
    env = {"DILU_SPARE_PRELOAD": "torch", **({"DILU_SPARE_PROCESSES": "0"} if no_spares else {})}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)      # its dilu, gateway and worker packages, and its instances'
    return Platform(home / "home", env=env)


def deploy(platform: Platform, home: Path, name: str) -> None:
    """Deploys one of FUNCTIONS, scaled to zero."""
    folder, handler, _ = FUNCTIONS[name]
    source = shutil.copytree(folder, home / name)
    (source / "model.yaml").write_text(SPEC.format(name=name, handler=handler))
    assert platform.deploy_file(source / "model.yaml").status_code == 201
    platform.wait_ready(name)


def print_medians(title: str, results: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    columns = PARTS + ("total", "platform")
    print(title)
    print(f"{'function':<12} " + " ".join(f"{c:>9}" for c in columns))
    medians = {}
    for name, runs in results.items():
        medians[name] = {c: statistics.median(r[c] for r in runs) for c in columns}
        print(f"{name:<12} " + " ".join(f"{medians[name][c] * 1000:>9.0f}" for c in columns))
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-spares", action="store_true", help="start every instance as a fresh process")
    parser.add_argument("--against", type=Path, help="another checkout of Dilu to run beside this one")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="dilu-coldstart-"))
    (workdir / "this").mkdir()
    platforms = {"this": start_platform(workdir / "this", args.no_spares, None)}
    results: dict[str, dict[str, list[dict[str, float]]]] = {"this": {}}
    try:
        if args.against is not None:
            (workdir / "against").mkdir()
            platforms["against"] = start_platform(workdir / "against", args.no_spares, args.against.resolve())
            results["against"] = {}
        torch_import = import_torch_s(args.rounds)
        memory: dict[str, dict[str, tuple[float, float, int]]] = {}
        for name, (_, _, body) in FUNCTIONS.items():   # deployed one by one; the first start of each unmeasured
            for which, platform in platforms.items():
                deploy(platform, workdir / which, name)
                one_cold_start(platform, name, body)
                memory.setdefault(which, {})[name] = settled_memory_mib(platform.role.process.pid)
        for _ in range(args.rounds):
            for which, platform in platforms.items():     # alternating: both see the same machine
                for name, (_, _, body) in FUNCTIONS.items():
                    results[which].setdefault(name, []).append(one_cold_start(platform, name, body))
    finally:
        for platform in platforms.values():
            platform.close()
        shutil.rmtree(workdir, ignore_errors=True)

    title = f"median of {args.rounds} cold starts, milliseconds (the function's slice is 10 % of the host's CPU)"
    medians = print_medians(title, results["this"])
    if args.against is not None:
        before = print_medians(f"\nthe same, from {args.against}", results["against"])
        print("\nthis checkout minus the other, milliseconds")
        for name in medians:
            print(f"{name:<12} " + " ".join(f"{c} {(medians[name][c] - before[name][c]) * 1000:+.0f}"
                                          for c in ("spawn", "runtime", "platform", "total")))
    print("\nplatform memory (dilu up and every process below it), MiB")
    for which, after in memory.items():
        (rss, pss, count), (torch_rss, torch_pss, torch_count) = after["noop"], after["tiny-torch"]
        print(f"{which:<8} the no-op deployed and run: {rss:.0f} RSS, {pss:.0f} PSS, {count} processes; the torch "
              f"function too: {torch_rss:.0f} RSS, {torch_pss:.0f} PSS, {torch_count} processes "
              f"(+{torch_pss - pss:.0f} PSS)")
    torch_row = medians["tiny-torch"]
    print(f"\npython -c 'import torch' on this machine: {torch_import * 1000:.0f} ms "
          f"(inside the instance: {torch_row['imports'] * 1000:.0f} ms)")
    print(f"platform's part: noop {medians['noop']['platform'] * 1000:.0f} ms, "
          f"tiny-torch {torch_row['platform'] * 1000:.0f} ms (target <= 150 ms)")
    print(f"tiny-torch cold start / (import + load) = "
          f"{torch_row['total'] / (torch_row['imports'] + torch_row['load']):.2f} (target <= 1.5); "
          f"/ (python -c 'import torch' + load) = {torch_row['total'] / (torch_import + torch_row['load']):.2f}")


if __name__ == "__main__":
    main()
