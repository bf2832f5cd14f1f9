"""The simulator's mechanics on cases small enough to check by hand, and proof that it runs the
controller's own policy code."""

from __future__ import annotations

import numpy as np
import pytest

from dilu.controller import functions as functions_module
from dilu.policy import autoscale, vertical
from dilu.policy.profiler import Profile, TableRunner
from dilu.policy.scheduler import create_scheduler
from dilu.policy.scheduler.plugins.complementary import Complementary
from dilu.sim import policies as sim_policies
from dilu.sim.models import ModelProfile, load_model
from dilu.sim.placement import simulate_placement
from dilu.sim.policies import LIVE, build_policies, parse_policies
from dilu.sim.serving import ServingSetup, _arrivals_for, simulate_serving
from dilu.sim.traces import TraceError, from_rates, load_trace
from dilu.sim.workload import InstanceEvent, WorkloadError, load_workload

pytestmark = pytest.mark.unit


def start(t: float, name: str, kind: str, request: float, memory: float = 10) -> InstanceEvent:
    return InstanceEvent(t, "start", name, kind, 1, request, min(1.0, request * 1.5), memory)


def delete(t: float, name: str) -> InstanceEvent:
    return InstanceEvent(t, "delete", name, "inference", 1, 0, 0, 0)


def test_two_gpus_three_instances_by_hand() -> None:
    events = [start(0, "a", "inference", 0.5), start(1, "b", "training", 0.4), start(2, "c", "inference", 0.6),
              delete(3, "a"), delete(5, "c")]
    # Dilu: b joins a (complementary, 0.9 of a GPU requested), c needs the second GPU.
    dilu = simulate_placement(events, create_scheduler("dilu"), nodes=1, gpus_per_node=2, gpu_memory_gb=40)
    assert dilu.active_gpus == [1, 1, 2, 2, 1] and dilu.peak_gpus == 2 and dilu.waited == 0
    assert dilu.gpu_hours == pytest.approx((1 + 1 + 2 + 2 * 2) / 3600)         # steps of 1, 1, 1, 2 s
    assert dilu.compute_fragmentation[1] == pytest.approx(0.1)                  # 1 - (0.5 + 0.4)
    assert dilu.memory_fragmentation[2] == pytest.approx(1 - 30 / 80)
    # Whole GPUs: c waits for a's GPU, from t=2 to t=3.
    exclusive = simulate_placement(events, create_scheduler("exclusive"), nodes=1, gpus_per_node=2, gpu_memory_gb=40)
    assert exclusive.active_gpus == [1, 2, 2, 2, 1] and exclusive.waited == 1 and exclusive.wait_s == [1]


def _toy_model() -> ModelProfile:
    """One batch size; a batch takes 0.1 s on the whole GPU and 0.2 s on half of it."""
    table = TableRunner([(1, 50, 0.2, 5.0), (1, 100, 0.1, 10.0)])
    profile = Profile(kind="inference", sm_request=0.5, sm_limit=0.5, batch=1, throughput_per_s=5.0,
                      latency_s=0.2, trials=0)
    return ModelProfile(name="toy", table=table, slo_s=0.5, profile=profile, memory_gb=1)


def test_a_known_arrival_sequence_by_hand() -> None:
    setup = ServingSetup(arrivals=np.array([0.0, 10.0]), models=(_toy_model(),), scale_arrivals=False, gpus=1,
                         gpus_per_node=1, trainings=0, tick_s=0.1, cold_start_s=1.0, keep_alive_s=60, duration_s=20,
                         deployed=False)
    result = simulate_serving(build_policies()["mps"], setup)
    # The first request waits for the cold start (1 s), then its batch (0.2 s at half the GPU):
    # over its 0.5 s SLO. The second finds the instance warm: 0.2 s.
    assert result.served == 2 and result.cold_starts == 1 and result.starts == 1
    assert result.latencies[0] == pytest.approx(1.2, abs=0.11) and result.latencies[1] == pytest.approx(0.2, abs=1e-9)
    assert result.violations == 1 and result.slo_violation_rate == 0.5


def test_a_deployed_function_meets_its_first_request_warm_and_a_pre_warm_is_no_cold_start() -> None:
    setup = ServingSetup(arrivals=np.array([0.0, 10.0]), models=(_toy_model(),), scale_arrivals=False, gpus=1,
                         gpus_per_node=1, trainings=0, tick_s=0.1, cold_start_s=1.0, keep_alive_s=5, duration_s=20)
    result = simulate_serving(build_policies()["mps"], setup)
    # The deploy's instance serves the first request; it is unloaded 5 s later, so the second
    # waits for a start: one cold start, one instance start (the deploy's is not counted).
    assert result.latencies[0] == pytest.approx(0.2, abs=1e-9) and result.latencies[1] > 1.0
    assert result.cold_starts == 1 and result.starts == 1


def test_scaled_arrivals_do_not_arrive_in_clumps() -> None:
    setup = ServingSetup(arrivals=np.sort(np.random.default_rng(1).random(200) * 100), models=("resnet152",))
    arrivals = _arrivals_for(setup, load_model("resnet152"), 0, 100.0)
    assert len(arrivals) > 10 * 200, "the trace was replicated"
    # Copies stacked in step would put whole copies within a millisecond of each other.
    assert np.count_nonzero(np.diff(arrivals) < 1e-4) < 0.05 * len(arrivals)


def test_sharing_a_gpu_slows_both_and_training_gets_what_is_left() -> None:
    arrivals = np.arange(0.0, 30.0, 0.25)     # 4 requests per second: busy all the time
    setup = ServingSetup(arrivals=arrivals, models=(_toy_model(),), scale_arrivals=False, gpus=1, gpus_per_node=1,
                         trainings=1, training_slice=(0.5, 1.0), tick_s=0.1, cold_start_s=0.0, duration_s=30)
    fixed = simulate_serving(build_policies()["horizontal-only"], setup)
    # Fixed slices at the limit: the function holds its 0.5, training its 1.0: 1.5 asked, both
    # scaled by 1/1.5.
    assert fixed.training_progress / 30 == pytest.approx(1 / 1.5, abs=0.01)
    priority = simulate_serving(build_policies()["tgs"], setup)
    # Priority time-sharing: the latency job takes the whole GPU whenever it has work (4 requests
    # a second of 0.1 s each: 40 % of the time); training runs in the rest.
    assert priority.training_progress / 30 == pytest.approx(0.6, abs=0.05)


def test_the_simulator_runs_the_controllers_own_policies(monkeypatch: pytest.MonkeyPatch) -> None:
    assert LIVE["allocate"] is vertical.allocate and LIVE["plan"] is autoscale.plan
    assert LIVE["observe"] is autoscale.observe_second
    # The controller decides its counts through the very same composition.
    assert functions_module.plan is autoscale.plan and functions_module.observe_second is autoscale.observe_second
    built = build_policies()
    live = create_scheduler("dilu")
    assert [type(p) for p in built["dilu"].scheduler.filters] == [type(p) for p in live.filters]
    assert [type(p) for p in built["dilu"].scheduler.scores] == [type(p) for p in live.scores]
    assert not any(isinstance(p, Complementary) for p in built["dilu-no-complementary"].scheduler.scores)
    # And it calls them: every share decision of a Dilu run goes through the live allocate.
    calls = []

    def counted(ctx, state):
        calls.append(ctx.now)
        return vertical.allocate(ctx, state)

    monkeypatch.setitem(sim_policies.LIVE, "allocate", counted)
    setup = ServingSetup(arrivals=np.arange(0.0, 5.0, 0.5), models=(_toy_model(),), scale_arrivals=False, gpus=1,
                         gpus_per_node=1, trainings=1, cold_start_s=0.0, duration_s=5)
    plans = []

    def planned(*args):
        plans.append(args[0].now)
        return autoscale.plan(*args)

    monkeypatch.setitem(sim_policies.LIVE, "plan", planned)
    simulate_serving(build_policies()["dilu"], setup)
    assert len(calls) >= 40     # each tick with a running instance
    assert len(plans) == 5      # each second, for the one function


def test_traces_and_workloads() -> None:
    assert len(load_trace("azure-code")) == 8819
    rates = from_rates(np.array([0.0, 100.0, 0.0]), np.random.default_rng(1))
    assert np.all((rates >= 1) & (rates < 2)) and 60 < len(rates) < 140
    gamma = load_trace("gamma:10:2", duration_s=200, seed=3)
    assert 1000 < len(gamma) < 3000 and np.all(np.diff(gamma) >= 0)
    assert np.array_equal(load_trace("gamma-2-8", duration_s=300), load_trace("gamma:2:8", duration_s=300))
    with pytest.raises(TraceError, match="no trace 'nope'"):
        load_trace("nope")
    with pytest.raises(TraceError, match="poisson:RATE"):
        load_trace("poisson:x")
    events = load_workload("instances-100")
    assert events[0].t == 0 and {e.action for e in events} == {"start", "delete"}
    with pytest.raises(WorkloadError, match="instances-100"):
        load_workload("instances-7")
    assert parse_policies("dilu, tgs") == ["dilu", "tgs"] and len(parse_policies("all")) == 8
    with pytest.raises(ValueError, match="unknown policy magic"):
        parse_policies("dilu,magic")


def test_a_bad_workload_line_is_named(tmp_path) -> None:
    bad = tmp_path / "w.txt"
    bad.write_text("{'Time': '2024-06-19 15:46:09', 'Action': 'start', 'Instance': {}}\n")
    with pytest.raises(WorkloadError, match="line 1"):
        load_workload(str(bad))
    bad.write_text("__import__('os').system('true')\n")
    with pytest.raises(WorkloadError, match="line 1"):
        load_workload(str(bad))
