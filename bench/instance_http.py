"""The instance's HTTP protocol beside uvicorn's own, on the same echo app, side by side.

Starts two servers in child processes, each uvicorn on a Unix socket with an app that reads the
body (joined, as Starlette's ``Request.body`` does) and answers its length: one with uvicorn's
httptools protocol, one with Dilu's (`worker/instance/http_protocol.py`). One client sends the
same bodies to both, taking turns, over kept-alive connections. Prints p50 and p99 per body size
and protocol, and Dilu's p50 over uvicorn's.

    python bench/instance_http.py [--requests 200] [--sizes 2,602112,4816896]

The default sizes: a no-op JSON body, one [1, 150528] FP32 image, eight of them.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.waiting import eventually

SERVER = """
import socket, sys
import uvicorn
from worker.instance.http_protocol import InstanceHttp

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    pieces, more = [], True
    while more:     # uvicorn's protocol hands a large body over in pieces; Dilu's whole
        message = await receive()
        pieces.append(message["body"])
        more = message.get("more_body", False)
    answer = str(len(pieces[0] if len(pieces) == 1 else b"".join(pieces))).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(answer))]})
    await send({"type": "http.response.body", "body": answer})

listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(sys.argv[1])
protocol = InstanceHttp if sys.argv[2] == "dilu" else "httptools"
uvicorn.Server(uvicorn.Config(app, http=protocol, ws="none", lifespan="off", log_level="warning",
                              access_log=False)).run(sockets=[listener])
"""
PROTOCOLS = ("uvicorn", "dilu")


class Client:
    """One kept-alive connection, reading each answer whole (it has a content-length)."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)

    def post(self, body: bytes) -> bytes:
        self.sock.sendall(b"POST /infer HTTP/1.1\r\nhost: instance\r\ncontent-length: %d\r\n\r\n" % len(body))
        self.sock.sendall(body)
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += self.sock.recv(65536)
        head, _, rest = answer.partition(b"\r\n\r\n")
        fields = dict(line.lower().split(b": ", 1) for line in head.split(b"\r\n")[1:])
        length = int(fields[b"content-length"])
        while len(rest) < length:
            rest += self.sock.recv(65536)
        return rest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=200, help="measured requests per size and protocol")
    parser.add_argument("--sizes", default="2,602112,4816896", help="comma-separated body sizes in bytes")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="dilu-bench-http-"))
    servers, clients = [], {}
    try:
        for name in PROTOCOLS:
            path = str(folder / f"{name}.sock")
            servers.append(subprocess.Popen([sys.executable, "-c", SERVER, path, name], cwd=ROOT,
                                            env={**os.environ, "PYTHONPATH": str(ROOT)}))
            eventually(lambda path=path: os.path.exists(path), what=f"the {name} server")
            clients[name] = eventually(lambda path=path: _connected(path), what=f"a connection to {name}")
        print(f"instance HTTP: echo app, one client, {args.requests} requests per size and protocol, taking turns")
        print(f"{'bytes':>10} {'protocol':>9} {'p50 ms':>8} {'p99 ms':>8}")
        for size in (int(text) for text in args.sizes.split(",")):
            body = os.urandom(size)
            samples: dict[str, list[float]] = {name: [] for name in PROTOCOLS}
            for turn in range(args.requests + 10):
                for name in PROTOCOLS:
                    started = time.perf_counter()
                    got = clients[name].post(body)
                    assert got == str(size).encode(), (name, got[:100])
                    if turn >= 10:     # the first few warm the connection and the allocator
                        samples[name].append(time.perf_counter() - started)
            p50 = {}
            for name in PROTOCOLS:
                ordered = sorted(samples[name])
                p50[name] = statistics.median(ordered) * 1000
                p99 = ordered[int(len(ordered) * 0.99) - 1] * 1000
                print(f"{size:>10} {name:>9} {p50[name]:>8.3f} {p99:>8.3f}")
            print(f"{size:>10} {'ratio':>9} dilu p50 over uvicorn's: {p50['dilu'] / p50['uvicorn']:.2f}x", flush=True)
    finally:
        for server in servers:
            server.terminate()
            server.wait()
        for leftover in folder.iterdir():
            leftover.unlink()
        folder.rmdir()


def _connected(path: str) -> Client | None:
    try:
        return Client(path)
    except OSError:
        return None


if __name__ == "__main__":
    main()
