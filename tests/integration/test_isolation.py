"""Latency isolation on a simulated GPU without MPS (the fake driver's time-sliced model): the
real shim and token manager holding a training process's work while a latency instance serves."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.shim_harness import build_shim, client_env, running_manager, start_client
from tests.waiting import eventually
from worker.tokens.manager import TokenManager

KERNEL_BLOCKS = 300          # 300 us of device time per training kernel (1 us per block, 1e6 tokens/s)
TIME_SLICED = {"DILU_FAKE_SCHED": "timeslice"}


@pytest.fixture(scope="module", autouse=True)
def _built() -> None:
    build_shim()


@pytest.fixture
def manager(tmp_path: Path):
    with running_manager(tmp_path, "GPU-isolation") as started:
        yield started


def env(tmp_path: Path, manager: TokenManager, instance: str) -> dict[str, str]:
    return client_env(tmp_path, socket=manager.socket_path, instance=instance, extra=TIME_SLICED)


def test_a_latency_instance_serving_never_waits_at_the_gate_while_training_holds_the_device(
        manager: TokenManager, tmp_path: Path) -> None:
    # A slice far smaller than what its requests take: token-rate gating alone makes it wait.
    manager.set_slice("lat", "latency", 0.02, 0.02)
    manager.set_slice("train", "batch", 0.9, 1.0)
    training = start_client(env(tmp_path, manager, "train"), "run", 8.0, KERNEL_BLOCKS, 0)
    eventually(lambda: manager.telemetry().get("train", {}).get("tokens", 0) > 50_000, timeout=30,
               what="the training process to have the device")
    latency = start_client(env(tmp_path, manager, "lat"), "serve", 40, 20, 200, 0.01, tmp_path / "done")
    served = latency.next_line()
    view = manager.telemetry()["lat"]
    (tmp_path / "done").touch()
    latency.lines()
    training.kill()
    assert served["requests"] == 40
    assert view["tokens"] > 40 * 20 * 200, "the requests were charged as usual"
    assert view["blocked_ms"] == 0, f"latency launches waited {view['blocked_ms']} ms for tokens while serving"


@pytest.mark.parametrize("latency_present", [True, False], ids=["beside-latency", "alone"])
def test_training_keeps_at_most_its_window_of_work_unfinished_beside_latency_work(
        manager: TokenManager, tmp_path: Path, latency_present: bool) -> None:
    manager.set_slice("train", "batch", 0.5, 1.0)
    latency = None
    if latency_present:   # a tiny request every half second: the GPU is shared, the window binds
        manager.set_slice("lat", "latency", 0.5, 1.0)
        latency = start_client(env(tmp_path, manager, "lat"), "serve", 100, 1, 1, 0.5)
        eventually(lambda: "lat" in manager.telemetry(), timeout=30, what="the latency instance to register")
    (result,) = start_client(env(tmp_path, manager, "train"), "run", 1.5, KERNEL_BLOCKS, 0).lines()
    if latency is not None:
        latency.kill()
    window_us = manager.isolation.window_s * 1e6
    peak_us = result["peak_outstanding_ns"] / 1000
    if latency_present:
        assert peak_us <= max(window_us, KERNEL_BLOCKS) + 1, f"{peak_us:.0f} us of training work was queued"
        assert result["share"] > 0.5, "with no request in flight, training still has the device"
    else:
        assert peak_us > 10 * window_us, "alone on the GPU, training's queue is not bounded"


def test_a_latency_request_stops_training_releases_and_training_resumes_when_it_ends(
        manager: TokenManager, tmp_path: Path) -> None:
    manager.set_slice("lat", "latency", 0.5, 1.0)
    manager.set_slice("train", "batch", 0.5, 1.0)   # its floor (10 %) is far from due within the request
    training = start_client(env(tmp_path, manager, "train"), "run", 20.0, KERNEL_BLOCKS, 0)

    def charged() -> int:
        return manager.telemetry().get("train", {}).get("tokens", 0)

    eventually(lambda: charged() > 20_000, timeout=30, what="the training process to run")
    go = tmp_path / "go"
    request = start_client(env(tmp_path, manager, "lat"), "hold", go, 0.3)
    assert request.next_line()["stage"] == "serving"     # one token period after the request began
    at_start = charged()
    assert request.next_line()["stage"] == "still serving"
    during = charged() - at_start
    go.touch()
    assert request.next_line()["stage"] == "ended"
    after = charged()
    eventually(lambda: charged() - after > 50 * KERNEL_BLOCKS, timeout=10, what="training to resume")
    training.kill()
    request.lines()
    # Within the 300 ms request, at most the launch that was already waiting for its release.
    assert during <= 2 * KERNEL_BLOCKS, f"training launched {during / KERNEL_BLOCKS:.1f} kernels during the request"


def test_training_keeps_its_floor_under_a_saturating_latency_load(manager: TokenManager, tmp_path: Path) -> None:
    floor = manager.isolation.floor_share
    manager.set_slice("lat", "latency", 0.5, 1.0)
    manager.set_slice("train", "batch", 0.5, 1.0)
    # Requests back to back: a latency instance always serving.
    latency = start_client(env(tmp_path, manager, "lat"), "serve", 5000, 10, 300, 0)
    eventually(lambda: manager.telemetry().get("lat", {}).get("requests_in_flight", 0) > 0, timeout=30,
               what="the latency instance to serve")
    (training,) = start_client(env(tmp_path, manager, "train"), "run", 3.0, KERNEL_BLOCKS, 0).lines()
    latency.kill()
    assert floor - 0.03 <= training["share"] <= floor + 0.1, \
        f"training got {training['share']:.2f} of the device beside a saturating latency load (floor {floor})"


def test_a_latency_instance_killed_while_serving_holds_nobody(manager: TokenManager, tmp_path: Path) -> None:
    manager.set_slice("lat", "latency", 0.5, 1.0)
    manager.set_slice("train", "batch", 0.5, 1.0)
    training = start_client(env(tmp_path, manager, "train"), "run", 20.0, KERNEL_BLOCKS, 0)

    def charged() -> int:
        return manager.telemetry().get("train", {}).get("tokens", 0)

    eventually(lambda: charged() > 20_000, timeout=30, what="the training process to run")
    request = start_client(env(tmp_path, manager, "lat"), "hold", tmp_path / "never", 30)
    assert request.next_line()["stage"] == "serving"
    request.kill()                     # its request never ends
    eventually(lambda: "lat" not in manager.telemetry(), timeout=10, what="the manager to see the instance go")
    resumed = charged()
    eventually(lambda: charged() - resumed > 50 * KERNEL_BLOCKS, timeout=10, what="training to resume")
    held, running = manager.telemetry()["train"]["held_ms"], charged()
    eventually(lambda: charged() - running > 50 * KERNEL_BLOCKS, timeout=10, what="training to go on")
    held_since = manager.telemetry()["train"]["held_ms"] - held
    training.kill()
    assert held > 0, "training was held while the request was in flight"
    assert held_since == 0, f"training was still held {held_since} ms after the serving instance died"
