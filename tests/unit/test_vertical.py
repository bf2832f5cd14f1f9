"""Vertical policy: KLC detection and the per-period budget allocator, with a fake clock."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from dilu.policy.vertical import InstanceSlice, VerticalContext, VerticalParams, VerticalState, allocate

P = VerticalParams(isolated=False)     # token-rate control alone: latency requests are set aside
ISOLATED = VerticalParams()             # the default: the shim holds batch work while latency serves
LAT = InstanceSlice("lat", "latency", request=0.4, limit=0.8)
LLM = InstanceSlice("llm", "latency", request=0.4, limit=0.8, llm=True)
BATCH = InstanceSlice("batch", "batch", request=0.3, limit=0.9)


class Clock:
    """Runs the allocator period by period, like the token manager does."""

    def __init__(self, slices: Iterable[InstanceSlice], start: float = 100.0, params: VerticalParams = P) -> None:
        self.slices = tuple(slices)
        self.params = params
        self.now = start
        self.state = VerticalState()
        self.shares: dict[str, float] = {}
        self.events: list[str] = []

    def run(self, periods: int, active: Iterable[str] = ()) -> Clock:
        active = frozenset(active)
        for _ in range(periods):
            self.now += P.period_s
            self.shares, self.state = allocate(VerticalContext(self.now, self.slices, active, self.params), self.state)
            self.events += self.state.events
        return self

    def cycle(self, length: int, gap: int = 10, also: Iterable[str] = ()) -> Clock:
        """One latency burst of ``length`` active periods, then ``gap`` idle ones."""
        return self.run(length, {"lat", "llm", *also}).run(gap, set(also))


def test_latency_alone_gets_its_limit() -> None:
    assert Clock([LAT]).run(1, {"lat"}).shares == {"lat": 0.8}


def test_contention_gives_latency_its_request_and_batch_the_rest() -> None:
    clock = Clock([LAT, BATCH]).run(1, {"lat", "batch"})
    assert clock.shares["lat"] == pytest.approx(0.4)
    assert clock.shares["batch"] == pytest.approx(0.6)


def test_isolated_batch_work_is_not_set_aside_for_latency_requests() -> None:
    """The shim holds batch launches while latency work is served, so batch takes up to its limit
    between requests; a KLC emergency still cuts the batch factor, which then bounds the work
    batch may have queued (dilu.policy.isolation), not its rate."""
    clock = Clock([LAT, BATCH], params=ISOLATED).run(1, {"lat", "batch"})
    assert clock.shares == {"lat": pytest.approx(0.4), "batch": pytest.approx(0.9)}
    clock = Clock([LAT, BATCH], params=ISOLATED).cycle(10, also={"batch"})
    clock.run(20, {"lat", "batch"}).run(ISOLATED.idle_gap_periods, {"batch"})   # a cycle stretched 2x
    assert clock.state.batch_factor == pytest.approx(0.5)
    assert clock.run(1, {"lat", "batch"}).shares["batch"] == pytest.approx(0.9)


def test_batch_alone_after_latency_idleness_uses_its_limit() -> None:
    clock = Clock([LAT, BATCH]).run(1, {"lat", "batch"})
    clock.run(int(P.latency_idle_s / P.period_s) - 2, {"batch"})
    assert clock.shares["batch"] == pytest.approx(0.6), "latency was active within the idle window"
    clock.run(3, {"batch"})
    assert clock.shares["batch"] == pytest.approx(0.9)
    assert clock.shares["lat"] == pytest.approx(0.4), "batch is active, so latency stays at its request"


def test_batch_limits_are_scaled_to_fit_the_gpu() -> None:
    a, b = InstanceSlice("a", "batch", 0.5, 0.8), InstanceSlice("b", "batch", 0.5, 0.8)
    clock = Clock([a, b]).run(1, {"a", "b"})
    assert clock.shares == {"a": pytest.approx(0.5), "b": pytest.approx(0.5)}


@pytest.mark.parametrize(("label", "cycles", "expect_factor", "expect_events"), [
    ("uncontended cycles set the baseline", [10, 10, 11], 1.0, []),
    ("short cycles are not counted", [10, 3, 5, 3], 1.0, []),
    ("stretch 2.0 cuts batch in half", [10, 20], 0.5, ["emergency:lat:2.00"]),
    ("stretch 1.5 is below the emergency line", [10, 15], 1.0, []),
    ("outliers are ignored", [10, 45], 1.0, []),
    ("the shortest recent cycle is the baseline", [12, 10, 16], 0.625, ["emergency:lat:1.60"]),
])
def test_klc_cycles(label: str, cycles: list[int], expect_factor: float, expect_events: list[str]) -> None:
    clock = Clock([LAT, BATCH])
    for length in cycles:
        clock.cycle(length, also={"batch"})
    assert clock.state.batch_factor == pytest.approx(expect_factor), label
    assert clock.events == expect_events, label
    assert clock.state.klc["lat"].last_klc == cycles[-1] or cycles[-1] <= P.klc_min_periods


def test_emergency_moves_share_from_batch_to_latency() -> None:
    clock = Clock([LAT, BATCH]).cycle(10, also={"batch"})
    before = clock.run(1, {"lat", "batch"}).shares
    assert before == {"lat": pytest.approx(0.4), "batch": pytest.approx(0.6)}
    clock.run(19, {"lat", "batch"}).run(P.idle_gap_periods, {"batch"})  # a 20-period cycle ends
    after = clock.run(1, {"lat", "batch"}).shares
    assert after["batch"] == pytest.approx(0.3)
    assert after["lat"] == pytest.approx(0.7), "latency takes what batch gave up, up to its limit"


def test_llm_functions_use_the_lower_emergency_line() -> None:
    normal = Clock([LAT, BATCH]).cycle(10, also={"batch"}).cycle(14, also={"batch"})
    llm = Clock([LLM, BATCH]).cycle(10, also={"batch"}).cycle(14, also={"batch"})
    assert normal.state.batch_factor == 1.0
    assert llm.state.batch_factor < 1.0


def test_recovery_grows_batch_back_at_most_every_five_cycles() -> None:
    clock = Clock([LAT, BATCH]).cycle(10, also={"batch"}).cycle(20, also={"batch"})
    cut = clock.state.batch_factor
    for _ in range(4):
        clock.cycle(10, also={"batch"})
    assert clock.state.batch_factor == pytest.approx(cut)
    clock.cycle(10, also={"batch"})
    assert clock.state.batch_factor == pytest.approx(cut * P.recovery_factor)


def test_repeated_emergencies_stop_at_the_floor() -> None:
    clock = Clock([LAT, BATCH]).cycle(10, also={"batch"})
    for _ in range(20):
        clock.cycle(35, also={"batch"})
    assert clock.state.batch_factor == pytest.approx(P.batch_floor)
    clock.run(1, {"lat", "batch"})
    assert clock.shares["batch"] >= P.batch_floor * BATCH.request


def test_latency_idleness_gives_batch_its_limit_back_and_resets_the_factor() -> None:
    clock = Clock([LAT, BATCH]).cycle(10, also={"batch"}).cycle(20, also={"batch"})
    assert clock.state.batch_factor < 1.0
    clock.run(int(P.latency_idle_s / P.period_s) + 2, {"batch"})
    assert clock.state.batch_factor == 1.0
    assert clock.shares["batch"] == pytest.approx(BATCH.limit)
