"""The real shim with the fake CUDA driver: interception, gating, slices, failure, fork, memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.shim_harness import BUILD, CAPACITY, build_shim, client_env, running_manager, start_client
from tests.waiting import eventually
from worker.tokens.manager import TokenManager, socket_path_for


@pytest.fixture(scope="module", autouse=True)
def _built() -> None:
    build_shim()


@pytest.fixture
def manager(tmp_path: Path):
    with running_manager(tmp_path) as started:
        yield started


def test_every_launch_path_is_intercepted(tmp_path: Path) -> None:
    (result,) = start_client(client_env(tmp_path), "gpa").lines()
    shim = str(BUILD / "libdilu_shim.so")
    by_case = {(r["symbol"], r["version"], r["flags"], r.get("via")): r["library"] for r in result["resolved"]}
    for (symbol, version, flags, via), library in by_case.items():
        if symbol == "cuInit":
            assert library.endswith("libcuda.so.1"), "entry points the shim does not gate pass through"
        else:
            assert library == shim, (symbol, version, flags, via, library)
    assert result["dlsym"]["cuInit"].endswith("libcuda.so.1")
    assert {k: v for k, v in result["dlsym"].items() if k != "cuInit"} == {
        "cuLaunchKernel": shim, "cuLaunchKernel_ptsz": shim, "cuLaunchKernelEx": shim, "cuGraphLaunch": shim}
    assert result["ptsz_reached"] == 1 and result["ptsz_result"] == 0, "the _ptsz wrapper calls the _ptsz driver"


def test_the_export_list_is_exactly_the_hook_table() -> None:
    import subprocess

    from tests.shim_harness import SHIM_DIR

    subprocess.run(["make", "-s", "-C", str(SHIM_DIR), "check"], check=True, capture_output=True)
    exports = set((BUILD / "exports.txt").read_text().split())
    hooks_source = (SHIM_DIR / "src" / "hooks.c").read_text()
    table = set(__import__("re").findall(r"HOOK\(H_\w+, (\w+)\)", hooks_source))
    request_api = {"dilu_request_begin", "dilu_request_end"}   # what instance servers call (requests.c)
    assert exports == table | {"dlsym"} | request_api, exports ^ (table | {"dlsym"} | request_api)


def test_a_plt_linked_caller_is_gated(manager: TokenManager, tmp_path: Path) -> None:
    import json
    import subprocess

    manager.set_slice("plt", "batch", 0.2, 0.2)
    env = client_env(tmp_path, socket=manager.socket_path, instance="plt")
    done = subprocess.run([str(BUILD / "pltclient"), "1.5", "100"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["share"] == pytest.approx(0.2, abs=0.05)
    assert "ungated" not in done.stderr


def test_threads_share_one_slot(manager: TokenManager, tmp_path: Path) -> None:
    manager.set_slice("threads", "batch", 0.3, 0.3)
    (result,) = start_client(client_env(tmp_path, socket=manager.socket_path, instance="threads"),
                             "threads", 4, 2.0, 100).lines()
    assert all(count > 0 for count in result["launches"])
    assert result["share"] == pytest.approx(0.3, abs=0.05)


def test_no_manager_fails_open_and_says_so_once(tmp_path: Path) -> None:
    client = start_client(client_env(tmp_path, socket=tmp_path / "nobody.sock", instance="lonely"), "run", 1.0, 100, 0)
    (result,) = client.lines()
    assert result["share"] > 0.8
    assert client.stderr.count("no token manager; launches run ungated") == 1


def test_without_the_shim_nothing_is_wrapped(tmp_path: Path) -> None:
    (result,) = start_client(client_env(tmp_path, shim=False), "gpa").lines()
    assert all(r["library"].endswith("libcuda.so.1") for r in result["resolved"])


def test_gating_holds_an_instance_to_its_share(manager: TokenManager, tmp_path: Path) -> None:
    manager.set_slice("solo", "batch", 0.25, 0.25)
    (result,) = start_client(client_env(tmp_path, socket=manager.socket_path, instance="solo"),
                             "run", 2.0, 100, 0).lines()
    assert result["share"] == pytest.approx(0.25, abs=0.05)
    eventually(lambda: "solo" not in manager.telemetry(), timeout=10, what="the slot to be freed on exit")


def test_two_instances_split_the_device_by_their_slices(manager: TokenManager, tmp_path: Path) -> None:
    manager.set_slice("small", "batch", 0.3, 0.3)
    manager.set_slice("large", "batch", 0.7, 0.7)
    small = start_client(client_env(tmp_path, socket=manager.socket_path, instance="small"), "run", 2.5, 100, 0)
    large = start_client(client_env(tmp_path, socket=manager.socket_path, instance="large"), "run", 2.5, 100, 0)
    (a,), (b,) = small.lines(), large.lines()
    assert a["share"] / (a["share"] + b["share"]) == pytest.approx(0.3, abs=0.05)
    assert a["share"] + b["share"] == pytest.approx(1.0, abs=0.1)


def test_a_slice_change_takes_effect(manager: TokenManager, tmp_path: Path) -> None:
    manager.set_slice("resized", "batch", 0.8, 0.8)
    client = start_client(client_env(tmp_path, socket=manager.socket_path, instance="resized"),
                          "phases", 6, 0.5, 100)
    before = client.next_line()["share"]
    manager.set_slice("resized", "batch", 0.2, 0.2)
    after = [line["share"] for line in client.lines()]
    assert before == pytest.approx(0.8, abs=0.08)
    assert after[-1] == pytest.approx(0.2, abs=0.05), after


def test_fail_open_when_the_manager_dies_and_reregister_when_it_returns(tmp_path: Path) -> None:
    path = socket_path_for(tmp_path, "GPU-flaky")
    first = TokenManager(gpu_uuid="GPU-flaky", socket_path=path, capacity_per_s=CAPACITY)
    first.set_slice("flaky", "batch", 0.1, 0.1)
    first.start()
    client = start_client(client_env(tmp_path, socket=path, instance="flaky", extra={"DILU_SHIM_RETRY_MS": "50"}),
                          "phases", 8, 0.5, 100)
    try:
        gated = client.next_line()["share"]
    finally:
        first.stop()
    # Two windows without a manager: the shim notices, runs ungated, keeps trying to come back.
    away = [client.next_line()["share"], client.next_line()["share"]]
    second = TokenManager(gpu_uuid="GPU-flaky", socket_path=path, capacity_per_s=CAPACITY)
    second.set_slice("flaky", "batch", 0.1, 0.1)
    second.start()
    try:
        eventually(lambda: "flaky" in second.telemetry(), timeout=30, what="re-registration")
        back = [line["share"] for line in client.lines()]
    finally:
        second.stop()
    assert gated == pytest.approx(0.1, abs=0.05)
    assert max(away) > 0.6, f"ungated while the manager was away: {away}"
    assert back[-1] == pytest.approx(0.1, abs=0.05), f"gated again after re-registering: {back}"
    assert "stopped answering" in client.stderr and client.stderr.count("registered with the token manager") == 2


def test_a_forked_child_registers_on_its_own(manager: TokenManager, tmp_path: Path) -> None:
    manager.set_slice("forky", "batch", 0.5, 0.5)
    client = start_client(client_env(tmp_path, socket=manager.socket_path, instance="forky"), "fork", 100)
    (result,) = client.lines()
    assert result["child_exit"] == 0
    assert client.stderr.count("registered with the token manager") == 2
    assert f"[dilu-shim {result['child_pid']}] registered" in client.stderr


def test_memory_slice(tmp_path: Path) -> None:
    limit = 8 * 2**20
    (result,) = start_client(client_env(tmp_path, memory_limit=limit), "memory", limit).lines()
    assert result["total"] == limit and result["free_when_full"] == 0
    assert result["refused"] == result["oom"]
    assert result["free_after_free"] == limit // 2 and result["realloc_ok"]


def test_a_runtime_told_its_instance_after_start_is_gated_and_limited(manager: TokenManager, tmp_path: Path) -> None:
    """The runtime pool's spares load the shim before they know their instance; what they are
    told before the first driver call is what the shim obeys."""
    import json

    manager.set_slice("pooled", "batch", 0.25, 0.25)
    limit = 8 * 2**20
    told = json.dumps({"DILU_TOKEN_SOCKET": str(manager.socket_path), "DILU_INSTANCE_ID": "pooled",
                       "DILU_MEMORY_LIMIT": str(limit)})
    unassigned = client_env(tmp_path)   # the shim and the fake driver, nothing about an instance
    (gated,) = start_client(unassigned, "late", told, "run", 2.0, 100, 0).lines()
    (memory,) = start_client(unassigned, "late", told, "memory", limit).lines()
    assert gated["share"] == pytest.approx(0.25, abs=0.05)
    assert memory["total"] == limit and memory["refused"] == memory["oom"]


def test_captured_launches_are_not_charged_until_the_graph_runs(manager: TokenManager, tmp_path: Path) -> None:
    manager.set_slice("graphs", "batch", 1.0, 1.0)
    client = start_client(client_env(tmp_path, socket=manager.socket_path, instance="graphs",
                                     extra={"DILU_SHIM_LOG": "3"}), "capture")
    (result,) = client.lines()
    assert result["captured_device_ns"] == 0 and result["replay_device_ns"] == 1000 * 1000
    assert "graph costs 1000 tokens per replay" in client.stderr


def test_klc_emergency_squeezes_batch_work_and_its_end_gives_the_share_back(tmp_path: Path) -> None:
    """Token-rate control alone (isolation off): the squeeze is on batch work's rate. (With
    isolation the batch factor bounds its queued work instead: tests/unit/test_isolation.py.)"""
    with running_manager(tmp_path, isolation=None) as manager:
        _klc_squeeze(manager, tmp_path)


def _klc_squeeze(manager: TokenManager, tmp_path: Path) -> None:
    manager.set_slice("lat", "latency", 0.5, 1.0)
    manager.set_slice("train", "batch", 0.5, 1.0)
    # Request-like bursts: 40 kernels of 1 ms device time each, then 100 ms idle.
    latency = start_client(client_env(tmp_path, socket=manager.socket_path, instance="lat"),
                           "bursts", 24, 40, 1000, 0.1)
    alone = [latency.next_line()["ms"] for _ in range(6)]  # uncontended cycles set the KLC baseline
    started_batch = __import__("time").monotonic()
    batch = start_client(client_env(tmp_path, socket=manager.socket_path, instance="train"), "phases", 12, 0.5, 100)
    latency.lines()
    batch_shares = [line["share"] for line in batch.lines()]
    emergencies = [event for at, event in manager.events if event.startswith("emergency:lat") and at > started_batch]
    assert emergencies, f"no KLC emergency while batch work ran beside the bursts: {list(manager.events)}"
    assert min(batch_shares[:4]) < 0.6, f"batch work was not squeezed during the bursts: {batch_shares}"
    assert batch_shares[-1] > 0.85, f"batch work did not get its limit back after the bursts: {batch_shares}"
    assert alone, "the latency client reported its bursts"


def test_rtld_next_from_another_interposer_finds_what_follows_it(tmp_path: Path) -> None:
    interposer = str(BUILD / "libnextcaller.so")
    env = client_env(tmp_path)
    env["LD_PRELOAD"] = f"{BUILD / 'libdilu_shim.so'}:{interposer}"       # the shim first, then the tool
    (result,) = start_client(env, "next", interposer).lines()
    assert result["code"] == 0 and result["version"] > 0, "its forwarder reached the driver, not itself"
    assert result["next"].endswith("libcuda.so.1")
    # A gated entry point found through RTLD_NEXT is still the shim's wrapper.
    assert result["next_launch"] == str(BUILD / "libdilu_shim.so")


def test_a_forked_child_honours_shim_disable(manager: TokenManager, tmp_path: Path) -> None:
    env = client_env(tmp_path, socket=manager.socket_path, instance="off", extra={"DILU_SHIM_DISABLE": "1"})
    client = start_client(env, "fork", 100)
    (result,) = client.lines()
    assert result["child_exit"] == 0
    assert "registered with the token manager" not in client.stderr
    assert "off" not in manager.telemetry()


def test_an_instances_processes_share_one_budget(manager: TokenManager, tmp_path: Path) -> None:
    manager.set_slice("workers", "batch", 0.3, 0.3)
    (result,) = start_client(client_env(tmp_path, socket=manager.socket_path, instance="workers"),
                             "forkshare", 2.5, 100).lines()
    assert result["parent_share"] > 0.05 and result["child_share"] > 0.05, "both processes ran"
    assert result["share"] == pytest.approx(0.3, abs=0.05), "two processes, one instance's share"


def test_an_instances_processes_share_one_memory_slice(manager: TokenManager, tmp_path: Path) -> None:
    limit = 10 * 2**20
    client = start_client(client_env(tmp_path, socket=manager.socket_path, instance="pool", memory_limit=limit),
                          "forkmemory", limit)
    (result,) = client.lines()
    assert result["child_oversize"] == result["oom"], "the child cannot take what its parent already holds"
    assert result["total"] == limit
    assert result["free_with_child"] == limit - limit * 6 // 10 - limit * 3 // 10
    assert result["free_after_child"] == limit - limit * 6 // 10, "an exited process's bytes go back"
    assert result["free_at_end"] == limit


@pytest.mark.parametrize("registered", [False, True], ids=["alone", "with-manager"])
def test_virtual_memory_and_pool_allocations_count_against_the_slice(manager: TokenManager, tmp_path: Path,
                                                                      registered: bool) -> None:
    limit = 10 * 2**20
    env = client_env(tmp_path, memory_limit=limit, socket=manager.socket_path if registered else None,
                     instance="vmm")
    (result,) = start_client(env, "vmm", limit).lines()
    assert result["created"] == 0 and result["free_with_handle"] == limit - limit * 6 // 10
    assert result["second"] == result["oom"], "cuMemCreate past the slice fails as the driver fails it"
    assert result["pooled_too_much"] == result["oom"]
    assert result["pooled"] == 0 and result["free_with_both"] == limit - limit * 9 // 10
    assert result["released"] == 0 and result["free_at_end"] == limit, "cuMemRelease gives the bytes back"
    assert result["threshold"] == limit, "a pool may not keep more than the slice"


def test_multi_stream_captures_and_updated_graphs_are_charged_in_full(manager: TokenManager, tmp_path: Path) -> None:
    manager.set_slice("mgraphs", "batch", 1.0, 1.0)
    go = tmp_path / "go"
    client = start_client(client_env(tmp_path, socket=manager.socket_path, instance="mgraphs"), "multicapture", go)
    assert client.next_line()["stage"] == "launched"
    # 100 blocks on the stream that began the capture and 300 on the one that joined it.
    assert manager.telemetry()["mgraphs"]["tokens"] == 400
    go.write_text("")
    assert client.next_line()["stage"] == "updated"
    assert manager.telemetry()["mgraphs"]["tokens"] == 400 + 500, "an updated exec replays its new graph's cost"
    go.write_text("")
    client.lines()


@pytest.mark.parametrize("runs_in", ["thread", "process"])
def test_only_a_manager_in_its_own_process_survives_a_stalled_worker_interpreter(tmp_path: Path,
                                                                                 runs_in: str) -> None:
    """The worker's interpreter busy in one long call (its lock held): a manager thread misses
    its heartbeat and every gate opens; a manager process keeps its period."""
    import random

    from worker.tokens.process import ManagerProcess

    kind = TokenManager if runs_in == "thread" else ManagerProcess
    manager = kind(gpu_uuid="GPU-stall", socket_path=socket_path_for(tmp_path, "GPU-stall"), capacity_per_s=CAPACITY)
    manager.start()
    try:
        manager.set_slice("steady", "batch", 0.5, 0.5)
        client = start_client(client_env(tmp_path, socket=manager.socket_path, instance="steady"),
                              "run", 4.0, 100, 0)
        eventually(lambda: manager.telemetry().get("steady", {}).get("launches", 0) > 0, timeout=30,
                   what="the client to register")
        values = [random.random() for _ in range(2_000_000)]
        for _ in range(3):
            sorted(values)            # one C call: this interpreter's lock is held throughout
        (result,) = client.lines()
        stats = manager.period_stats()
    finally:
        manager.stop()
    if runs_in == "thread":
        assert stats["stale_gaps"] >= 1 and "stopped answering" in client.stderr
    else:
        assert stats["stale_gaps"] == 0, stats
        assert "stopped answering" not in client.stderr
        assert result["share"] == pytest.approx(0.5, abs=0.05)


@pytest.mark.parametrize("measured", [False, True], ids=["open-loop", "closed-loop"])
def test_measured_device_time_makes_shares_hold_for_kernels_of_any_cost(tmp_path: Path, measured: bool) -> None:
    """Two instances at 30/70 whose blocks cost 4:1 in device time (the light one at 70 %).
    Open-loop, tokens (blocks) split 30/70 but device time does not; with the manager reading
    per-process device time from (fake) NVML, each gets its share of the device's time."""
    from worker.tokens.process import ManagerProcess

    env = {"LD_LIBRARY_PATH": str(BUILD / "fake"), "DILU_FAKE_CLOCK": str(tmp_path / "clock")}
    manager = ManagerProcess(gpu_uuid="GPU-costs", socket_path=socket_path_for(tmp_path, "GPU-costs"),
                             capacity_per_s=CAPACITY, measure=measured, env=env)
    manager.start()
    try:
        manager.set_slice("heavy", "batch", 0.3, 0.3)
        manager.set_slice("light", "batch", 0.7, 0.7)
        heavy = start_client(client_env(tmp_path, socket=manager.socket_path, instance="heavy",
                                        extra={"DILU_FAKE_NS_PER_BLOCK": "4000"}), "phases", 8, 0.5, 25)
        light = start_client(client_env(tmp_path, socket=manager.socket_path, instance="light"), "phases", 8, 0.5, 100)
        heavy_phases = [heavy.next_line() for _ in range(6)]
        light_phases = [light.next_line() for _ in range(6)]
        costs = {name: view.get("ns_per_token") for name, view in manager.telemetry().items()}
        heavy_phases += heavy.lines()
        light_phases += light.lines()
    finally:
        manager.stop()
    # The last two seconds (the loop has settled): each one's share of the device's time.
    heavy_share = sum(p["share"] for p in heavy_phases[4:]) / 4
    light_share = sum(p["share"] for p in light_phases[4:]) / 4
    if measured:
        assert heavy_share == pytest.approx(0.3, abs=0.03) and light_share == pytest.approx(0.7, abs=0.03)
        assert costs["heavy"] == pytest.approx(4 * costs["light"], rel=0.15), costs
    else:
        assert abs(heavy_share - 0.3) > 0.1, "open-loop, heavy kernels take more than their share"


def test_a_graph_built_node_by_node_is_charged_its_kernels(manager: TokenManager, tmp_path: Path) -> None:
    manager.set_slice("nodes", "batch", 1.0, 1.0)
    go = tmp_path / "go"
    client = start_client(client_env(tmp_path, socket=manager.socket_path, instance="nodes"), "nodegraph", go)
    assert client.next_line()["stage"] == "launched"
    # 100 + 200 blocks in the graph and 300 in its child graph, for one replay.
    assert manager.telemetry()["nodes"]["tokens"] == 600
    go.write_text("")
    client.lines()
