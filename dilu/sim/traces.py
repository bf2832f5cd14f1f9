"""Request arrivals: the Azure LLM inference traces, the per-second rate shapes, or synthetic
Poisson and Gamma processes; always a sorted array of arrival times in seconds from 0.

Trace names: ``azure-code``, ``azure-conv`` (real timestamps), ``bursty``, ``periodic``,
``sporadic`` (a rate per second, arrivals Poisson within each second; repeated when a longer
duration is asked for), ``poisson:RATE``,
``gamma:RATE:CV`` (inter-arrival times Gamma-distributed with that coefficient of variation),
the named Gamma traces ``gamma-RATE-CV`` of ``GAMMA`` (low rates, very bursty), or a file of
either kind. Random draws use ``seed``, so a run is repeatable.
"""

from __future__ import annotations

import csv
from datetime import datetime
from pathlib import Path

import numpy as np

from dilu.sim.workload import DATA

AZURE = {"azure-code": "AzureLLMInferenceTrace_code.csv", "azure-conv": "AzureLLMInferenceTrace_conv.csv"}
RATE_SHAPES = ("bursty", "periodic", "sporadic")
# Low-rate, very bursty traffic (means of 1-5 requests a second, coefficients of variation 4-8):
# where a rate barely shows the work, and bursts come after gaps.
GAMMA = {f"gamma-{rate}-{cv}": f"gamma:{rate}:{cv}" for rate in (1, 2, 5) for cv in (4, 8)}
NAMED_TRACES = (*RATE_SHAPES, *AZURE, "gamma:20:4", *GAMMA)
DEFAULT_DURATION_S = 900.0


class TraceError(ValueError):
    """A trace name or file that cannot be used; the message says which and why."""


def _azure(path: Path) -> np.ndarray:
    times = []
    with open(path, newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            stamp = row["TIMESTAMP"].strip()
            # "2023-11-16 18:15:46.6805900": more fractional digits than strptime takes.
            whole, _, fraction = stamp.partition(".")
            moment = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").timestamp()
            times.append(moment + (float("0." + fraction) if fraction else 0.0))
    arrivals = np.sort(np.array(times))
    return arrivals - arrivals[0]


def generated_tokens(count: int, rng: np.random.Generator, *, trace: str = "azure-conv", scale: float = 1.0,
                     cap: int | None = None) -> np.ndarray:
    """A generative workload's stream lengths: ``count`` output-token counts drawn (with
    replacement) from the Azure LLM trace's ``GeneratedTokens``, times ``scale`` (at least one
    token), at most ``cap``."""
    if trace not in AZURE:
        raise TraceError(f"no token counts in {trace!r}: use {', '.join(AZURE)}")
    with open(DATA / "traces" / "azure-llm-2023" / AZURE[trace], newline="", encoding="utf-8") as handle:
        counts = np.array([int(row["GeneratedTokens"]) for row in csv.DictReader(handle)], dtype=np.int64)
    drawn = np.maximum(1, np.rint(rng.choice(counts, size=count) * scale)).astype(np.int64)
    return np.minimum(drawn, cap) if cap is not None else drawn


def from_rates(rates: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Poisson arrivals within each second at that second's rate."""
    counts = rng.poisson(np.maximum(rates, 0.0))
    seconds = np.repeat(np.arange(len(rates), dtype=np.float64), counts)
    return np.sort(seconds + rng.random(len(seconds)))


def gamma_arrivals(rate: float, cv: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """Renewal process: Gamma inter-arrival times of mean 1/rate and coefficient of variation cv."""
    shape = 1.0 / (cv * cv)
    count = int(rate * duration_s * 1.5) + 16
    gaps = rng.gamma(shape, 1.0 / (rate * shape), size=count)
    times = np.cumsum(gaps)
    return times[times < duration_s]


def load_trace(name: str, *, scale: float = 1.0, duration_s: float | None = None, seed: int = 0) -> np.ndarray:
    """Arrival times (seconds) of the named trace; ``scale`` multiplies its rate."""
    rng = np.random.default_rng(seed)
    name = GAMMA.get(name, name)
    if scale <= 0:
        raise TraceError(f"trace scale must be positive, got {scale}")
    if name in AZURE:
        arrivals = _azure(DATA / "traces" / "azure-llm-2023" / AZURE[name])
        if scale != 1.0:   # thin or replicate the real arrivals, keeping their timing
            copies = int(np.ceil(scale))
            arrivals = np.sort(np.concatenate([arrivals + rng.random() * 1e-3 for _ in range(copies)]))
            arrivals = arrivals[rng.random(len(arrivals)) < scale / copies]
    elif name in RATE_SHAPES or (Path(name).suffix == ".txt" and Path(name).is_file()):
        path = DATA / "traces" / "rps" / f"{name}.txt" if name in RATE_SHAPES else Path(name)
        rates = np.array([float(x) for x in path.read_text(encoding="utf-8").split()])
        if duration_s is not None and len(rates) and duration_s > len(rates):   # longer: the shape repeats
            rates = np.tile(rates, int(np.ceil(duration_s / len(rates))))
        arrivals = from_rates(rates * scale, rng)
    elif name.startswith("poisson:") or name.startswith("gamma:"):
        parts = name.split(":")
        try:
            rate = float(parts[1]) * scale
            cv = float(parts[2]) if parts[0] == "gamma" else 1.0
        except (IndexError, ValueError):
            raise TraceError(f"trace {name!r}: use poisson:RATE or gamma:RATE:CV") from None
        if rate <= 0 or cv <= 0:
            raise TraceError(f"trace {name!r}: rate and cv must be positive")
        arrivals = gamma_arrivals(rate, cv, duration_s or DEFAULT_DURATION_S, rng)
    elif Path(name).suffix == ".csv" and Path(name).is_file():
        arrivals = _azure(Path(name))
    else:
        raise TraceError(f"no trace {name!r}: use {', '.join([*AZURE, *RATE_SHAPES, *GAMMA])}, poisson:RATE, "
                         "gamma:RATE:CV, or a file")
    if duration_s is not None:
        arrivals = arrivals[arrivals < duration_s]
    return arrivals
