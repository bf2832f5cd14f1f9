"""Load and faults: requests through the gateway while, in turn, a function container is killed,
the worker is killed and restarted, the controller is killed and restarted, Redis is restarted
and PostgreSQL is restarted.

The roles run as separate processes on a private PostgreSQL and a private Redis (child
processes of this benchmark, so they can be restarted), with the docker runtime when a Docker
engine and the runtime image are there (`--runtime process` otherwise). For each fault, one
phase of ``--requests`` requests from ``--clients`` closed-loop clients (loopback only); the
fault strikes when ``--fault-at`` of them are answered, and the killed role is started again at
once, as a supervisor (compose's restart policy, systemd) would. Per fault it prints: requests
sent, answered 2xx, answered with a clear error (4xx/5xx with a JSON error), never answered;
the functions, profiles and code bundles in the database before and after; and the seconds from
the fault until service resumed unattended (the last request answered with an error or later
than 1 s, counted from the fault; 0 when none was), and until the function was back at full
strength (both of its instances ready; a killed one replaced or adopted).

    python bench/faults.py [--requests 10000] [--clients 16] [--faults container,worker,...]
    python bench/faults.py --edges      # the faults at a request's edges (bench/fault_edges.py)

Targets: no request without a reply, nothing lost, recovery within 10 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from sqlalchemy import create_engine, text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loadgen import fixed_count

ROOT = Path(__file__).resolve().parent.parent
FAULTS = ("container", "worker", "controller", "redis", "postgres")
SLOW_S = 1.0
URL_PATTERN = re.compile(r"Dilu (?:gateway|worker) at (http://\S+)")
LOAD_SPEC = """name: echo
handler: handler:Echo
resources: {memory: 256Mi, gpu: false, sm_request: 0.4, sm_limit: 1.0}
scaling: {min_instances: 2, max_instances: 2, keep_alive_s: 600}
batching: {max_batch_size: 8, max_wait_ms: 1}
"""
PROFILED_SPEC = """name: echo-profiled
handler: handler:Echo
resources: {memory: 256Mi, gpu: false}
scaling: {min_instances: 1, max_instances: 1, keep_alive_s: 600}
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


class PrivatePostgres:
    """A PostgreSQL cluster of this benchmark's own (as the postgres user when run as root)."""

    def __init__(self, folder: Path) -> None:
        self.bin = Path(sorted(Path("/usr/lib/postgresql").glob("*/bin"))[-1])
        self.folder, self.port, self.process = folder, free_port(), None
        self.folder.mkdir(parents=True)
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            entry = pwd.getpwnam("postgres")
            os.chown(self.folder, entry.pw_uid, entry.pw_gid)
        subprocess.run([*self.as_user, str(self.bin / "initdb"), "-D", str(self.folder / "data"), "-A", "trust",
                        "-U", "postgres", "-E", "UTF8", "--locale=C"], check=True, capture_output=True)
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [*self.as_user, str(self.bin / "postgres"), "-D", str(self.folder / "data"), "-p", str(self.port),
             "-c", "listen_addresses=127.0.0.1", "-k", str(self.folder)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: socket.create_connection(("127.0.0.1", self.port), 0.5).close() or True, 30,
                   "PostgreSQL")
        wait_until(lambda: subprocess.run([str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                                          capture_output=True).returncode == 0, 30, "PostgreSQL to accept")

    def stop(self) -> None:
        """A fast shutdown (sessions are cut), signalled to the server itself (runuser does not
        pass signals on)."""
        if self.process and self.process.poll() is None:
            pid = int((self.folder / "data" / "postmaster.pid").read_text().split()[0])
            os.kill(pid, signal.SIGINT)
            self.process.wait(30)


class PrivateRedis:
    def __init__(self, folder: Path) -> None:
        self.port, self.folder, self.process = free_port(), folder, None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.folder)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: socket.create_connection(("127.0.0.1", self.port), 0.5).close() or True, 30, "Redis")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


class Role:
    """One `dilu <role>` child process."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.args, self.env, self.log = args, env, log
        self.process: subprocess.Popen | None = None
        self.url: str | None = None

    def start(self, wants_url: bool = True) -> Role:
        dilu = shutil.which("dilu", path=str(Path(sys.executable).parent)) or "dilu"
        self.process = subprocess.Popen([dilu, *self.args], env={**os.environ, **self.env}, text=True,
                                        stdout=subprocess.PIPE, stderr=open(self.log, "a"))
        found = threading.Event()

        def pump() -> None:
            for line in self.process.stdout:
                match = URL_PATTERN.search(line)
                if match:
                    self.url = match.group(1)
                    found.set()

        threading.Thread(target=pump, daemon=True).start()
        if wants_url and not found.wait(60):
            raise SystemExit(f"dilu {' '.join(self.args)} did not start; see {self.log}")
        return self

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(30)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                return -9
        return self.process.returncode


def docker_available() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "image", "inspect", "dilu/runtime-cpu:latest"],
                          capture_output=True).returncode == 0


def durable_counts(url: str) -> dict[str, int]:
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as connection:
            return {table: connection.execute(text(f"select count(*) from {table}")).scalar_one()
                    for table in ("functions", "profiles", "bundles")}
    finally:
        engine.dispose()


def summarize(outcomes: list[tuple[float, float, int]], fault_at: float) -> dict:
    statuses = [status for _, _, status in outcomes]
    affected = [answered for sent, answered, status in outcomes
                if answered >= fault_at and (not 200 <= status < 300 or answered - sent > SLOW_S)]
    return {"sent": len(outcomes), "ok": sum(1 for s in statuses if 200 <= s < 300),
            "error": sum(1 for s in statuses if s >= 400), "none": statuses.count(-1),
            "recovery_s": max(affected) - fault_at if affected else 0.0,
            "max_latency_s": max(answered - sent for sent, answered, _ in outcomes if answered >= fault_at)}


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        self.postgres = PrivatePostgres(work / "pg")
        self.redis = PrivateRedis(work)
        self.runtime = args.runtime or ("docker" if docker_available() else "process")
        self.env = {"DILU_DATABASE_URL": self.postgres.url, "DILU_REDIS_URL": self.redis.url,
                    "DILU_HOME": str(work / "home")}

    def start(self) -> None:
        self.postgres.start()
        self.redis.start()
        subprocess.run([shutil.which("dilu", path=str(Path(sys.executable).parent)) or "dilu", "migrate"],
                       env={**os.environ, **self.env}, check=True, capture_output=True)
        self.worker = Role(["worker"], {**self.env, "DILU_RUNTIME": self.runtime, "DILU_GPUS": "none",
                                        "DILU_PORT": str(free_port()), "DILU_HOME": str(self.work / "worker")},
                           self.work / "worker.log").start()
        self.controller = Role(["controller"], self.env, self.work / "controller.log").start(wants_url=False)
        self.gateway = Role(["gateway"], {**self.env, "DILU_PORT": "0"}, self.work / "gateway.log").start()
        for name, spec in (("echo", LOAD_SPEC), ("echo-profiled", PROFILED_SPEC)):
            folder = self.work / name
            shutil.copytree(ROOT / "examples" / "echo", folder)
            (folder / "model.yaml").write_text(spec)
            (folder / "request.json").write_text('{"ping": 1}')
            deployed = subprocess.run([shutil.which("dilu", path=str(Path(sys.executable).parent)) or "dilu",
                                       "deploy", str(folder / "model.yaml")],
                                      env={**os.environ, **self.env, "DILU_URL": self.gateway.url},
                                      capture_output=True, text=True, timeout=300)
            if deployed.returncode != 0:
                raise SystemExit(f"deploying {name} failed: {deployed.stderr}")
        wait_until(lambda: self.ready_instances("echo") == 2, 60, "two ready echo instances")

    def ready_instances(self, name: str) -> int:
        reply = httpx.get(f"{self.gateway.url}/v1/functions/{name}", timeout=5).json()
        return reply["ready_instances"]

    def inject(self, fault: str) -> None:
        if fault == "container":
            if self.runtime == "docker":
                ids = subprocess.run(["docker", "ps", "-q", "--filter", "label=dev.dilu.function=echo"],
                                     capture_output=True, text=True).stdout.split()
                subprocess.run(["docker", "kill", ids[0]], capture_output=True, check=True)
            else:
                running = httpx.get(f"{self.worker.url}/v1/instances", timeout=5).json()
                target = next(i for i in running if i["function"] == "echo" and i["state"] == "ready")
                os.killpg(target["pid"], signal.SIGKILL)
        elif fault in ("worker", "controller"):
            role = getattr(self, fault)
            role.kill()
            role.start(wants_url=fault == "worker")
        elif fault == "redis":
            self.redis.stop()
            self.redis.start()
        elif fault == "postgres":
            self.postgres.stop()
            self.postgres.start()

    async def phase(self, fault: str) -> dict:
        before = durable_counts(self.postgres.url)
        outcomes: list[tuple[float, float, int]] = []
        load = asyncio.create_task(fixed_count(f"{self.gateway.url}/v1/functions/echo/invoke", b'{"n": 1}',
                                               self.args.clients, self.args.requests, 90.0, outcomes))
        while len(outcomes) < self.args.fault_at * self.args.requests and not load.done():
            await asyncio.sleep(0.01)
        watcher = StrengthWatcher(self.gateway.url, "echo", 2)
        fault_at = time.monotonic()
        watcher.start()
        await asyncio.to_thread(self.inject, fault)
        await load
        result = summarize(outcomes, fault_at)
        restored = await asyncio.to_thread(watcher.result, fault_at)
        after = durable_counts(self.postgres.url)
        span = max(a for _, a, _ in outcomes) - min(s for s, _, _ in outcomes)
        return {"fault": fault, **result, "rate": len(outcomes) / span, "restored_s": restored,
                "before": before, "after": after}

    def stop(self) -> dict[str, int]:
        codes = {}
        for name in ("gateway", "controller", "worker"):
            codes[name] = getattr(self, name).stop()
        self.redis.stop()
        self.postgres.stop()
        return codes


class StrengthWatcher(threading.Thread):
    """Polls a function's ready instances from the fault on: when the set changes (an instance
    lost or replaced), the time it is whole again (``want`` ready, none of them lost since)."""

    def __init__(self, url: str, function: str, want: int) -> None:
        super().__init__(daemon=True)
        self.url, self.function, self.want = url, function, want
        self.initial = self.ready_ids()
        self.dropped = False
        self.whole_at: float | None = None
        self.done = threading.Event()

    def ready_ids(self) -> set[str]:
        try:
            rows = httpx.get(f"{self.url}/v1/functions/{self.function}/instances", timeout=5).json()
        except (httpx.HTTPError, ValueError):
            return set()
        return {row["id"] for row in rows if row["state"] == "ready"}

    def run(self) -> None:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not self.done.is_set():
            ready = self.ready_ids()
            if ready != self.initial:
                self.dropped = True
            if self.dropped and len(ready) >= self.want:
                self.whole_at = time.monotonic()
                return
            time.sleep(0.05)

    def result(self, fault_at: float) -> float:
        """Seconds from the fault until whole again (0 when it never lost an instance)."""
        if not self.dropped:
            self.done.set()
            return 0.0
        self.join(180)
        return (self.whole_at or float("nan")) - fault_at


def print_table(rows: list[dict], runtime: str, clients: int) -> None:
    print(f"\n{runtime} runtime, {clients} clients; counts of durable rows are functions/profiles/bundles")
    print(f"{'fault':<11} {'sent':>6} {'2xx':>6} {'error':>6} {'no reply':>8} {'rows before':>12} "
          f"{'rows after':>11} {'req/s':>6} {'max lat s':>9} {'resumed s':>9} {'full s':>6}")
    for row in rows:
        def fmt(c: dict) -> str:
            return f"{c['functions']}/{c['profiles']}/{c['bundles']}"
        print(f"{row['fault']:<11} {row['sent']:>6} {row['ok']:>6} {row['error']:>6} {row['none']:>8} "
              f"{fmt(row['before']):>12} {fmt(row['after']):>11} {row['rate']:>6.0f} {row['max_latency_s']:>9.2f} "
              f"{row['recovery_s']:>9.2f} {row['restored_s']:>6.1f}")
    unanswered = sum(row["none"] for row in rows)
    lost = any(row["after"] != row["before"] for row in rows)
    slowest = max(row["recovery_s"] for row in rows)
    print(f"\nno reply: {unanswered} (target 0)   durable rows lost: {'yes' if lost else 'none'}   "
          f"slowest recovery: {slowest:.2f} s (target <= 10 s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000, help="requests per fault")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--fault-at", type=float, default=0.2, help="fraction of the phase answered before the fault")
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--runtime", choices=("docker", "process"), default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    parser.add_argument("--edges", action="store_true", help="run the faults at a request's edges instead "
                                                             "(streams, a second worker, callers who leave)")
    args = parser.parse_args()
    faults = [f for f in args.faults.split(",") if f]
    unknown = set(faults) - set(FAULTS)
    if unknown:
        parser.error(f"unknown faults: {', '.join(sorted(unknown))}; known: {', '.join(FAULTS)}")
    work = Path(tempfile.mkdtemp(prefix="dilu-faults-"))
    work.chmod(0o755)   # the private PostgreSQL runs as the postgres user
    if args.edges:
        from fault_edges import print_edges, run

        rows = run(work)
        print_edges(rows)
        print(f"logs: {work}")
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2))
        return
    bench = Bench(args, work)
    rows: list[dict] = []
    try:
        bench.start()
        for fault in faults:
            rows.append(asyncio.run(bench.phase(fault)))
            print(f"{fault}: {rows[-1]['ok']}/{rows[-1]['sent']} 2xx, resumed after {rows[-1]['recovery_s']:.2f} s",
                  flush=True)
    finally:
        codes = bench.stop()
    print_table(rows, bench.runtime, args.clients)
    print(f"roles stopped on SIGINT with exit codes {codes} (-9: needed SIGKILL)   logs: {work}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
