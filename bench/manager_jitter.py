"""The token manager's period jitter in `dilu up`, idle and while its gateway serves at full speed.

    python bench/manager_jitter.py [--seconds 10] [--clients 16]

For each place the manager can run (a thread of the worker, which shares the interpreter with
the gateway and the controller in `dilu up`; its own process, the default), one platform with a
simulated GPU runs a training loop through the real shim (so gates are in use), then:
`idle` (nothing else) and `load` (`--clients` threads invoking an echo function, placed on the
same GPU, as fast as the gateway answers). Prints, per phase, how late the 5 ms periods began (p50/p99/max over the
phase), the longest gap between heartbeats, how many gaps passed the shims' 100 ms staleness
limit (each opens every gate), and the requests per second served. Target: p99 at most 1 ms and
no gate opening, under load, for the default.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.platform import Platform  # the harness that runs `dilu up`
from tests.waiting import eventually


def _manager_stats(platform: Platform) -> dict:
    workers = platform.http.get("/v1/status").json()["workers"]
    return next(w["token_manager"] for w in workers if w.get("token_manager"))


def _phase(platform: Platform, seconds: float, clients: int) -> dict:
    before = _manager_stats(platform)
    stop = time.monotonic() + seconds
    served = [0] * clients

    def hammer(index: int) -> None:
        import httpx

        with httpx.Client(base_url=platform.url, timeout=30) as client:
            while time.monotonic() < stop:
                if client.post("/v1/functions/echo/invoke", json={"n": index}).status_code == 200:
                    served[index] += 1

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    time.sleep(max(0.0, stop - time.monotonic()))     # the phase's length (idle: nothing runs)
    for thread in threads:
        thread.join()
    after = _manager_stats(platform)
    return {**after, "stale_gaps": after["stale_gaps"] - before["stale_gaps"], "rps": sum(served) / seconds}


def _echo_on_the_gpu(base: Path) -> Path:
    """The echo example with a small slice of the simulated GPU (the only device of the worker)."""
    folder = shutil.copytree(ROOT / "examples" / "echo", base / "echo-gpu")
    spec = folder / "model.yaml"
    spec.write_text(spec.read_text().replace("gpu: false", "gpu: true\n  sm_request: 0.1\n  sm_limit: 0.2"))
    return spec


def measure(runs_in: str, seconds: float, clients: int, base: Path) -> dict[str, dict]:
    platform = Platform(base / runs_in, env={"DILU_FAKE_GPUS": "1", "DILU_TOKEN_MANAGER": runs_in,
                                             "DILU_PROFILING": "false"})
    try:
        for spec in (ROOT / "examples/synthetic-gpu/training.yaml", _echo_on_the_gpu(base / runs_in)):
            done = platform.cli("deploy", "--local", str(spec))
            assert done.returncode == 0, done.stderr
        platform.wait_ready("synthetic-training")
        platform.wait_ready("echo")
        assert platform.invoke("echo", {"n": 0}).status_code == 200
        eventually(lambda: _manager_stats(platform)["periods"] > seconds / 0.005, timeout=120,
                   what="a full window of periods")
        return {"idle": _phase(platform, seconds, 0), "load": _phase(platform, seconds, clients)}
    finally:
        platform.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase (the stats cover 10 s)")
    parser.add_argument("--clients", type=int, default=16)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="dilu-bench-jitter-"))
    results = {runs_in: measure(runs_in, args.seconds, args.clients, base) for runs_in in ("thread", "process")}
    print(f"token manager period (5 ms) lateness, {args.seconds:g} s per phase, {args.clients} clients under load")
    print(f"{'manager in':<12}{'phase':<7}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'max gap ms':>12}"
          f"{'gates opened':>14}{'req/s':>9}")
    for runs_in, phases in results.items():
        for phase, row in phases.items():
            jitter = row["jitter_ms"]
            print(f"{runs_in:<12}{phase:<7}{jitter['p50']:>9.3f}{jitter['p99']:>9.3f}{jitter['max']:>9.3f}"
                  f"{row['max_gap_ms']:>12.1f}{row['stale_gaps']:>14}{row['rps']:>9.0f}")
    load = results["process"]["load"]
    met = load["jitter_ms"]["p99"] <= 1.0 and load["stale_gaps"] == 0
    ratio = results["thread"]["load"]["jitter_ms"]["p99"] / max(load["jitter_ms"]["p99"], 1e-3)
    print(f"own process under load: p99 {load['jitter_ms']['p99']:.3f} ms, {load['stale_gaps']} gate openings "
          f"(target <= 1 ms and none: {'met' if met else 'NOT met'}); thread/process p99 under load: {ratio:.1f}x")


if __name__ == "__main__":
    main()
