"""Clear answers through outages: PostgreSQL gone gives 503s with a JSON error and Retry-After, a
worker that stops answering (SIGSTOP) is judged lost without holding up the controller's pass,
and a Redis outage is logged once with a count, not as a traceback per attempt."""

from __future__ import annotations

import re
import shutil
import signal
import socket
import threading
import time
from pathlib import Path

import httpx

from tests.conftest import FIXTURE_FUNCTIONS, REDIS_URL
from tests.e2e.test_store_outage import PrivateRedis
from tests.platform import start_role
from tests.waiting import eventually


class CuttableProxy:
    """A TCP proxy in front of a real server whose connections the test can cut (and refuse)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.open = threading.Event()
        self.open.set()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.open.is_set():
                client.close()          # refused while cut
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        self.open.clear()
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for end in pair:
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                end.close()

    def restore(self) -> None:
        self.open.set()

    def close(self) -> None:
        self.cut()
        self.listener.close()


def test_postgresql_down_answers_503_with_a_json_error(start_platform, postgres_url: str) -> None:
    proxy = CuttableProxy(("127.0.0.1", 5432))
    try:
        platform = start_platform(env={"DILU_DATABASE_URL": postgres_url.replace("127.0.0.1:5432",
                                                                                 f"127.0.0.1:{proxy.port}")})
        assert platform.http.get("/v1/functions").status_code == 200
        proxy.cut()
        spec = (FIXTURE_FUNCTIONS / "ok" / "model.yaml").read_text()
        for reply in (platform.http.get("/v1/functions"), platform.http.get("/v1/functions/ok"),
                      platform.http.get("/v1/status"),
                      platform.http.post("/v1/functions", json={"yaml": spec,
                                                                "source_dir": str(FIXTURE_FUNCTIONS / "ok")})):
            assert reply.status_code == 503, (reply.request.url, reply.status_code, reply.text)
            assert reply.headers["content-type"] == "application/json" and reply.headers["retry-after"]
            assert "database cannot answer" in reply.json()["error"]
        # The CLI's first call is a HEAD (is the bundle there?): its 503 has no body, yet the
        # user reads the reason.
        deployed = platform.cli("deploy", str(FIXTURE_FUNCTIONS / "ok" / "model.yaml"))
        assert deployed.returncode == 1 and "database cannot answer" in deployed.stderr, deployed.stderr
        assert "Traceback" not in deployed.stderr
        proxy.restore()
        eventually(lambda: platform.http.get("/v1/functions").status_code == 200, timeout=30,
                   what="the gateway to reach the database again")
    finally:
        proxy.close()


def test_a_hung_worker_is_judged_lost_and_holds_up_no_one(start_platform, tmp_path: Path, postgres_url: str,
                                                          redis_prefix: str) -> None:
    shared = {"DILU_DATABASE_URL": postgres_url, "DILU_REDIS_URL": REDIS_URL, "DILU_REDIS_PREFIX": redis_prefix,
              "DILU_CLUSTER_KEY": "cluster-secret-" + "y" * 16}
    platform = start_platform(env={**shared, "DILU_GPUS": "none"})
    worker = start_role(["worker"], {**shared, "DILU_HOME": str(tmp_path / "far"), "DILU_HOST": "127.0.0.2",
                                     "DILU_PORT": "0", "DILU_WORKER_NAME": "far", "DILU_GPUS": "none"},
                        tmp_path / "far.log")
    try:
        eventually(lambda: any(w["id"].startswith("far") for w in platform.http.get("/v1/status").json()["workers"]),
                   timeout=30, what="the second worker to register")
        worker.process.send_signal(signal.SIGSTOP)       # hung: its sockets accept, nothing answers

        def far_lost() -> bool:
            far = [w for w in platform.http.get("/v1/status").json()["workers"] if w["id"].startswith("far")]
            return bool(far) and far[0]["state"] == "lost"

        # Its heartbeat's TTL is 5 s; the pass asks each worker within 2 s, so it is lost well
        # before a 30 s read timeout on its instance list would have let the pass go on.
        eventually(far_lost, timeout=20, what="the hung worker to be judged lost")
        source = shutil.copytree(FIXTURE_FUNCTIONS / "ok", tmp_path / "ok")
        deployed = platform.cli("deploy", str(source / "model.yaml"))
        assert deployed.returncode == 0, deployed.stderr
        assert platform.invoke("ok", {"n": 1}).status_code == 200
        # Its silence was said once, with a reason (a timeout's type when its message is empty).
        silent = [line for line in platform.role.log().splitlines()
                  if re.search(r"listing the instances of far\S* failed: \S", line)]
        assert len(silent) == 1, platform.role.log()[-3000:]
    finally:
        worker.process.send_signal(signal.SIGCONT)
        worker.stop()


def test_a_redis_outage_is_logged_once_with_a_count(tmp_path: Path, start_platform) -> None:
    store = PrivateRedis(tmp_path)
    store.start()
    try:
        platform = start_platform(env={"DILU_REDIS_URL": f"redis://127.0.0.1:{store.port}/0"})
        store.stop()
        eventually(lambda: "heartbeat of" in platform.role.log() and "failed: " in platform.role.log(), timeout=30,
                   what="the failed heartbeat to be logged")
        time.sleep(3)      # the outage lasts a few heartbeat periods (and some 150 polls)
        store.start()
        eventually(lambda: any("heartbeat of" in line and "works again after" in line
                               for line in platform.role.log().splitlines()),
                   timeout=30, what="the recovery to be logged")
        assert httpx.get(platform.url + "/healthz").status_code == 200
        log = platform.role.log()
        heartbeat_lines = [line for line in log.splitlines() if "heartbeat of" in line]
        assert len(heartbeat_lines) == 2, heartbeat_lines      # failed once, works again: nothing between
        assert "Traceback" not in log
        assert len(log.splitlines()) < 40, log       # every repeating failure: a line or two
    finally:
        store.stop()
