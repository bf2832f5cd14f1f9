"""Tensors through every path into one function, side by side: what each wire format costs.

Starts `dilu up` (embedded default), deploys a function that sums each row of an FP32 tensor
(one warm instance, batch size 1), and sends the same tensors through `/v1` JSON, `/v2` REST
JSON, `/v2` REST binary (tritonclient's binary extension), gRPC (tritonclient), and straight to
the instance (the JSON body the gateway hands it: the floor). Requests take turns between the
paths, one client, so noise hits them alike. Prints p50 and p99 per path and shape, and each
path's p50 over the instance's.

    python bench/tensors.py [--requests 20] [--shapes 1x4,1x150528,8x150528]

Targets (issue 31): on the image ([1, 150528]) `/v2` binary and gRPC within 3 ms of the
instance's own time at p50; small tensors within 0.2 ms of `/v1`. KServe's and MLServer's
servers are not in this run yet.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.platform import Platform  # reuses the test harness that runs `dilu up`
from tests.waiting import eventually

HANDLER = '''
from dilu import Handler


class RowSums(Handler):
    def predict(self, inputs):
        return [{"sums": [float(sum(row)) for row in item["x"]]} for item in inputs]
'''
SPEC = """name: rowsums
handler: handler:RowSums
resources: {memory: 2Gi, gpu: false, sm_request: 1.0, sm_limit: 1.0}
scaling: {min_instances: 1, max_instances: 1, keep_alive_s: 3600}
batching: {max_batch_size: 1}
inputs:
  - {name: x, datatype: FP32, shape: [-1, -1]}
outputs:
  - {name: sums, datatype: FP32, shape: [-1]}
"""
PATHS = ("instance", "/v1 JSON", "/v2 JSON", "/v2 binary", "gRPC")


def _senders(platform: Platform, endpoint: str, tensor: np.ndarray) -> dict[str, Callable[[], object]]:
    """One callable per path, each sending ``tensor`` and checking the answer."""
    body = json.dumps({"x": tensor.tolist()}).encode()
    expected = tensor.sum(axis=1)
    http = httpx.Client(timeout=120)
    rest = triton_http.InferenceServerClient(platform.url.removeprefix("http://"), network_timeout=120)
    grpc = triton_grpc.InferenceServerClient(platform.grpc_address)

    def posted(url: str) -> Callable[[], object]:
        def send() -> object:
            reply = http.post(url, content=body, headers={"content-type": "application/json"})
            assert reply.status_code == 200, reply.text[:200]
            assert np.allclose(reply.json()["sums"], expected, rtol=1e-4), "wrong sums"
            return reply
        return send

    def v2(binary: bool) -> Callable[[], object]:
        def send() -> object:
            given = triton_http.InferInput("x", list(tensor.shape), "FP32")
            given.set_data_from_numpy(tensor, binary_data=binary)
            wanted = triton_http.InferRequestedOutput("sums", binary_data=binary)
            result = rest.infer("rowsums", [given], outputs=[wanted])
            assert np.allclose(result.as_numpy("sums"), expected, rtol=1e-4), "wrong sums"
            return result
        return send

    def over_grpc() -> object:
        given = triton_grpc.InferInput("x", list(tensor.shape), "FP32")
        given.set_data_from_numpy(tensor)
        result = grpc.infer("rowsums", [given])
        assert np.allclose(result.as_numpy("sums"), expected, rtol=1e-4), "wrong sums"
        return result

    return {"instance": posted(f"{endpoint}/infer"), "/v1 JSON": posted(f"{platform.url}/v1/functions/rowsums/invoke"),
            "/v2 JSON": v2(False), "/v2 binary": v2(True), "gRPC": over_grpc}


def measure(senders: dict[str, Callable[[], object]], requests: int) -> dict[str, list[float]]:
    """Seconds per request and path; the paths take turns, after one warm-up call each."""
    for send in senders.values():
        send()
    samples: dict[str, list[float]] = {path: [] for path in senders}
    for _ in range(requests):
        for path, send in senders.items():
            started = time.perf_counter()
            send()
            samples[path].append(time.perf_counter() - started)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20, help="measured requests per path and shape")
    parser.add_argument("--shapes", default="1x4,1x150528,8x150528", help="comma-separated ROWSxCOLUMNS")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="dilu-bench-"))
    source = workdir / "rowsums"
    source.mkdir()
    (source / "handler.py").write_text(HANDLER)
    (source / "model.yaml").write_text(SPEC)
    platform = Platform(workdir / "home", env={"DILU_MAX_REQUEST_BYTES": str(64 * 2**20)})
    try:
        assert platform.deploy_file(source / "model.yaml").status_code == 201
        platform.wait_ready("rowsums")
        endpoint = eventually(lambda: platform.instances("rowsums")[0]["endpoint"], what="the instance endpoint")
        rng = np.random.default_rng(0)
        print(f"tensors: one client, {args.requests} requests per path and shape, paths taking turns")
        print(f"{'shape':>10} {'path':>11} {'p50 ms':>9} {'p99 ms':>9} {'p50 / instance':>15}")
        for text in args.shapes.split(","):
            rows, columns = (int(n) for n in text.split("x"))
            tensor = rng.random((rows, columns), dtype=np.float32)
            samples = measure(_senders(platform, endpoint, tensor), args.requests)
            floor = statistics.median(samples["instance"])
            for path in PATHS:
                ordered = sorted(samples[path])
                p50, p99 = statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
                print(f"{text:>10} {path:>11} {p50 * 1000:>9.2f} {p99 * 1000:>9.2f} {p50 / floor:>14.2f}x", flush=True)
    finally:
        platform.close()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
