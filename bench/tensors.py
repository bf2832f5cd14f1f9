"""Tensors through every path into one function, side by side with KServe and MLServer.

Starts `dilu up` (embedded default), deploys a function that takes arrays and sums each row of
an FP32 tensor (one warm instance, batch size 1), and sends the same tensors through `/v1` JSON,
`/v2` REST JSON, `/v2` REST binary (tritonclient's binary extension), gRPC (tritonclient), and
straight to the instance (the tensor frame the gateway hands it). Beside it, the same numpy sum
on KServe's Python model server and on MLServer (each in its own environment, installed into
the bench cache on first use), through the same clients. Requests take turns between the paths,
one client, so noise hits them alike. Prints p50 and p99 per path and shape, each p50 over the
handler's own time (the sum, timed in this process), and Dilu's p50 over each peer's.

    python bench/tensors.py [--requests 20] [--shapes 1x4,1x150528,8x150528] [--peers kserve,mlserver]

Targets (issue 31): on the image ([1, 150528]) `/v2` binary and gRPC within 3 ms of the
handler's own time at p50 and faster than both peers; small tensors within 0.2 ms of `/v1`.
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.peers.servers import Peer, PeerUnavailable, start_kserve, start_mlserver
from dilu import tensor_frames as frames
from tests.platform import Platform  # reuses the test harness that runs `dilu up`
from tests.waiting import eventually

HANDLER = '''
class RowSums:
    def predict(self, batch):
        return {"sums": batch["x"].sum(axis=1)}
'''
SPEC = """name: rowsums
handler: handler:RowSums
arrays: numpy
resources: {memory: 2Gi, gpu: false, sm_request: 1.0, sm_limit: 1.0}
scaling: {min_instances: 1, max_instances: 1, keep_alive_s: 3600}
batching: {max_batch_size: 1}
inputs:
  - {name: x, datatype: FP32, shape: [-1, -1]}
outputs:
  - {name: sums, datatype: FP32, shape: [-1]}
"""
JSON_HEADERS = {"content-type": "application/json"}   # KServe reads a body without it as binary


def _checked(result: np.ndarray, expected: np.ndarray) -> None:
    assert np.allclose(result.reshape(-1), expected, rtol=1e-4), "wrong sums"


def _v2_senders(prefix: str, http_address: str, grpc_address: str, tensor: np.ndarray,
                binary_rest: bool = True) -> dict[str, Callable[[], object]]:
    """REST JSON, REST binary (where the server takes it) and gRPC, through tritonclient."""
    expected = tensor.sum(axis=1)
    rest = triton_http.InferenceServerClient(http_address, network_timeout=120)
    grpc = triton_grpc.InferenceServerClient(grpc_address)

    def v2(binary: bool) -> Callable[[], object]:
        def send() -> object:
            given = triton_http.InferInput("x", list(tensor.shape), "FP32")
            given.set_data_from_numpy(tensor, binary_data=binary)
            wanted = triton_http.InferRequestedOutput("sums", binary_data=binary)
            result = rest.infer("rowsums", [given], outputs=[wanted], headers=None if binary else JSON_HEADERS)
            _checked(result.as_numpy("sums"), expected)
            return result
        return send

    def over_grpc() -> object:
        given = triton_grpc.InferInput("x", list(tensor.shape), "FP32")
        given.set_data_from_numpy(tensor)
        result = grpc.infer("rowsums", [given])
        _checked(result.as_numpy("sums"), expected)
        return result

    senders = {f"{prefix} JSON": v2(False)}
    if binary_rest:
        senders[f"{prefix} binary"] = v2(True)
    senders[f"{prefix} gRPC"] = over_grpc
    return senders


class Poster:
    """POSTs over one kept-alive connection with the standard library's client: as cheap a client
    as tritonclient's, so the paths differ by the server, not by the client."""

    def __init__(self, url: str) -> None:
        parsed = urlsplit(url)
        self._connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=120)
        self._prefix = parsed.path.rstrip("/")

    def post(self, path: str, body: bytes | memoryview, headers: dict[str, str]) -> tuple[int, bytes, str | None]:
        """(status, body, the tensor frame header if any)."""
        self._connection.request("POST", self._prefix + path, body=body, headers=headers)
        reply = self._connection.getresponse()
        return reply.status, reply.read(), reply.getheader(frames.HEADER)


def _dilu_senders(platform: Platform, endpoint: str, tensor: np.ndarray) -> dict[str, Callable[[], object]]:
    expected = tensor.sum(axis=1)
    gateway, direct = Poster(platform.url), Poster(endpoint)
    json_body = json.dumps({"x": tensor.tolist()}).encode()
    header, frame = frames.encode([frames.Tensor("x", "FP32", tensor)])

    def v1() -> object:
        status, body, _ = gateway.post("/v1/functions/rowsums/invoke", json_body, JSON_HEADERS)
        assert status == 200, body[:200]
        _checked(np.array(json.loads(body)["sums"]), expected)
        return body

    def instance() -> object:
        status, body, tensors = direct.post("/infer", frame, {"content-type": frames.MEDIA_TYPE,
                                                             frames.HEADER: header})
        assert status == 200, body[:200]
        _checked(frames.decode(tensors, body)[0].array, expected)
        return body

    return {"instance": instance, "/v1 JSON": v1,
            **_v2_senders("/v2", platform.url.removeprefix("http://"), platform.grpc_address, tensor)}


def handler_time(tensor: np.ndarray, calls: int = 50) -> float:
    """The handler's own time on ``tensor`` (median seconds), called in this process."""
    namespace: dict[str, object] = {}
    exec(HANDLER, namespace)   # the bench's own handler text, run as the instance runs it
    handler = namespace["RowSums"]()
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        handler.predict({"x": tensor})
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(senders: dict[str, Callable[[], object]], requests: int) -> dict[str, list[float]]:
    """Seconds per request and path; the paths take turns, after one warm-up call each. A path
    whose warm-up call fails is left out, with the reason."""
    for path, send in list(senders.items()):
        try:
            send()
        except Exception as exc:  # noqa: BLE001 - a peer's refusal is reported, not fatal
            print(f"{'':>10} {path:>16} left out: {str(exc)[:150]}", flush=True)
            del senders[path]
    samples: dict[str, list[float]] = {path: [] for path in senders}
    for _ in range(requests):
        for path, send in senders.items():
            started = time.perf_counter()
            send()
            samples[path].append(time.perf_counter() - started)
    return samples


def start_peers(names: list[str]) -> list[Peer]:
    peers = []
    for name, start in (("kserve", start_kserve), ("mlserver", start_mlserver)):
        if name not in names:
            continue
        try:
            peers.append(start())
        except PeerUnavailable as exc:
            print(f"peer {name}: skipped: {exc}", flush=True)
    return peers


COMPARED = (("/v2 JSON", "JSON"), ("/v2 binary", "binary"), ("/v2 gRPC", "gRPC"))


def report(text: str, samples: dict[str, list[float]], handler_s: float, peers: list[Peer]) -> None:
    p50s = {path: statistics.median(values) for path, values in samples.items()}
    for path, values in samples.items():
        ordered = sorted(values)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        print(f"{text:>10} {path:>16} {p50s[path] * 1000:>9.2f} {p99 * 1000:>9.2f} "
              f"{(p50s[path] - handler_s) * 1000:>16.2f}", flush=True)
    for peer in peers:
        for ours, kind in COMPARED:
            theirs = f"{peer.name} {kind}"
            if theirs in p50s and ours in p50s:
                print(f"{text:>10} {'Dilu ' + ours + ' / ' + theirs:>44}: {p50s[ours] / p50s[theirs]:.2f}x p50")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20, help="measured requests per path and shape")
    parser.add_argument("--shapes", default="1x4,1x150528,8x150528", help="comma-separated ROWSxCOLUMNS")
    parser.add_argument("--peers", default="kserve,mlserver", help="peers to run beside Dilu (none: no peer)")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="dilu-bench-"))
    source = workdir / "rowsums"
    source.mkdir()
    (source / "handler.py").write_text(HANDLER)
    (source / "model.yaml").write_text(SPEC)
    platform = Platform(workdir / "home", env={"DILU_MAX_REQUEST_BYTES": str(64 * 2**20)})
    peers: list[Peer] = []
    try:
        assert platform.deploy_file(source / "model.yaml").status_code == 201
        platform.wait_ready("rowsums")
        endpoint = eventually(lambda: platform.instances("rowsums")[0]["endpoint"], what="the instance endpoint")
        peers = start_peers(args.peers.split(","))
        rng = np.random.default_rng(0)
        print(f"tensors: one client, {args.requests} requests per path and shape, paths taking turns")
        print(f"{'shape':>10} {'path':>16} {'p50 ms':>9} {'p99 ms':>9} {'p50 - handler ms':>16}")
        for text in args.shapes.split(","):
            rows, columns = (int(n) for n in text.split("x"))
            tensor = rng.random((rows, columns), dtype=np.float32)
            senders = _dilu_senders(platform, endpoint, tensor)
            for peer in peers:
                senders.update(_v2_senders(peer.name, peer.http, peer.grpc, tensor, peer.binary_rest))
            handler_s = handler_time(tensor)
            print(f"{text:>10} {'handler':>16} {handler_s * 1000:>9.3f}", flush=True)
            report(text, measure(senders, args.requests), handler_s, peers)
    finally:
        for peer in peers:
            peer.close()
        platform.close()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
