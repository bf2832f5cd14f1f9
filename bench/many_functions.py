"""What an idle catalogue costs: `dilu up` with 1, 100 and 1,000 idle functions (or --levels).

For each level, a fresh `dilu up` (embedded default) gets that many idle functions (scaled to
zero, no traffic: rows written into its database before it starts, as a restarted platform
finds its catalogue, without a start each to prove they load) and one busy function (one instance,
deployed through the API). Then, one after another:

- CPU of the `dilu up` process over --idle-s seconds with nothing to do, in ms per second;
- a page of the function list: `GET /v1/functions?limit=100`, p50 of 10;
- the busy function's warm latency, p50 and p99 of --requests sequential requests;
- cold starts: three idle functions invoked once each (scale from zero), p50;
- deploys through the API (`POST /v1/functions`), p50 and p99 of 5;
- the process's resident memory.

Ratios to the first level (the smallest catalogue) are printed beside each figure.
`--code PATH` runs the platform from another checkout (its code first on PYTHONPATH), to
measure an earlier version beside this one.

    python bench/many_functions.py [--levels 1,100,1000] [--idle-s 10] [--requests 300] [--code PATH]

Targets (issue 33) at 10,000 functions: idle CPU at most 20 ms per second; cold start and deploy
p50 at most 1.2x the 1-function case; warm p99 at most 1.1x; a page of 100 in at most 50 ms.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.platform import Platform  # reuses the test harness that runs `dilu up`

ECHO = ROOT / "examples" / "echo"
IDLE_SPEC = {"handler": "handler:Echo", "resources": {"memory": "64Mi", "gpu": False, "sm_request": 0.05,
                                                      "sm_limit": 0.05},
             "scaling": {"min_instances": 0, "max_instances": 1, "keep_alive_s": 600}}


def write_idle_functions(home: Path, names: list[str]) -> None:
    """Idle functions as rows of the platform's database (ready, scaled to zero), written before
    it starts, as a platform restarted with its catalogue would find them."""
    from dilu.db import repo
    from dilu.db.engine import make_engine, make_session_factory, migrate
    from dilu.spec import spec_from_dict, spec_to_dict

    home.mkdir(parents=True, exist_ok=True)
    migrate(f"sqlite:///{home / 'dilu.db'}")
    engine = make_engine(f"sqlite:///{home / 'dilu.db'}")
    sessions = make_session_factory(engine)
    with sessions() as session:
        for name in names:
            spec = spec_to_dict(spec_from_dict({"name": name, **IDLE_SPEC}))
            repo.upsert_function(session=session, spec=spec, source_dir=str(ECHO))
            repo.set_function_status(session=session, name=name, version=1, status="ready")
    engine.dispose()


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/statm", encoding="ascii") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1000


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def measure(count: int, args: argparse.Namespace, workdir: Path) -> dict[str, float]:
    home = workdir / f"home-{count}"
    env = {"PYTHONPATH": args.code} if args.code else {}
    write_idle_functions(home, [f"idle-{i:05d}" for i in range(count)] + [f"cold-{i}" for i in range(3)])
    platform = Platform(home, env=env)
    try:
        busy = (ECHO / "model.yaml").read_text().replace("name: echo", "name: busy") \
            .replace("min_instances: 0", "min_instances: 1")
        assert platform.deploy_file(ECHO / "model.yaml", busy).status_code == 201
        platform.wait_ready("busy", timeout=300)
        for _ in range(20):
            platform.invoke("busy", {})
        time.sleep(3)   # the deploy's own passes settle
        pid = platform.role.process.pid
        before = cpu_s(pid)
        time.sleep(args.idle_s)
        idle_ms_per_s = (cpu_s(pid) - before) * 1000 / args.idle_s
        page = statistics.median(timed(lambda: platform.http.get("/v1/functions", params={"limit": 100}))
                                 for _ in range(10))
        warm = [timed(lambda: platform.invoke("busy", {})) for _ in range(args.requests)]
        cold = [timed(lambda name=f"cold-{i}": platform.invoke(name, {})) for i in range(3)]
        deploys = []
        for i in range(5):
            text = (ECHO / "model.yaml").read_text().replace("name: echo", f"name: fresh-{i}")
            deploys.append(timed(lambda text=text: platform.deploy_file(ECHO / "model.yaml", text)))
        return {"idle_cpu": idle_ms_per_s, "page": page, "warm_p50": statistics.median(warm), "warm_p99": p99(warm),
                "cold": statistics.median(cold), "deploy_p50": statistics.median(deploys),
                "deploy_p99": p99(deploys), "rss": rss_mib(pid)}
    finally:
        platform.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", default="1,100,1000", help="comma-separated numbers of idle functions")
    parser.add_argument("--idle-s", type=float, default=10.0, help="seconds of idle CPU measured")
    parser.add_argument("--requests", type=int, default=300, help="warm requests to the busy function")
    parser.add_argument("--code", default="", help="run the platform from this checkout instead")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="dilu-bench-"))
    columns = [("idle_cpu", "idle CPU ms/s"), ("page", "page of 100 ms"), ("warm_p50", "warm p50 ms"),
               ("warm_p99", "warm p99 ms"), ("cold", "cold start ms"), ("deploy_p50", "deploy p50 ms"),
               ("deploy_p99", "deploy p99 ms"), ("rss", "memory MiB")]
    print(f"many functions: dilu up{' from ' + args.code if args.code else ''}; each figure, and its ratio to "
          "the first level")
    print(f"{'functions':>9} " + " ".join(f"{title:>20}" for _, title in columns))
    first: dict[str, float] | None = None
    try:
        for count in (int(n) for n in args.levels.split(",")):
            row = measure(count, args, workdir)
            first = first or row
            print(f"{count:>9} " + " ".join(f"{row[key]:>12.2f} ({row[key] / first[key]:>5.2f}x)" if first[key]
                                            else f"{row[key]:>20.2f}" for key, _ in columns), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
