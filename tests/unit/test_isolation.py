"""Isolation policy: windows, floors and the simulator's shares while latency work is served."""

from __future__ import annotations

import pytest

from dilu.policy.isolation import (
    BatchPeriod,
    IsolationContext,
    IsolationParams,
    IsolationState,
    Occupant,
    decide,
    floor_of,
    shares_while_serving,
    window_tokens,
)

P = IsolationParams()
PERIOD = 0.005
NS_PER_TOKEN = 1000.0   # one token, one microsecond


def period(used_share: float, held: bool = True, request: float = 0.5, name: str = "train") -> BatchPeriod:
    return BatchPeriod(name, request, used_share * PERIOD, held, NS_PER_TOKEN)


def run(periods: list[BatchPeriod], latency_present: bool = True, batch_factor: float = 1.0,
        state: IsolationState | None = None):
    """Feeds one batch instance's periods in order, as the manager does; returns the last decision."""
    state = state or IsolationState()
    decision = None
    for item in periods:
        decision, state = decide(IsolationContext(PERIOD, latency_present, (item,), batch_factor), state)
    return decision, state


@pytest.mark.parametrize(("label", "periods", "latency_present", "factor", "window", "floored"), [
    ("alone on the GPU: unbounded", [period(1.0)], False, 1.0, 0, False),
    ("beside latency work: the window in tokens", [period(1.0, held=False)], True, 1.0, 300, False),
    ("a KLC squeeze shrinks the window", [period(1.0, held=False)], True, 0.5, 150, False),
    ("held but above its floor: no exemption", [period(0.5)] * 10, True, 1.0, 300, False),
    ("held and starved: floor due, a period's window", [period(0.5)] * 10 + [period(0.0)] * 100, True, 1.0, 5000,
     True),
    ("starved but not held (it does not want more)", [period(0.0, held=False)] * 100, True, 1.0, 300, False),
])
def test_windows_and_floors(label: str, periods: list[BatchPeriod], latency_present: bool, factor: float,
                            window: int, floored: bool) -> None:
    decision, _ = run(periods, latency_present, factor)
    assert decision.windows["train"] == window, label
    assert ("train" in decision.floors) == floored, label


def test_the_floor_is_judged_over_the_floor_window_only() -> None:
    keep = round(P.floor_window_s / PERIOD)
    decision, state = run([period(1.0)] * 1000 + [period(0.0)] * (keep - 11))
    assert "train" not in decision.floors, "11 busy periods of 100 in the window: above the 10 % floor"
    assert len(state.used["train"]) == keep, "older periods are forgotten"
    decision, _ = run([period(0.0)] * 2, state=state)
    assert "train" in decision.floors, "9 busy periods of 100: below the floor"


def test_floor_is_ten_percent_or_a_smaller_request() -> None:
    assert floor_of(0.9, P) == P.floor_share == 0.1
    assert floor_of(0.05, P) == 0.05
    assert floor_of(0.0, P) == P.floor_share


def test_window_tokens_follow_the_measured_cost() -> None:
    assert window_tokens(0.0003, 1000.0) == 300
    assert window_tokens(0.0003, 4000.0) == 75
    assert window_tokens(0.0003, 1e9) == 1, "at least one token: a launch can always go"


def test_instances_that_left_are_forgotten() -> None:
    _, state = run([period(0.5, name="old")])
    decision, state = decide(IsolationContext(PERIOD, True, (period(0.5, name="new"),)), state)
    assert set(state.used) == {"new"} and set(decision.windows) == {"new"}


LAT = Occupant("lat", "latency", 0.5, 0.8, serving=True)
TRAIN = Occupant("train", "batch", 0.5, 1.0, serving=True)


@pytest.mark.parametrize(("label", "occupants", "free", "expect"), [
    ("no latency work served: the vertical scaler's shares stand",
     (Occupant("lat", "latency", 0.5, 0.8, serving=False), TRAIN), {"lat": 0.5, "train": 0.9},
     {"lat": 0.5, "train": 0.9}),
    # The shim does not gate a serving latency instance: alone, it has the device while batch
    # work is held, beyond its limit.
    ("serving: batch keeps its floor, latency takes the rest", (LAT, TRAIN), {"lat": 0.5, "train": 0.9},
     {"lat": pytest.approx(0.9), "train": 0.1}),
    ("two serving latency instances split what is left",
     (LAT, Occupant("lat2", "latency", 0.5, 0.8, serving=True), TRAIN), {"train": 0.9},
     {"lat": pytest.approx(0.45), "lat2": pytest.approx(0.45), "train": 0.1}),
    ("an idle latency instance beside a serving one gets nothing",
     (LAT, Occupant("idle", "latency", 0.5, 0.8, serving=False), TRAIN), {"train": 0.9},
     {"lat": pytest.approx(0.9), "idle": 0.0, "train": 0.1}),
    ("a batch share below its floor is not raised", (LAT, TRAIN), {"train": 0.05},
     {"lat": pytest.approx(0.95), "train": 0.05}),
    ("serving latency instances split the rest by their limits",
     (LAT, Occupant("small", "latency", 0.1, 0.2, serving=True), TRAIN), {"train": 0.9},
     {"lat": pytest.approx(0.72), "small": pytest.approx(0.18), "train": 0.1}),
])
def test_shares_while_serving(label: str, occupants: tuple[Occupant, ...], free: dict[str, float],
                              expect: dict[str, float]) -> None:
    assert shares_while_serving(occupants, free) == expect, label
