"""The worker agent with the process runtime: real child processes, real HTTP, real signals."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from dilu.messages import DeviceInfo, WorkerInfo
from dilu.slices import ComputeSlice
from dilu.state.base import Channel
from dilu.state.memory import MemoryStore
from tests.builders import make_start
from tests.conftest import FIXTURE_FUNCTIONS
from tests.waiting import async_eventually
from worker.agent import WorkerAgent
from worker.backends.process import ProcessBackend
from worker.cgroups import CpuLimiter

OK = str(FIXTURE_FUNCTIONS / "ok")

@pytest.fixture
async def agent(tmp_path: Path):
    store = MemoryStore()
    info = WorkerInfo(id="w-test", host="test", url=None,
                      device=DeviceInfo(kind="cpu", uuid=None, name="cpu", memory_bytes=2**33))
    worker = WorkerAgent(info=info, backend=ProcessBackend(state_dir=tmp_path, cpu=CpuLimiter()), store=store,
                         logs_dir=tmp_path / "logs", health_poll_s=0.05, stop_grace_s=5)
    worker.store = store  # for the tests' subscriptions
    yield worker
    await worker.shutdown()

def _cpu_agent(backend: ProcessBackend, tmp_path: Path, worker_id: str) -> WorkerAgent:
    info = WorkerInfo(id=worker_id, host="test", url=None,
                      device=DeviceInfo(kind="cpu", uuid=None, name="cpu", memory_bytes=2**33))
    return WorkerAgent(info=info, backend=backend, store=MemoryStore(), logs_dir=tmp_path / "logs",
                       health_poll_s=0.05, stop_grace_s=5)

async def state_of(agent: WorkerAgent, instance_id: str) -> str:
    return next(s for s in await agent.list_instances() if s.instance_id == instance_id).state

async def until_state(agent: WorkerAgent, instance_id: str, wanted: str, timeout: float = 60) -> None:
    async def reached() -> bool:
        await agent.check_instances()
        return await state_of(agent, instance_id) == wanted

    await async_eventually(reached, timeout=timeout, what=f"{instance_id} to be {wanted}")

async def test_instance_serves_batched_requests_with_its_env_and_options(agent: WorkerAgent) -> None:
    changes = await agent.store.subscribe(Channel.INSTANCES)
    status = await agent.start_instance(make_start("i-ok", OK, env={"GREETING": "hi"}, model={"size": 3},
                                                   batching={"max_batch_size": 4, "max_wait_ms": 50}))
    assert status.state == "starting" and status.endpoint.startswith("http://127.0.0.1:")
    await until_state(agent, "i-ok", "ready")
    assert (await changes.get(timeout=5))["state"] == "starting"
    assert (await changes.get(timeout=5))["state"] == "ready"
    async with httpx.AsyncClient(base_url=status.endpoint) as client:
        assert (await client.get("/health")).json()["status"] == "ready"

        replies = await asyncio.gather(*(client.post("/infer", json={"n": i}) for i in range(4)))
        bodies = [r.json() for r in replies]
        assert [b["input"] for b in bodies] == [{"n": i} for i in range(4)]
        assert {b["greeting"] for b in bodies} == {"hi"}
        assert bodies[0]["options"] == {"size": 3}
        assert max(int(r.headers["x-dilu-batch-size"]) for r in replies) > 1
        assert (await client.post("/infer", content=b"{nope")).status_code == 400
        assert "dilu_instance_batch_size" in (await client.get("/metrics")).text
    await changes.aclose()

async def test_kill_9_is_reported_as_failed_with_the_signal(agent: WorkerAgent) -> None:
    status = await agent.start_instance(make_start("i-kill", OK))
    await until_state(agent, "i-kill", "ready")
    os.kill(status.pid, signal.SIGKILL)
    await until_state(agent, "i-kill", "failed")
    report = next(s for s in await agent.list_instances() if s.instance_id == "i-kill")
    assert report.was_ready and "signal 9" in report.error
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient() as client:
            await client.get(status.endpoint + "/health")

@pytest.mark.parametrize(("folder", "handler", "message"), [
    ("bad_import", "handler:Broken", "No module named 'module_that_does_not_exist'"),
    ("bad_load", "handler:FailsToLoad", "FailsToLoad.load() failed: RuntimeError: weights file is corrupt"),
    ("no_class", "handler:Missing", "handler class 'Missing' not found"),
])
async def test_handler_failures_end_the_instance_with_the_handlers_error(
        agent: WorkerAgent, folder: str, handler: str, message: str) -> None:
    await agent.start_instance(make_start("i-bad", str(FIXTURE_FUNCTIONS / folder), handler=handler))
    await until_state(agent, "i-bad", "failed")
    report = next(s for s in await agent.list_instances() if s.instance_id == "i-bad")
    assert message in report.error and not report.was_ready and report.exit_code == 3
    assert "Traceback" in await agent.read_logs("i-bad")

WARMUP = str(FIXTURE_FUNCTIONS / "warmup")


@pytest.mark.parametrize(("warmup", "seen"), [
    ({"request": {"example": "inline"}, "count": 2}, [{"example": "inline"}, {"example": "inline"}]),
    ({"file": "warmup.json", "count": 1}, [{"example": "from a file"}]),
])
async def test_warmup_requests_run_before_the_instance_is_ready(agent: WorkerAgent, warmup: dict,
                                                                  seen: list) -> None:
    status = await agent.start_instance(make_start("i-warm", WARMUP, handler="handler:Remember", warmup=warmup))
    await until_state(agent, "i-warm", "ready")
    async with httpx.AsyncClient(base_url=status.endpoint, timeout=30) as client:
        first = (await client.post("/infer", json={"user": 1})).json()
        marks = (await client.get("/health")).json()["startup"]
    assert first["seen_before"] == seen, "the first user's request came after the warm-up's"
    assert marks["loaded"] <= marks["warmed"] <= marks["ready"]


@pytest.mark.parametrize(("warmup", "message"), [
    ({"request": {"fail": True}}, "warm-up request failed: this request always fails"),
    ({"file": "missing.json"}, "warm-up file 'missing.json': No such file or directory"),
    ({"file": "handler.py"}, "warm-up file 'handler.py' is not valid JSON"),
    ({"file": "escape.json"}, "outside the function's code"),
])
async def test_a_warmup_that_cannot_run_fails_the_instance_with_why(agent: WorkerAgent, tmp_path: Path,
                                                                    warmup: dict, message: str) -> None:
    code = tmp_path / "code"
    code.mkdir()
    for name in ("handler.py", "warmup.json"):
        (code / name).write_bytes((Path(WARMUP) / name).read_bytes())
    (tmp_path / "secret.json").write_text("{}")
    (code / "escape.json").symlink_to(tmp_path / "secret.json")     # a link out of the code is refused
    await agent.start_instance(make_start("i-cold", str(code), handler="handler:Remember", warmup=warmup))
    await until_state(agent, "i-cold", "failed")
    report = next(s for s in await agent.list_instances() if s.instance_id == "i-cold")
    assert message in report.error and not report.was_ready


async def test_graceful_stop_and_idempotence(agent: WorkerAgent) -> None:
    status = await agent.start_instance(make_start("i-stop", OK))
    again = await agent.start_instance(make_start("i-stop", OK))
    assert again.pid == status.pid
    await until_state(agent, "i-stop", "ready")
    await agent.stop_instance("i-stop")
    assert await state_of(agent, "i-stop") == "stopped"
    await agent.stop_instance("i-stop")
    await agent.stop_instance("unknown")
    with pytest.raises(ProcessLookupError):
        os.kill(status.pid, 0)


async def test_a_stopped_instance_runs_its_handlers_own_clean_up(agent: WorkerAgent, tmp_path: Path) -> None:
    """The instance skips torch's own exit finalizers; the handler's exit handler and finalizer
    still run before it ends."""
    record = tmp_path / "record"
    await agent.start_instance(make_start("i-clean", str(FIXTURE_FUNCTIONS / "clean_exit"),
                                          handler="handler:CleanExit", model={"record_file": str(record)}))
    await until_state(agent, "i-clean", "ready")
    await agent.stop_instance("i-clean")
    assert await state_of(agent, "i-clean") == "stopped"
    assert sorted(record.read_text().split()) == ["atexit", "finalizer"]


async def test_an_instance_stopped_mid_request_answers_it_then_runs_its_clean_up(agent: WorkerAgent,
                                                                                 tmp_path: Path) -> None:
    """A stop drains the request in flight; the signal the server raises again once drained
    still ends the instance through its exit handlers (at the default disposition it killed the
    process before them)."""
    record = tmp_path / "record"
    status = await agent.start_instance(make_start("i-drain", str(FIXTURE_FUNCTIONS / "clean_exit"),
                                                   handler="handler:CleanExit",
                                                   model={"record_file": str(record), "hold_s": 0.5}))
    await until_state(agent, "i-drain", "ready")
    async with httpx.AsyncClient(base_url=status.endpoint, timeout=30) as client:
        reply = asyncio.create_task(client.post("/infer", json={}))
        async def in_flight() -> bool:
            return record.exists() and "request" in record.read_text()

        await async_eventually(in_flight, timeout=30, what="the request to be in flight")
        await agent.stop_instance("i-drain")
        assert (await reply).status_code == 200
    assert await state_of(agent, "i-drain") == "stopped"
    assert sorted(record.read_text().split()) == ["atexit", "finalizer", "request"]


async def test_cpu_slices_throttle_an_instance_and_resize_in_place(agent: WorkerAgent) -> None:
    if not CpuLimiter().available:
        pytest.skip("no writable cgroup cpu controller on this machine")
    status = await agent.start_instance(make_start("i-burn", str(FIXTURE_FUNCTIONS / "cpu_burn"),
                                                   handler="handler:Burn", model={"cpu_ms": 40}))
    await until_state(agent, "i-burn", "ready")
    async with httpx.AsyncClient(base_url=status.endpoint, timeout=30) as client:
        async def stretch() -> float:
            body = (await client.post("/infer", json={})).json()
            return body["wall_ms"] / body["cpu_ms"]

        unlimited = await stretch()
        assert await agent.set_slice("i-burn", ComputeSlice(0.05, 0.05))
        throttled = await stretch()
        assert await agent.set_slice("i-burn", ComputeSlice(1.0, 1.0))
        restored = await stretch()
    assert throttled > 3 * unlimited, (unlimited, throttled)
    assert restored < throttled / 2, (throttled, restored)


async def test_an_instance_loads_unthrottled_and_its_slice_applies_once_ready(agent: WorkerAgent,
                                                                              tmp_path: Path) -> None:
    """A function profiled at 10 % of the host must not import and load at 10 %: the quota is
    lifted while it starts, set when it is ready, and a resize during the start waits for ready."""
    limiter = CpuLimiter()
    if not limiter.available:
        pytest.skip("no writable cgroup cpu controller on this machine")
    release = tmp_path / "release"
    start = make_start("i-slow", str(FIXTURE_FUNCTIONS / "slow_load"), handler="handler:SlowLoad",
                       model={"release_file": str(release)})
    start = replace(start, compute=ComputeSlice(0.1, 0.1))
    await agent.start_instance(start)
    assert await state_of(agent, "i-slow") == "starting"
    assert limiter.share("i-slow") is None, "loading runs without a CPU quota"
    assert await agent.set_slice("i-slow", ComputeSlice(0.2, 0.2)), "a resize while starting is accepted"
    assert limiter.share("i-slow") is None, "... but applies only once ready"
    release.write_text("go")
    await until_state(agent, "i-slow", "ready")
    assert limiter.share("i-slow") == pytest.approx(0.2, rel=0.02)


async def test_a_cpu_instance_starts_in_a_spare_process_with_its_own_env_dir_and_slice(tmp_path: Path) -> None:
    """A spare (interpreter up, instance server imported) takes the instance: it serves with the
    spec's environment and options, from the function's folder, in its cgroup; a new spare is
    started behind it, and closing the backend ends the spares."""
    limiter = CpuLimiter()
    backend = ProcessBackend(state_dir=tmp_path, cpu=limiter, spares=1)
    agent = _cpu_agent(backend, tmp_path, "w-spare")
    try:
        spare_pid = backend.pool().spares[0].process.pid
        status = await agent.start_instance(make_start("i-spare", OK, env={"GREETING": "from a spare"},
                                                       model={"flavour": "warm"}))
        assert status.pid == spare_pid, "the instance ran in the spare process"
        await until_state(agent, "i-spare", "ready")
        async with httpx.AsyncClient(base_url=status.endpoint, timeout=30) as client:
            body = (await client.post("/infer", json={"n": 1})).json()
            marks = (await client.get("/health")).json()["startup"]
        assert body["greeting"] == "from a spare" and body["options"] == {"flavour": "warm"}
        assert body["pid"] == spare_pid
        assert marks["runtime_imported"] == marks["process_start"], "no interpreter start on the critical path"
        assert os.readlink(f"/proc/{spare_pid}/cwd") == OK
        if limiter.available:
            assert "/i-spare" in Path(f"/proc/{spare_pid}/cgroup").read_text()
        assert "ready" in (tmp_path / "logs" / "i-spare.log").read_text(), "its log is the instance's log"
        spares = backend.pool().spares
        assert len(spares) == 1 and spares[0].process.pid != spare_pid, "a new spare waits"
        next_spare = backend.pool().spares[0].process
    finally:
        await agent.shutdown()
    assert next_spare.poll() is not None, "closing the backend ends its spares"


async def test_the_runtime_pool_grows_with_cold_starts_within_its_bounds(tmp_path: Path) -> None:
    """Each spare taken adds one to the pool for a while, never past its maximum, and the pool
    shrinks back once cold starts stop."""
    backend = ProcessBackend(state_dir=tmp_path, spares=1, spares_max=2)
    agent = _cpu_agent(backend, tmp_path, "w-pool")
    snoop = str(FIXTURE_FUNCTIONS / "snoop")
    try:
        assert backend.pool_status() == {"spares": 1, "target": 1, "min": 1, "max": 2, "preloaded": [],
                                         "zygote": backend.pool_status()["zygote"]}
        assert agent.describe()["runtime_pool"]["max"] == 2
        await agent.start_instance(make_start("i-a", snoop, handler="handler:Snoop"))
        assert backend.pool_status()["target"] == 2 and len(backend.pool().spares) == 2
        for name in ("i-b", "i-c"):
            await agent.start_instance(make_start(name, snoop, handler="handler:Snoop"))
            assert len(backend.pool().spares) <= 2 and backend.pool_status()["target"] == 2

        backend.pool().sizer.window_s = 0.2    # the last minute, shortened: no more cold starts come

        async def shrunk() -> bool:
            backend.maintain()
            return backend.pool_status() == {**backend.pool_status(), "spares": 1, "target": 1}

        await async_eventually(shrunk, timeout=30, what="the pool to shrink back to its minimum")
    finally:
        await agent.shutdown()


async def test_spares_preload_a_library_only_while_a_function_that_imports_it_runs(tmp_path: Path) -> None:
    """A worker offering to preload ``wave`` keeps no spare that imports it until a function
    whose code imports it starts; from then its instances start from spares that did the
    import, while other functions' spares never import it; once the last such instance ended
    (and the keep time passed) those spares are gone."""
    backend = ProcessBackend(state_dir=tmp_path, spares=1, spares_max=1, preload=("wave", "no_such_module_xyz"),
                             preload_keep_s=0.0)
    agent = _cpu_agent(backend, tmp_path, "w-preload")
    snoop, importer = str(FIXTURE_FUNCTIONS / "snoop"), str(FIXTURE_FUNCTIONS / "imports_wave")
    needed = ("wave", "no_such_module_xyz")
    try:
        assert backend.pool_status()["preloaded"] == [] and backend.pool(preload=needed) is None
        plain = await agent.start_instance(make_start("i-plain", snoop, handler="handler:Snoop"))
        await until_state(agent, "i-plain", "ready")
        async with httpx.AsyncClient(base_url=plain.endpoint, timeout=30) as client:
            seen = (await client.post("/infer", json={"modules": ["wave"]})).json()
        assert seen["imported"] == {"wave": False}, "a function that does not import it gets a spare without it"
        assert backend.pool(preload=needed) is None

        first = await agent.start_instance(make_start("i-w1", importer, handler="handler:Reporter"))
        pool = backend.pool(preload=needed)
        assert pool is not None and backend.pool_status()["preloaded"] == list(needed)
        assert pool.zygote is not None and first.pid != pool.zygote.process.pid

        async def forked() -> bool:
            backend.maintain()
            return bool(pool.spares)

        await async_eventually(forked, timeout=60, what="a spare forked from the preloading zygote")
        waiting = pool.spares[0].process.pid
        assert _parent_of(waiting) == pool.zygote.process.pid, "no fresh interpreter imports it again"
        second = await agent.start_instance(make_start("i-w2", importer, handler="handler:Reporter"))
        assert second.pid == waiting, "the next instance of it takes a spare of the preloading pool"
        await until_state(agent, "i-w2", "ready")
        async with httpx.AsyncClient(base_url=second.endpoint, timeout=30) as client:
            reply = (await client.post("/infer", json={})).json()
        assert reply == {"preloaded": True, "pid": second.pid}, "wave was imported before the function's code ran"
        (zygote_log,) = (tmp_path / "logs").glob("zygote-*-wave-*.log")
        assert "could not preload no_such_module_xyz" in zygote_log.read_text(), "a module that fails is only noted"

        behind = pool.spares[0].process
        await agent.stop_instance("i-w1", drain=False)
        backend.maintain()
        assert backend.pool(preload=needed) is pool, "kept while one instance that needs it runs"
        await agent.stop_instance("i-w2", drain=False)

        async def let_go() -> bool:
            backend.maintain()
            return backend.pool(preload=needed) is None

        await async_eventually(let_go, timeout=30, what="the preloading pool to end")
        assert behind.poll() is not None and backend.pool_status()["preloaded"] == []
        assert backend.pool() is not None, "the plain pool stays"
    finally:
        await agent.shutdown()


SERVER_MODULE = "worker.instance.http_protocol"    # imported by every spare's zygote


async def test_spares_are_forked_from_the_zygote_and_serve_like_any_instance(tmp_path: Path) -> None:
    """Once the zygote has done its imports, new spares are its forks (they share the imports);
    an instance in one serves with its own environment, log and cgroup, and its exit is reported
    with the signal that ended it."""
    limiter = CpuLimiter()
    backend = ProcessBackend(state_dir=tmp_path, cpu=limiter, spares=1, spares_max=1)
    agent = _cpu_agent(backend, tmp_path, "w-zygote")
    snoop = str(FIXTURE_FUNCTIONS / "snoop")
    try:
        async def zygote_ready() -> bool:
            return backend.pool_status()["zygote"] == "ready"

        await async_eventually(zygote_ready, timeout=60, what="the zygote to finish its imports")
        zygote_pid = backend.pool().zygote.process.pid
        await agent.start_instance(make_start("i-first", snoop, handler="handler:Snoop"))   # takes the slow spare
        forked = backend.pool().spares[0].process
        assert _parent_of(forked.pid) == zygote_pid, "the spare behind it is the zygote's fork"
        status = await agent.start_instance(make_start("i-forked", snoop, handler="handler:Snoop",
                                                       env={"GREETING": "forked"}))
        assert status.pid == forked.pid
        await until_state(agent, "i-forked", "ready")
        async with httpx.AsyncClient(base_url=status.endpoint, timeout=30) as client:
            seen = (await client.post("/infer", json={"modules": [SERVER_MODULE], "env": ["GREETING"]})).json()
        assert seen["imported"] == {SERVER_MODULE: True}, "the zygote's imports are the fork's"
        assert seen["env"] == {"GREETING": "forked"}
        assert not _catches(status.pid, signal.SIGCHLD), "the zygote's wake-up on exits is not the fork's"
        if limiter.available:
            assert "/i-forked" in Path(f"/proc/{status.pid}/cgroup").read_text()
        assert "ready" in (tmp_path / "logs" / "i-forked.log").read_text()
        os.kill(status.pid, signal.SIGKILL)
        await until_state(agent, "i-forked", "failed")
        report = next(s for s in await agent.list_instances() if s.instance_id == "i-forked")
        assert "signal 9" in report.error
    finally:
        await agent.shutdown()
    assert forked.poll() is not None and backend.pool() is None, "closing the backend ends the zygote and its forks"


def _catches(pid: int, sig: int) -> bool:
    caught = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) & (1 << (sig - 1)))


def _parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


async def test_gpu_instances_start_from_a_pool_of_their_own_under_the_shim(tmp_path: Path) -> None:
    """A GPU worker's pool is started with the shim preloaded; an instance specialised from one
    of its spares is told its token manager at assignment, and the shim obeys it (its launches
    are counted under the instance's id; ``test_shim`` shows the memory slice told late too).
    Plain CPU instances keep their own pool."""
    from tests.conftest import ROOT
    from tests.shim_harness import build_shim
    from worker.shimlib import shim_paths
    from worker.tokens.control import GpuControl

    build_shim()
    device = DeviceInfo(kind="gpu", uuid="FAKE-pool", name="fake", memory_bytes=2**34, index=0, fake=True)
    gpu = GpuControl(device=device, shim=shim_paths(), run_dir=tmp_path / "run", capacity_per_s=None,
                     fake_ns_per_block=1000, in_process=True)
    gpu.start()
    backend = ProcessBackend(state_dir=tmp_path, cpu=CpuLimiter(), spares=1, spares_max=1)
    agent = WorkerAgent(info=WorkerInfo(id="w-gpu-pool", host="test", url=None, device=device), backend=backend,
                        store=MemoryStore(), logs_dir=tmp_path / "logs", health_poll_s=0.05, stop_grace_s=5, gpu=gpu)
    gpu_pool, cpu_pool = backend.pool(gpu.injected_at_start()), backend.pool()
    try:
        assert gpu_pool is not None and gpu_pool is not cpu_pool
        assert agent.describe()["runtime_pool"]["spares"] == 1

        async def zygote_ready() -> bool:
            return gpu_pool.status([])["zygote"] == "ready"

        await async_eventually(zygote_ready, timeout=60, what="the GPU pool's zygote")
        spare_pid = gpu_pool.spares[0].process.pid
        cpu_spare_pid = cpu_pool.spares[0].process.pid
        start = make_start("i-gpu", str(ROOT / "examples" / "synthetic-gpu"), handler="handler:LatencyKernels",
                           model={"kernels": 5, "blocks": 100}, resources={"memory": 64 * 2**20})
        status = await agent.start_instance(start)
        assert status.pid == spare_pid, "the GPU instance was specialised from the GPU pool's spare"
        assert cpu_pool.spares[0].process.pid == cpu_spare_pid, "the CPU pool was not touched"
        assert "libdilu_shim.so" in Path(f"/proc/{spare_pid}/maps").read_text()
        await until_state(agent, "i-gpu", "ready")
        async with httpx.AsyncClient(base_url=status.endpoint, timeout=30) as client:
            assert (await client.post("/infer", json={})).json()["kernels"] == 5
        seen = gpu.telemetry()["i-gpu"]
        assert seen["processes"] == 1 and seen["launches"] >= 5, seen
    finally:
        await agent.shutdown()   # stops the token manager too


async def test_a_stop_lets_the_request_in_progress_finish_and_an_idle_instance_exits_cleanly(
        agent: WorkerAgent, tmp_path: Path) -> None:
    """An instance told to stop while serving finishes that request first (idle, it exits at
    once, running its exit handlers, without tearing the interpreter down)."""
    from tests.waiting import eventually

    gate = tmp_path / "go"
    step = str(FIXTURE_FUNCTIONS / "step")
    status = await agent.start_instance(make_start("i-busy", step, handler="handler:Step",
                                                   model={"op": "add", "gate_file": str(gate)}))
    await until_state(agent, "i-busy", "ready")
    async with httpx.AsyncClient(base_url=status.endpoint, timeout=60) as client:
        serving = asyncio.create_task(client.post("/infer", json={"x": 1}))
        await asyncio.to_thread(eventually, lambda: Path(f"{gate}.started").exists(), 30, 0.02, "the request to start")
        stopping = asyncio.create_task(agent.stop_instance("i-busy"))
        gate.write_text("go")
        reply = await serving
        await stopping
    assert reply.status_code == 200 and reply.json() == {"x": 2}, "the request in progress was served"
    report = next(s for s in await agent.list_instances() if s.instance_id == "i-busy")
    assert report.state == "stopped" and report.error is None

    await agent.start_instance(make_start("i-idle", step, handler="handler:Step"))
    await until_state(agent, "i-idle", "ready")
    await agent.stop_instance("i-idle")
    assert agent._backend.exit_code(agent._instances["i-idle"].running) == 0, "a clean exit, not a kill"


class _OnceFailingBackend(ProcessBackend):
    """The process runtime, with one failure reading an instance's exit (a transient OS error)."""

    failures = 1

    def exit_code(self, running):
        if self.failures:
            self.failures -= 1
            raise OSError("transient failure reading the exit status")
        return super().exit_code(running)


async def test_a_failed_pass_over_the_instances_does_not_stop_the_worker(tmp_path: Path) -> None:
    backend = _OnceFailingBackend(state_dir=tmp_path, cpu=CpuLimiter())
    agent = _cpu_agent(backend, tmp_path, "w-resilient")
    runner = asyncio.create_task(agent.run())
    try:
        await agent.start_instance(make_start("i-resilient", OK))

        async def ready() -> bool:      # only the agent's own loop checks the instance
            assert not runner.done(), "the worker's loop ended"
            return await state_of(agent, "i-resilient") == "ready"

        await async_eventually(ready, timeout=60, what="the instance to become ready through the agent's loop")
        assert backend.failures == 0
    finally:
        runner.cancel()
        await agent.shutdown()


def test_code_deployed_by_path_is_read_again_and_a_bundle_once(tmp_path: Path) -> None:
    """A folder deployed by path may change between starts, so its imports are read each time;
    a bundle's content is its digest's, so once."""
    backend = ProcessBackend(state_dir=tmp_path / "state", preload=("wave",), cpu_pool=False)
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "handler.py").write_text("class Echo:\n    pass\n")
    by_path = make_start("i-1", str(folder))
    bundled = dataclasses.replace(make_start("i-2", str(folder)), bundle="sha256:" + "0" * 64)
    assert backend._preloads_of(by_path) == () and backend._preloads_of(bundled) == ()
    (folder / "handler.py").write_text("import wave\n\nclass Echo:\n    pass\n")
    assert backend._preloads_of(by_path) == ("wave",), "the edited folder is read again"
    assert backend._preloads_of(bundled) == (), "a bundle's digest names its content: read once"
    backend.close()
