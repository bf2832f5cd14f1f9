"""The faults at a request's edges (``python bench/faults.py --edges``): streams whose instance
is killed, a worker killed or stopped beside a healthy second one, callers who give up.

Two workers (separate processes) on the benchmark's private PostgreSQL and Redis, the process
runtime. Per fault: requests sent, answered whole, ended with an explicit error (a status, or a
stream's error event), silently cut (a stream that ended without its terminator, or a connection
closed without an answer), and lost (no answer at all within the phase); for callers who give
up, the seconds from the last one leaving until the platform had freed their work; for a gateway
stopped (SIGINT) with 50 callers queued for a cold start, how long its stop took.

Targets: 0 lost, 0 silently cut, abandoned work freed within 1 s.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from faults import ROOT, PrivatePostgres, PrivateRedis, Role, free_port, wait_until

EDGES = ("stream-kill", "worker-kill", "worker-stop", "abandon-queued", "abandon-long", "gateway-stop")
FIXTURES = ROOT / "tests" / "fixtures" / "functions"
STREAMING = """name: streams
handler: handler:SlowStream
generates: text
resources: {memory: 128Mi, gpu: false}
scaling: {min_instances: 1, max_instances: 1, keep_alive_s: 600}
batching: {max_batch_size: 8, max_wait_ms: 0}
model: {step_s: 0.05}
"""
SPREAD = """name: spread
handler: handler:Step
resources: {{memory: {memory_mib}Mi, gpu: false}}
scaling: {{min_instances: 3, max_instances: 3, keep_alive_s: 600}}
model: {{op: add, sleep_s: 0.02}}
"""
COLD = """name: cold
handler: handler:Step
resources: {memory: 128Mi, gpu: false}
scaling: {min_instances: 0, max_instances: 1, keep_alive_s: 600}
model: {op: add, load_s: 60}
"""
ONE_SLOT = """name: one-slot
handler: handler:Counter
resources: {memory: 128Mi, gpu: false}
scaling: {min_instances: 1, max_instances: 1, keep_alive_s: 600}
batching: {max_batch_size: 1}
"""


def _count(rows: list[str]) -> dict[str, int]:
    return {kind: rows.count(kind) for kind in ("whole", "error", "cut", "lost")}


class Edges:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.postgres = PrivatePostgres(work / "edge-pg")
        self.redis = PrivateRedis(work)
        self.env = {"DILU_DATABASE_URL": self.postgres.url, "DILU_REDIS_URL": self.redis.url,
                    "DILU_HOME": str(work / "edge-home"), "DILU_PROFILING": "false", "DILU_REQUEST_TIMEOUT_S": "5"}
        self.roles: dict[str, Role] = {}

    def start(self) -> None:
        self.postgres.start()
        self.redis.start()
        subprocess.run([self._dilu(), "migrate"], env={**os.environ, **self.env}, check=True, capture_output=True)
        for name in ("first", "second"):
            self.roles[name] = self._worker(name)
        self.roles["controller"] = Role(["controller"], self.env, self.work / "edge-controller.log").start(False)
        gateway = Role(["gateway"], {**self.env, "DILU_PORT": "0"}, self.work / "edge-gateway.log")
        self.roles["gateway"] = gateway.start()
        self.url = self.roles["gateway"].url

    def _worker(self, name: str) -> Role:
        return Role(["worker"], {**self.env, "DILU_GPUS": "none", "DILU_PORT": str(free_port()),
                                 "DILU_WORKER_NAME": name}, self.work / f"edge-{name}.log").start()

    @staticmethod
    def _dilu() -> str:
        import shutil

        return shutil.which("dilu", path=str(Path(sys.executable).parent)) or "dilu"

    def deploy(self, fixture: str, spec: str, wait: bool = True) -> None:
        import shutil

        folder = self.work / f"edge-{fixture}-{time.monotonic_ns()}"
        shutil.copytree(FIXTURES / fixture, folder)
        (folder / "model.yaml").write_text(spec)
        deployed = subprocess.run([self._dilu(), "deploy", str(folder / "model.yaml"),
                                   "--wait" if wait else "--no-wait"], capture_output=True,
                                  env={**os.environ, **self.env, "DILU_URL": self.url}, text=True, timeout=300)
        if deployed.returncode != 0:
            raise SystemExit(f"deploying {fixture} failed: {deployed.stderr}")

    def instances(self, function: str) -> list[dict]:
        return [i for i in httpx.get(f"{self.url}/v1/functions/{function}/instances", timeout=10).json()
                if i["state"] == "ready"]

    def function(self, name: str) -> dict:
        return httpx.get(f"{self.url}/v1/functions/{name}", timeout=10).json()

    def stop(self) -> None:
        for role in self.roles.values():
            role.stop()
        self.redis.stop()
        self.postgres.stop()

    # The faults -------------------------------------------------------------------------------

    async def stream_kill(self) -> dict:
        """8 streams of 10 s on one instance; it is killed (SIGKILL) once each has a chunk."""
        self.deploy("slow_stream", STREAMING)
        (instance,) = self.instances("streams")
        pid = _pid_of(instance["endpoint"])
        firsts, outcomes = asyncio.Event(), []

        async def one(http: httpx.AsyncClient) -> None:
            try:
                async with http.stream("POST", f"{self.url}/v1/functions/streams/invoke",
                                       json={"max_new_tokens": 200}, headers={"accept": "text/event-stream"}) as r:
                    lines = []
                    async for line in r.aiter_lines():
                        if line:
                            lines.append(line)
                            if len(lines) == 1:
                                outcomes.append("first")
                                if outcomes.count("first") == 8:
                                    firsts.set()
                    outcomes.append("whole" if lines[-1] == "data: [DONE]" else
                                    "error" if "event: error" in lines else "cut")
            except httpx.HTTPError:
                outcomes.append("cut")

        async with httpx.AsyncClient(timeout=60) as http:
            tasks = [asyncio.create_task(one(http)) for _ in range(8)]
            await asyncio.wait_for(firsts.wait(), 60)
            os.kill(pid, signal.SIGKILL)
            await asyncio.wait(tasks, timeout=60)
        ended = [o for o in outcomes if o != "first"]
        return {"sent": 8, **_count(ended + ["lost"] * (8 - len(ended)))}

    async def _load(self, function: str, requests: int, clients: int, fault: Callable[[], None],
                    after: int) -> dict:
        """``requests`` from ``clients`` closed-loop clients; ``fault`` strikes after ``after``."""
        rows, sent = [], iter(range(requests))
        struck = asyncio.Event()

        async def client(http: httpx.AsyncClient) -> None:
            for number in sent:
                if number == after:
                    await asyncio.to_thread(fault)
                    struck.set()
                try:
                    reply = await http.post(f"{self.url}/v1/functions/{function}/invoke", json={"x": number})
                    rows.append("whole" if reply.status_code == 200 else "error")
                except httpx.RemoteProtocolError:
                    rows.append("cut")
                except httpx.HTTPError:
                    rows.append("lost")

        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=clients)) as http:
            await asyncio.gather(*(client(http) for _ in range(clients)))
        return {"sent": requests, **_count(rows)}

    async def worker_kill(self) -> dict:
        """Three instances placed two and one; the worker with two dies with them (SIGKILL to
        the worker and its instances, as when its host goes) under 16 clients."""
        memory = min(w["memory_bytes"] for w in httpx.get(f"{self.url}/v1/status", timeout=10).json()["workers"])
        self.deploy("step", SPREAD.format(memory_mib=memory * 2 // 5 // 2**20))
        placed = self.instances("spread")
        doubled = max({i["worker_id"] for i in placed}, key=lambda w: sum(i["worker_id"] == w for i in placed))
        role = self.roles[doubled.removesuffix("-cpu")]
        result = await self._load("spread", 2000, 16, lambda: _kill_tree(role.process.pid), 600)
        role.start()    # back, as a supervisor would
        return result

    async def worker_stop(self) -> dict:
        """The worker holding two of the three instances is stopped (SIGSTOP) for 8 s."""
        placed = self.instances("spread")
        doubled = max({i["worker_id"] for i in placed}, key=lambda w: sum(i["worker_id"] == w for i in placed))
        role = self.roles[doubled.removesuffix("-cpu")]

        def pause() -> None:
            role.process.send_signal(signal.SIGSTOP)
            threading.Timer(8.0, role.process.send_signal, (signal.SIGCONT,)).start()

        started = time.monotonic()
        result = await self._load("spread", 4000, 16, pause, 400)
        result["phase_s"] = round(time.monotonic() - started, 1)
        return result

    async def abandon_queued(self) -> dict:
        """50 callers queue for a cold start (a 60 s load) and leave; freed: until none waits."""
        self.deploy("step", COLD, wait=False)
        connections = [_send(self.url, "/v1/functions/cold/invoke", {"x": n}) for n in range(50)]
        wait_until(lambda: self.function("cold")["queued_requests"] == 50, 60, "50 queued requests")
        for connection in connections:
            connection.close()
        left = time.monotonic()
        wait_until(lambda: self.function("cold")["queued_requests"] == 0, 120, "the queue to empty")
        return {"sent": 50, "freed_s": round(time.monotonic() - left, 2)}

    async def abandon_long(self) -> dict:
        """8 callers of 50 s generations answered whole, on a one-slot function, leave once the
        first runs; freed: until the next request is answered (the slot is free again)."""
        self.deploy("counter_stream", ONE_SLOT)
        connections = [_send(self.url, "/v1/functions/one-slot/invoke", {"to": 1000, "step_s": 0.05})
                       for _ in range(8)]
        wait_until(lambda: self.function("one-slot")["in_flight_requests"] >= 1, 60, "a generation running")
        for connection in connections:
            connection.close()
        left = time.monotonic()
        reply = httpx.post(f"{self.url}/v1/functions/one-slot/invoke", json={"to": 1}, timeout=120)
        return {"sent": 8, "freed_s": round(time.monotonic() - left, 2), "next": reply.status_code}


    async def gateway_stop(self) -> dict:
        """50 callers queue for a cold start (a 60 s load), then the gateway is told to stop;
        each caller's answer is read, and the stop timed (runs last: the gateway stays down)."""
        self.deploy("step", COLD.replace("name: cold", "name: cold-stop"), wait=False)
        connections = [_send(self.url, "/v1/functions/cold-stop/invoke", {"x": n}) for n in range(50)]
        wait_until(lambda: self.function("cold-stop")["queued_requests"] == 50, 60, "50 queued requests")
        told = time.monotonic()
        code = self.roles["gateway"].stop()
        stop_s = time.monotonic() - told
        rows = [_answer_kind(connection) for connection in connections]
        return {"sent": 50, **_count(rows), "phase_s": round(stop_s, 2), "exit": code}


def _answer_kind(connection: socket.socket) -> str:
    """whole (a 2xx), error (a 4xx or 503 with a JSON error), cut (closed with no answer, or a
    500), lost (no answer within 30 s)."""
    reply = b""
    try:
        while chunk := connection.recv(65536):
            reply += chunk
    except TimeoutError:
        return "lost"
    finally:
        connection.close()
    status = reply.split(b" ", 2)[1] if reply.startswith(b"HTTP/1.1 ") else b""
    if status.startswith(b"2"):
        return "whole"
    explicit = status.startswith(b"4") or status in (b"502", b"503", b"504")
    return "error" if explicit and b'"error"' in reply else "cut"


def _send(url: str, path: str, body: dict) -> socket.socket:
    address = urlsplit(url)
    connection = socket.create_connection((address.hostname, address.port), timeout=30)
    data = json.dumps(body).encode()
    connection.sendall(f"POST {path} HTTP/1.1\r\nhost: {address.netloc}\r\ncontent-type: application/json\r\n"
                       f"content-length: {len(data)}\r\n\r\n".encode() + data)
    return connection


def _pid_of(endpoint: str) -> int:
    """The instance process listening on ``endpoint``'s port."""
    port = urlsplit(endpoint).port
    found = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True).stdout
    return int(found.split("pid=")[1].split(",")[0])


def _kill_tree(pid: int) -> None:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    todo, found = [pid], []
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    for each in found:
        try:
            os.kill(each, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run(work: Path) -> list[dict]:
    edges = Edges(work)
    rows = []
    try:
        edges.start()
        for name, phase in (("stream-kill", edges.stream_kill), ("worker-kill", edges.worker_kill),
                            ("worker-stop", edges.worker_stop), ("abandon-queued", edges.abandon_queued),
                            ("abandon-long", edges.abandon_long), ("gateway-stop", edges.gateway_stop)):
            try:
                rows.append({"fault": name, **asyncio.run(phase())})
            except (SystemExit, Exception) as exc:   # noqa: BLE001 - one phase's failure is its row
                rows.append({"fault": name, "failed": str(exc)[:200]})
            print(f"{name}: {rows[-1]}", flush=True)
    finally:
        edges.stop()
    return rows


def print_edges(rows: list[dict]) -> None:
    print(f"\n{'fault':<15} {'sent':>5} {'whole':>6} {'error':>6} {'cut':>4} {'lost':>5} {'freed s':>8}  note")
    for row in rows:
        if "failed" in row:
            print(f"{row['fault']:<15} failed: {row['failed']}")
            continue
        note = (f"stop took {row['phase_s']} s, exit {row['exit']}" if "exit" in row else
                f"phase {row['phase_s']} s") if "phase_s" in row else (f"next request {row['next']}" if "next" in row
                                                                       else "")
        print(f"{row['fault']:<15} {row['sent']:>5} {row.get('whole', '-'):>6} {row.get('error', '-'):>6} "
              f"{row.get('cut', '-'):>4} {row.get('lost', '-'):>5} {row.get('freed_s', '-'):>8}  {note}")
    print("\ntargets: lost 0, cut 0, freed within 1 s")
