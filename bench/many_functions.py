"""What an idle catalogue costs: 1, 100 and 1,000 idle functions (or --levels), on `dilu up` and
on separate roles (gateway, controller, worker) sharing PostgreSQL and Redis.

For each deployment and level, a fresh platform gets that many idle functions (scaled to zero, no
traffic: rows written into its database before it starts, as a restarted platform finds its
catalogue, without a start each to prove they load) and one busy function (one instance,
deployed through the API). Then, one after another:

- CPU over --idle-s seconds with nothing to do (every function idle for 12 s), in ms per
  second: the controller's (on `dilu up` its thread and that thread's own helpers, where it runs
  beside the workers; on separate roles its process), and all of the platform's (the `dilu up`
  process, or the three roles together);
- a page of the function list: `GET /v1/functions?limit=100`, p50 of 10;
- the busy function's warm latency, p50 and p99 of --requests sequential requests;
- cold starts: COLD_STARTS (9) idle functions invoked once each (scale from zero), p50;
- deploys through the API (`POST /v1/functions`), p50 and p99 of DEPLOYS (15);
- resident memory of each process (`dilu up`; or gateway, controller and worker).

Ratios to the first level (the smallest catalogue) are printed beside each figure.
`--code PATH` runs the platform from another checkout (its code first on PYTHONPATH), to
measure an earlier version beside this one.

    python bench/many_functions.py [--levels 1,100,1000] [--deployments up,roles] [--idle-s 10]
                                   [--requests 1000] [--code PATH]

Separate roles need PostgreSQL (DILU_TEST_POSTGRES, by default postgresql://postgres@127.0.0.1:5432/test,
where each level gets a database of its own, dropped after) and Redis (DILU_TEST_REDIS).

Targets (issue 33) at 10,000 functions: controller CPU while idle at most 20 ms per second; cold
start and deploy p50 at most 1.2x the 1-function case; warm p99 at most 1.1x; a page of 100 in at
most 50 ms.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.platform import Platform, Role, dilu_executable, start_role  # the test harness runs the roles

ECHO = ROOT / "examples" / "echo"
IDLE_SPEC = {"handler": "handler:Echo", "resources": {"memory": "64Mi", "gpu": False, "sm_request": 0.05,
                                                      "sm_limit": 0.05},
             "scaling": {"min_instances": 0, "max_instances": 1, "keep_alive_s": 600}}
POSTGRES_ADMIN_URL = os.environ.get("DILU_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("DILU_TEST_REDIS", "redis://127.0.0.1:6379/0")
COLD_STARTS, DEPLOYS = 9, 15   # samples enough for a median on a noisy host
CONTROL_THREAD = "dilu-control"   # what `dilu up` names its controller's threads (cli/roles/control_thread.py)


def write_idle_functions(database_url: str, names: list[str]) -> None:
    """Idle functions as rows of the platform's database (ready, scaled to zero), written before
    it starts, as a platform restarted with its catalogue would find them."""
    from dilu.db import repo
    from dilu.db.engine import make_engine, make_session_factory, migrate
    from dilu.spec import spec_from_dict, spec_to_dict

    migrate(database_url)
    engine = make_engine(database_url)
    with make_session_factory(engine)() as session:
        for name in names:
            spec = spec_to_dict(spec_from_dict({"name": name, **IDLE_SPEC}))
            repo.upsert_function(session=session, spec=spec, source_dir=str(ECHO))
            repo.set_function_status(session=session, name=name, version=1, status="ready")
    engine.dispose()


def cpu_s(pid: int, task: int | None = None) -> float:
    path = f"/proc/{pid}/stat" if task is None else f"/proc/{pid}/task/{task}/stat"
    with open(path, encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def named_threads_cpu_s(pid: int, name: str) -> float:
    """CPU of the threads of ``pid`` the OS knows by ``name`` (those that ended are not counted)."""
    total = 0.0
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError):
            with open(f"/proc/{pid}/task/{task}/comm", encoding="utf-8") as handle:
                if handle.read().strip() == name:
                    total += cpu_s(pid, int(task))
    return total


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/statm", encoding="ascii") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@dataclass
class Deployment:
    """A running platform: its gateway, and its processes by role."""

    http: httpx.Client
    pids: dict[str, int]
    controller_cpu: Callable[[], float]
    stop: list[Callable[[], object]] = field(default_factory=list)

    def platform_cpu(self) -> float:
        return sum(cpu_s(pid) for pid in self.pids.values())


@contextlib.contextmanager
def embedded(count: int, args: argparse.Namespace, workdir: Path) -> Iterator[Deployment]:
    home = workdir / f"home-{count}"
    home.mkdir(parents=True)
    write_idle_functions(f"sqlite:///{home / 'dilu.db'}", idle_names(count))
    platform = Platform(home, env={"PYTHONPATH": args.code} if args.code else {})
    pid = platform.role.process.pid
    try:
        yield Deployment(platform.http, {"dilu up": pid}, lambda: named_threads_cpu_s(pid, CONTROL_THREAD))
    finally:
        platform.close()


@contextlib.contextmanager
def separate_roles(count: int, args: argparse.Namespace, workdir: Path) -> Iterator[Deployment]:
    from sqlalchemy import create_engine, text

    database = f"dilu_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{database}"'))
    url = POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{database}"
    home = workdir / f"roles-{count}"
    env = {"DILU_DATABASE_URL": url, "DILU_REDIS_URL": REDIS_URL, "DILU_REDIS_PREFIX": f"{database}:",
           "DILU_HOME": str(home), "DILU_PROFILING": "false", "DILU_LOCAL_ROOTS": str(ROOT),
           **({"PYTHONPATH": args.code} if args.code else {})}
    roles: dict[str, Role] = {}
    try:
        write_idle_functions(url, idle_names(count))
        roles["worker"] = start_role(["worker"], {**env, "DILU_PORT": "0"}, workdir / f"worker-{count}.log")
        roles["controller"] = start_role(["controller"], env, workdir / f"controller-{count}.log", wait_for_url=False)
        roles["gateway"] = start_role(["gateway"], {**env, "DILU_PORT": "0"}, workdir / f"gateway-{count}.log")
        controller = roles["controller"].process.pid
        with httpx.Client(base_url=roles["gateway"].url, timeout=120) as http:
            yield Deployment(http, {role: r.process.pid for role, r in roles.items()}, lambda: cpu_s(controller))
    finally:
        for role in reversed(list(roles.values())):
            role.stop()
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
        admin.dispose()
        _forget_redis_keys(f"{database}:")


def _forget_redis_keys(prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(match=prefix + "*"))
    if keys:
        client.delete(*keys)
    client.close()


def idle_names(count: int) -> list[str]:
    return [f"idle-{i:05d}" for i in range(count)] + [f"cold-{i}" for i in range(COLD_STARTS)]


def timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1000


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def deploy(http: httpx.Client, name: str, replace: tuple[str, str] = ("", "")) -> None:
    text = (ECHO / "model.yaml").read_text().replace("name: echo", f"name: {name}").replace(*replace)
    reply = http.post("/v1/functions", json={"yaml": text, "source_dir": str(ECHO)})
    assert reply.status_code == 201, reply.text


def invoke(http: httpx.Client, name: str) -> None:
    reply = http.post(f"/v1/functions/{name}/invoke", json={})
    assert reply.status_code == 200, reply.text


def wait_ready(http: httpx.Client, name: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        function = http.get(f"/v1/functions/{name}").json()
        if function["status"] == "ready" and function["ready_instances"] > 0:
            return
        assert function["status"] != "failed", function["error"]
        time.sleep(0.1)
    raise TimeoutError(f"{name} was not ready within {timeout_s:.0f} s")


def measure(deployment: Deployment, args: argparse.Namespace) -> dict[str, float]:
    http = deployment.http
    deploy(http, "busy", ("min_instances: 0", "min_instances: 1"))
    wait_ready(http, "busy")
    for _ in range(20):
        invoke(http, "busy")
    # All idle: the deploy's own passes settle and the busy function's requests are older than
    # the 10 s the controller still follows as traffic (dilu/policy/visits.py).
    time.sleep(12)
    controller, platform = deployment.controller_cpu(), deployment.platform_cpu()
    time.sleep(args.idle_s)
    row = {"controller_cpu": (deployment.controller_cpu() - controller) * 1000 / args.idle_s,
           "platform_cpu": (deployment.platform_cpu() - platform) * 1000 / args.idle_s}
    row["page"] = statistics.median(timed(lambda: http.get("/v1/functions", params={"limit": 100}))
                                    for _ in range(10))
    warm = [timed(lambda: invoke(http, "busy")) for _ in range(args.requests)]
    cold = [timed(lambda name=f"cold-{i}": invoke(http, name)) for i in range(COLD_STARTS)]
    deploys = [timed(lambda i=i: deploy(http, f"fresh-{i}")) for i in range(DEPLOYS)]
    row.update({"warm_p50": statistics.median(warm), "warm_p99": p99(warm), "cold": statistics.median(cold),
                "deploy_p50": statistics.median(deploys), "deploy_p99": p99(deploys)})
    for role, pid in deployment.pids.items():
        row[f"rss {role}"] = rss_mib(pid)
    return row


COLUMNS = [("controller_cpu", "controller CPU ms/s"), ("platform_cpu", "platform CPU ms/s"),
           ("page", "page of 100 ms"), ("warm_p50", "warm p50 ms"), ("warm_p99", "warm p99 ms"),
           ("cold", "cold start ms"), ("deploy_p50", "deploy p50 ms"), ("deploy_p99", "deploy p99 ms")]
DEPLOYMENTS = {"up": ("dilu up (SQLite, in-process state)", embedded),
               "roles": ("separate roles (PostgreSQL, Redis)", separate_roles)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", default="1,100,1000", help="comma-separated numbers of idle functions")
    parser.add_argument("--deployments", default="up,roles", help="up, roles or both (comma-separated)")
    parser.add_argument("--idle-s", type=float, default=10.0, help="seconds of idle CPU measured")
    parser.add_argument("--requests", type=int, default=1000, help="warm requests to the busy function")
    parser.add_argument("--code", default="", help="run the platform from this checkout instead")
    args = parser.parse_args()
    if not os.path.exists(dilu_executable()):
        sys.exit("dilu is not installed in this environment (pip install -e .)")
    workdir = Path(tempfile.mkdtemp(prefix="dilu-bench-"))
    try:
        for key in args.deployments.split(","):
            title, start = DEPLOYMENTS[key]
            print(f"\nmany functions: {title}{' from ' + args.code if args.code else ''}; each figure, and its "
                  "ratio to the first level")
            first: dict[str, float] | None = None
            for count in (int(n) for n in args.levels.split(",")):
                with start(count, args, workdir) as deployment:
                    row = measure(deployment, args)
                if first is None:
                    first = row
                    memory = [(key, key.removeprefix("rss ") + " MiB") for key in row if key.startswith("rss ")]
                    print(f"{'functions':>9} " + " ".join(f"{title:>20}" for _, title in COLUMNS + memory))
                print(f"{count:>9} " + " ".join(
                    f"{row[key]:>12.2f} ({row[key] / first[key]:>5.2f}x)" if first[key] else f"{row[key]:>20.2f}"
                    for key, _ in COLUMNS + memory), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
