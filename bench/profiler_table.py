"""The profiler's choices on the real GPU profiles in ../shared/data/profiles, against the grid search.

For each model and SLO: the hybrid growth search's (request, limit, batch, throughput) and trial
count beside the exhaustive grid's, and the training search on the largest batch.

    python bench/profiler_table.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dilu.policy.profiler import TableRunner, grid_search, hybrid_growth_search, training_search  # noqa: E402

PROFILES = ROOT.parent / "shared" / "data" / "profiles"
# SLOs for one batch, chosen per model to leave room for batching (about 3x batch-1 latency at 100 %).
SLOS_MS = {"bert_base": 50, "roberta_large": 100, "gpt2_large": 100, "resnet152": 60, "llama2": 100}


def main() -> None:
    print(f"{'model':<14} {'SLO ms':>6} | {'hybrid req/lim':>14} {'batch':>5} {'req/s':>8} {'eff':>6} {'trials':>6} | "
          f"{'grid req/lim':>12} {'batch':>5} {'req/s':>8} {'eff':>6} {'trials':>6} | {'trials ratio':>12} | "
          f"{'training sm':>11} {'trials':>6}")
    for model, slo_ms in SLOS_MS.items():
        runner = TableRunner.from_csv(PROFILES / f"{model}.csv")
        hybrid = hybrid_growth_search(runner, slo_ms / 1000)
        grid = grid_search(runner, slo_ms / 1000, batches=runner.batches)
        training = training_search(runner, batch=max(runner.batches))
        efficacy = lambda p: p.throughput_per_s / (p.sm_request * 100)  # noqa: E731
        print(f"{model:<14} {slo_ms:>6} | {hybrid.sm_request:>6.2f}/{hybrid.sm_limit:<7.2f} {hybrid.batch:>5} "
              f"{hybrid.throughput_per_s:>8.1f} {efficacy(hybrid):>6.2f} {hybrid.trials:>6} | "
              f"{grid.sm_request:>5.2f}/{grid.sm_limit:<6.2f} {grid.batch:>5} {grid.throughput_per_s:>8.1f} "
              f"{efficacy(grid):>6.2f} {grid.trials:>6} | {grid.trials / hybrid.trials:>11.1f}x | "
              f"{training.sm_request:>11.2f} {training.trials:>6}")
    print("req/lim: compute request / limit (knee: smallest share reaching 90 % of full-GPU throughput); "
          "eff: req/s per 1 % of SM")


if __name__ == "__main__":
    main()
