"""What a token costs in device time, per instance, learned from measured device time (pure).

A token is a grid block, and blocks of different kernels take different device time: at the
same token rate, an instance of heavy kernels gets more of the device than one of light kernels.
So every calibration interval the token manager measures each instance's device time (NVML's
per-process utilisation, summed over the instance's processes) and the tokens it consumed; their
ratio is the instance's cost per token, smoothed over intervals. Its token rate is then
``share / cost``: its device time follows its share whatever its kernels cost.

Intervals in which an instance used too little of the device to measure say nothing about its
cost and are skipped; until a first measurement the cost is the device's calibrated default
(one over its capacity in tokens per second).
"""

from __future__ import annotations

from dataclasses import dataclass

WEIGHT = 0.5            # of the newest interval in the running estimate
MIN_DEVICE_SHARE = 0.02  # an instance below this share of an interval is not measured then
BOUND = 100.0           # a measured cost stays within [default / BOUND, default x BOUND]


@dataclass(frozen=True)
class TokenCost:
    ns_per_token: float
    samples: int = 0


def observe(cost: TokenCost | None, *, device_share: float, interval_s: float, tokens: int,
            default_ns_per_token: float) -> TokenCost:
    """The estimate after one interval in which the instance had ``device_share`` of the device
    and consumed ``tokens``."""
    current = cost or TokenCost(default_ns_per_token)
    if tokens <= 0 or interval_s <= 0 or device_share < MIN_DEVICE_SHARE:
        return current
    measured = device_share * interval_s * 1e9 / tokens
    measured = min(max(measured, default_ns_per_token / BOUND), default_ns_per_token * BOUND)
    if current.samples == 0:
        return TokenCost(measured, 1)
    return TokenCost(current.ns_per_token + WEIGHT * (measured - current.ns_per_token), current.samples + 1)


def token_rate(share: float, cost: TokenCost | None, default_ns_per_token: float) -> float:
    """Tokens per second that give ``share`` of the device's time."""
    ns_per_token = cost.ns_per_token if cost is not None else default_ns_per_token
    return share * 1e9 / ns_per_token
