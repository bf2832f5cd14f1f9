"""Both example workflows through the real platform under four loading policies, side by side.

    python bench/workflows.py [--requests 6] [--gap 4] [--workflows amber-alert,fan-in] [--price 0.01]
                               [--policies warm,cold,eager,on-demand,slack]

Requests arrive every ``--gap`` seconds; every function keeps an instance 1 s after its last
request (its own keep-alive), so between requests everything not held otherwise unloads and each
request meets cold nodes. Policies: `cold` (a node starts from nothing when reached: no runtime
pool, nothing loaded ahead), `eager` (every cold node starts loading when the request arrives),
`on-demand` (a node loads when reached), `slack` (a node loads just in time for when it is needed,
and each node is held or released by the per-node keep-alive rule), the last three from the
runtime pool; beside `warm` (every function kept running: the latency to match). Each policy
runs on a platform of its own, after ``--warmup`` requests, so none inherits what the gateway
learnt of the functions' loads under another. The AMBER
workflow's requests ask for a translation one time in three (its last node is a branch). Prints
median and p99 end-to-end latency and the memory held (instance-seconds x memory, over the span
of the measured requests, per request) for each, and the two targets: slack within 1.3x of
warm's median, with at most half of eager's memory-time; and how long the slack policy's nodes
stay loaded after their request's answer (the control plane's share of their memory-time). The
pool's spares (interpreters with torch imported, shared by all functions) are not counted: the
three pool policies hold the same.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dilu.controller.reconciler import KEEP_ENDED_INSTANCES
from tests.platform import Platform  # reuses the harness that runs `dilu up`

EXAMPLES = ROOT / "examples" / "workflows"
WORKFLOWS = ("amber-alert", "fan-in")
POLICIES = ("warm", "cold", "eager", "on-demand", "slack")
MiB = 2**20


def _prepare(folder: Path, keep_alive_s: int, min_instances: int) -> Path:
    copy = shutil.copytree(EXAMPLES, folder)
    for spec in copy.glob("*/*/*.yaml"):     # every function's spec (the workflows are one level up)
        text = spec.read_text().replace("keep_alive_s: 120", f"keep_alive_s: {keep_alive_s}")
        spec.write_text(text.replace("min_instances: 0", f"min_instances: {min_instances}"))
    return copy


def _deploy(platform: Platform, folder: Path, loading: str) -> dict[str, list[str]]:
    functions = {}
    for workflow in WORKFLOWS:
        for spec in sorted((folder / workflow).glob("*/*.yaml")):
            done = platform.cli("deploy", "--local", str(spec))
            assert done.returncode == 0, done.stderr
        text = (folder / workflow / "workflow.yaml").read_text() + f"loading: {loading}\n"
        reply = platform.http.post("/v1/workflows", json={"yaml": text})
        assert reply.status_code in (200, 201), reply.text
        functions[workflow] = [node["function"] for node in reply.json()["spec"]["nodes"]]
    return functions


def _set_loading(platform: Platform, folder: Path, loading: str) -> None:
    for workflow in WORKFLOWS:
        text = (folder / workflow / "workflow.yaml").read_text() + f"loading: {loading}\n"
        assert platform.http.post("/v1/workflows", json={"yaml": text}).status_code == 200


def _memory_of(platform: Platform, function: str) -> int:
    spec = platform.function(function)["spec"]
    return int(spec["resources"]["memory"])


def _memory_seconds(platform: Platform, functions: list[str], since: float, until: float) -> float:
    """Instance-seconds x memory (in MiB-seconds) of the functions' instances within [since, until]."""
    total = 0.0
    for function in set(functions):
        memory = _memory_of(platform, function) / MiB
        for row in platform.http.get(f"/v1/functions/{function}/instances", params={"all": "true"}).json():
            start = datetime.fromisoformat(row["created_at"]).timestamp()
            end = datetime.fromisoformat(row["ended_at"]).timestamp() if row["ended_at"] else until
            total += max(0.0, min(end, until) - max(start, since)) * memory
    return total


def _unload_lags(platform: Platform, functions: list[str], answers: list[float], since: float,
                 until: float) -> list[float]:
    """For each instance that ended within [since, until]: how long after the latest answer of
    the workflow before its end it ended (what a node stays loaded once its request is done)."""
    lags = []
    for function in set(functions):
        for row in platform.http.get(f"/v1/functions/{function}/instances", params={"all": "true"}).json():
            if not row["ended_at"]:
                continue
            end = datetime.fromisoformat(row["ended_at"]).timestamp()
            before = [answer for answer in answers if answer <= end]
            if since <= end <= until and before:
                lags.append(end - max(before))
    return lags


def _request(workflow: str, number: int) -> dict:
    body = json.loads((EXAMPLES / workflow / "request.json").read_text())
    if workflow == "amber-alert":
        body["language"] = "es" if number % 3 == 0 else "en"
    return body


def _run(platform: Platform, functions: dict[str, list[str]], requests: int, gap_s: float) -> dict:
    """``requests`` requests per workflow, one every ``gap_s`` seconds (the workflows interleaved,
    each from its own thread: one workflow's slow request must not delay the other's arrivals)."""
    latencies: dict[str, list[float]] = {w: [] for w in WORKFLOWS}
    answers: dict[str, list[float]] = {w: [] for w in WORKFLOWS}
    began = time.time()

    def send(offset: int, workflow: str) -> None:
        with httpx.Client(base_url=platform.url, timeout=120) as http:
            for number in range(requests):
                arrival = began + number * gap_s + offset * gap_s / len(WORKFLOWS)
                time.sleep(max(0.0, arrival - time.time()))     # the arrival process, not a wait for state
                started = time.time()
                reply = http.post(f"/v1/workflows/{workflow}/invoke", json=_request(workflow, number))
                latencies[workflow].append(time.time() - started)
                answers[workflow].append(time.time())
                assert reply.status_code == 200, reply.text

    with ThreadPoolExecutor(len(WORKFLOWS)) as senders:
        for done in [senders.submit(send, offset, workflow) for offset, workflow in enumerate(WORKFLOWS)]:
            done.result()
    until = began + requests * gap_s
    time.sleep(max(0.0, until - time.time()))
    results = {}
    for workflow in WORKFLOWS:
        ordered = sorted(latencies[workflow])
        results[workflow] = {"median_s": statistics.median(ordered),
                             "p99_s": _quantile(ordered, 0.99),
                             "memory_mib_s": _memory_seconds(platform, functions[workflow], began, until) / requests,
                             "unload_lag_s": _unload_lags(platform, functions[workflow], answers[workflow], began,
                                                          until)}
    return results


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> None:
    global WORKFLOWS
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=6, help="measured requests per workflow and policy")
    parser.add_argument("--gap", type=float, default=4.0, help="seconds between a workflow's requests")
    parser.add_argument("--warmup", type=int, default=3, help="requests before measuring (estimates, history)")
    parser.add_argument("--price", type=float, default=None,
                        help="DILU_WORKFLOW_MEMORY_PRICE for the slack policy's per-node keep-alive (default 0.01)")
    parser.add_argument("--workflows", default=",".join(WORKFLOWS),
                        help="which example workflows (comma-separated; together they interleave)")
    parser.add_argument("--policies", default=",".join(POLICIES),
                        help="which policies (comma-separated; warm, eager and slack give the targets)")
    args = parser.parse_args()
    WORKFLOWS = tuple(w for w in args.workflows.split(",") if w)
    unknown = set(WORKFLOWS) - {p.name for p in EXAMPLES.iterdir() if (p / "workflow.yaml").exists()}
    if unknown or not WORKFLOWS:
        parser.error(f"unknown workflows: {', '.join(sorted(unknown)) or '(none given)'}")
    if args.requests + args.warmup > KEEP_ENDED_INSTANCES - 2:
        parser.error(f"--requests plus --warmup at most {KEEP_ENDED_INSTANCES - 2}: memory-time is read from the "
                     f"instances the controller keeps ({KEEP_ENDED_INSTANCES} ended per function)")
    chosen = [p for p in args.policies.split(",") if p]
    if not chosen or set(chosen) - set(POLICIES):
        parser.error(f"unknown policies: {', '.join(sorted(set(chosen) - set(POLICIES))) or '(none given)'}; "
                     f"known: {', '.join(POLICIES)}")
    base = Path(tempfile.mkdtemp(prefix="dilu-bench-workflows-"))
    # Fixed keep-alive (the histogram would learn the bench's rhythm and pre-warm on its own).
    common = {"DILU_PROFILING": "false", "DILU_KEEPALIVE_MIN_SAMPLES": "1000", "DILU_LOCAL_ROOTS": str(base),
              **({"DILU_WORKFLOW_MEMORY_PRICE": str(args.price)} if args.price is not None else {})}
    pool = {"DILU_SPARE_PRELOAD": "torch", "DILU_SPARE_PROCESSES": "2", "DILU_SPARE_MAX": "6"}
    table: dict[str, dict] = {}
    decisions: dict[str, str] = {}     # the per-node keep verdicts after the slack runs

    def measure(home: str, folder: Path, env: dict, policies: tuple[str, ...]) -> None:
        platform = Platform(base / home, env={**common, **env})
        try:
            functions = _deploy(platform, folder, "on-demand")
            for policy in policies:
                _set_loading(platform, folder, "on-demand" if policy in ("warm", "cold") else policy)
                _run(platform, functions, args.warmup, args.gap)    # estimates, branch and gap history
                table[policy] = _run(platform, functions, args.requests, args.gap)
                print(f"measured {policy}", file=sys.stderr, flush=True)
                if policy == "slack":
                    for workflow in WORKFLOWS:
                        keep = platform.http.get(f"/v1/workflows/{workflow}").json()["keep"]
                        decisions[workflow] = ", ".join(f"{n} {d['verdict']} ({d['exposed_s']:.3f} s)"
                                                        for n, d in keep.items())
        finally:
            platform.close()

    if "warm" in chosen:
        measure("warm-home", _prepare(base / "warm", keep_alive_s=600, min_instances=1), pool, ("warm",))
    folder = _prepare(base / "cold", keep_alive_s=1, min_instances=0)
    if "cold" in chosen:
        measure("no-pool-home", folder, {"DILU_SPARE_PROCESSES": "0", "DILU_SPARE_MAX": "0"}, ("cold",))
    for policy in (p for p in ("eager", "on-demand", "slack") if p in chosen):
        # A platform of its own per policy: what the gateway learnt under another (how long
        # loads take when every node loads at once, say) must not carry over into this one.
        measure(f"{policy}-home", folder, pool, (policy,))

    print(f"{args.requests} requests per workflow and policy, one every {args.gap:g} s; "
          "latency end to end, memory-time per request")
    print(f"{'policy':<11}" + "".join(f"{w + ' median':>20}{'p99':>9}{'MiB-s':>10}" for w in WORKFLOWS))
    for policy in (p for p in POLICIES if p in table):
        row = table[policy]
        print(f"{policy:<11}" + "".join(f"{row[w]['median_s'] * 1000:>18.0f}ms{row[w]['p99_s'] * 1000:>7.0f}ms"
                                        f"{row[w]['memory_mib_s']:>10.0f}" for w in WORKFLOWS))
    if "slack" in table:
        print("slack: a node unloads this long after its request's answer (median, p90 of its instances): " + "; ".join(
            f"{w} {_quantile(table['slack'][w]['unload_lag_s'], 0.5) * 1000:.0f} / "
            f"{_quantile(table['slack'][w]['unload_lag_s'], 0.9) * 1000:.0f} ms" for w in WORKFLOWS))
    for workflow, kept in decisions.items():
        print(f"{workflow} slack keep verdicts (exposure): {kept}")
    for workflow in WORKFLOWS if {"warm", "eager", "slack"} <= set(table) else ():
        latency = table["slack"][workflow]["median_s"] / table["warm"][workflow]["median_s"]
        memory = table["slack"][workflow]["memory_mib_s"] / table["eager"][workflow]["memory_mib_s"]
        print(f"{workflow}: slack median {latency:.2f}x warm "
              f"(target <= 1.3x: {'met' if latency <= 1.3 else 'NOT met'}); "
              f"slack memory {memory:.2f}x eager (target <= 0.5x: {'met' if memory <= 0.5 else 'NOT met'})")


if __name__ == "__main__":
    main()
