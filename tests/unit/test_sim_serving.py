"""The serving model's routing, streams and shares on cases small enough to check by hand."""

from __future__ import annotations

import numpy as np
import pytest

from dilu.policy.profiler import Profile, TableRunner
from dilu.sim.models import ModelProfile
from dilu.sim.policies import build_policies
from dilu.sim.serving import ServingSetup, simulate_serving

pytestmark = pytest.mark.unit


def _model(*, generates: bool = False, bound: int = 1, step_s: float = 0.1, slo_s: float = 0.5) -> ModelProfile:
    """Batches (or steps) of 1, 2 and 4 take ``step_s`` on the whole GPU, twice that on half."""
    table = TableRunner([(b, sm, step_s * 100 / sm, b / (step_s * 100 / sm)) for b in (1, 2, 4) for sm in (50, 100)])
    profile = Profile(kind="inference", sm_request=0.5, sm_limit=1.0, batch=1, throughput_per_s=5.0,
                      latency_s=step_s, trials=0)
    return ModelProfile(name="toy", table=table, slo_s=slo_s, profile=profile, memory_gb=1, bound=bound,
                        generates=generates)


def _setup(model: ModelProfile, arrivals: list[float], tokens: list[int] | None = None, **kw) -> ServingSetup:
    values = {"gpus": 1, "gpus_per_node": 1, "trainings": 0, "tick_s": 0.05, "cold_start_s": 0.0,
              "duration_s": 10.0, "keep_alive_s": 60.0, "max_instances": 1, **kw}
    return ServingSetup(arrivals=np.array(arrivals), models=(model,), per_function=(np.array(arrivals),),
                        tokens=None if tokens is None else (np.array(tokens),), **values)


def test_streams_share_the_running_batch_up_to_the_bound() -> None:
    """Two streams of five tokens at 0 and a third at 0.22 on a bound of 4 (whole GPU alone): all
    run together, each first token one step after it joins."""
    result = simulate_serving(build_policies()["exclusive"], _setup(_model(generates=True, bound=4),
                                                                    [0.0, 0.0, 0.22], [5, 5, 5]))
    assert result.served == 3 and result.violations == 0
    assert list(result.latencies) == pytest.approx([0.1, 0.1, 0.18], abs=1e-9)


def test_a_stream_holds_its_slot_for_its_whole_duration() -> None:
    """On a bound of 1 the second stream waits for all five steps of the first: its first token
    comes 0.6 s after it arrived, over the 0.5 s SLO."""
    result = simulate_serving(build_policies()["exclusive"], _setup(_model(generates=True, bound=1),
                                                                    [0.0, 0.0], [5, 5]))
    assert list(result.latencies) == pytest.approx([0.1, 0.6], abs=1e-9)
    assert result.violations == 1 and result.served == 2


def test_a_generator_needs_token_counts() -> None:
    with pytest.raises(ValueError, match="token counts"):
        simulate_serving(build_policies()["exclusive"], _setup(_model(generates=True), [0.0]))


def test_streams_that_fill_every_slot_scale_out_whatever_their_rate() -> None:
    """Eight streams of 100 steps (10 s) on two slots: one arrival a second is no rate, yet the
    occupancy asks for more instances and the later streams wait less."""
    arrivals = [float(i) for i in range(8)]
    setup = _setup(_model(generates=True, bound=2), arrivals, [100] * 8, max_instances=4, gpus=4,
                   gpus_per_node=4, duration_s=40.0, profiled=False)
    result = simulate_serving(build_policies()["dilu"], setup)
    alone = simulate_serving(build_policies()["dilu"], _setup(_model(generates=True, bound=2), arrivals, [100] * 8,
                                                              max_instances=1, duration_s=40.0, profiled=False))
    assert result.starts >= 2, "the occupied slots scaled the function out"
    assert max(result.latencies) < max(alone.latencies)


def test_requests_go_at_once_to_the_instance_with_the_least_outstanding() -> None:
    """As the gateway routes: a burst of twenty is sent to the one instance there is (the second,
    started for it, gets none of it); the next burst spreads over both, ten each."""
    bursts = [0.0] * 20 + [5.0] * 20
    one = simulate_serving(build_policies()["mps"], _setup(_model(), bursts, max_instances=1))
    two = simulate_serving(build_policies()["mps"], _setup(_model(), bursts, max_instances=2, gpus=2,
                                                            gpus_per_node=2))
    assert one.served == two.served == 40
    assert max(two.latencies[:20]) == pytest.approx(2.0) == max(one.latencies[20:])
    assert max(two.latencies[20:]) == pytest.approx(1.0)


def test_training_is_held_only_while_latency_work_runs() -> None:
    """A 0.1 s request each second beside a training job, in half-second ticks: priority
    time-sharing holds training for the 0.1 s, not the whole tick (0.9 of the GPU, not 0.5)."""
    setup = _setup(_model(), [float(i) for i in range(20)], trainings=1, tick_s=0.5, duration_s=20.0)
    result = simulate_serving(build_policies()["tgs"], setup)
    assert result.training_progress / 20 == pytest.approx(0.9, abs=0.02)


def test_an_idle_instance_takes_nothing_from_training() -> None:
    """Fixed slices at the limit (latency 1.0, training 1.0): while the latency instance serves
    both get half; idle (its one request answered) it launches nothing and training has the GPU."""
    setup = _setup(_model(), [0.0], trainings=1, training_slice=(0.3, 1.0), duration_s=20.0)
    result = simulate_serving(build_policies()["horizontal-only"], setup)
    assert result.training_progress / 20 == pytest.approx(1.0, abs=0.02)
