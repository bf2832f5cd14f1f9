"""The profiler's choices on the real GPU profiles in data/profiles, against the exhaustive grid.

For each model and each SLO of a sweep (1.25x to 6x the model's batch-1 latency at the whole
device): the hybrid search's (request, limit, batch) and trials beside the grid's, and two
ratios measured side by side: efficacy (throughput per % of compute at the request) of the
hybrid choice over the grid's, and trials of the hybrid search over the grid's. Trials are
counted twice: those that found the request and batch ("search"), and all of them including
the limit's knee ("total"). The worst case of each ratio closes the table.

    python bench/profiler_table.py [--max-batch 32]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dilu.policy.profiler import TableRunner, grid_search, hybrid_growth_search, training_search

PROFILES = ROOT / "data" / "profiles"
MODELS = ("bert_base", "roberta_large", "gpt2_large", "resnet152", "llama2")
SLO_FACTORS = (1.25, 1.5, 2, 2.5, 3, 4, 5, 6)


def efficacy(profile) -> float:
    return profile.throughput_per_s / (profile.sm_request * 100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-batch", type=int, default=32)
    args = parser.parse_args()
    print(f"{'model':<14} {'SLO ms':>7} | {'hybrid req/lim':>14} {'batch':>5} {'search':>6} {'total':>5} | "
          f"{'grid req/lim':>12} {'batch':>5} {'trials':>6} | {'efficacy':>8} {'search':>6} {'total':>6}")
    worst = {"efficacy": (9.0, ""), "search": (0.0, ""), "total": (0.0, "")}
    for model in MODELS:
        runner = TableRunner.from_csv(PROFILES / f"{model}.csv")
        batches = [b for b in runner.batches if b <= args.max_batch]
        base = runner.trial(1, 100).latency_s
        for factor in SLO_FACTORS:
            slo = base * factor
            hybrid = hybrid_growth_search(runner, slo, max_batch=args.max_batch)
            grid = grid_search(runner, slo, batches=batches)
            ratios = {"efficacy": efficacy(hybrid) / efficacy(grid) if hybrid.meets_slo and grid.meets_slo else 0.0,
                      "search": hybrid.search_trials / grid.trials, "total": hybrid.trials / grid.trials}
            label = f"{model} x{factor:g}"
            if ratios["efficacy"] < worst["efficacy"][0]:
                worst["efficacy"] = (ratios["efficacy"], label)
            for key in ("search", "total"):
                if ratios[key] > worst[key][0]:
                    worst[key] = (ratios[key], label)
            print(f"{model:<14} {slo * 1000:>7.1f} | {hybrid.sm_request:>6.2f}/{hybrid.sm_limit:<7.2f} "
                  f"{hybrid.batch:>5} {hybrid.search_trials:>6} {hybrid.trials:>5} | "
                  f"{grid.sm_request:>5.2f}/{grid.sm_limit:<6.2f} {grid.batch:>5} {grid.trials:>6} | "
                  f"{ratios['efficacy']:>8.3f} {ratios['search']:>6.3f} {ratios['total']:>6.3f}")
    print(f"worst efficacy ratio {worst['efficacy'][0]:.3f} ({worst['efficacy'][1]}); "
          f"worst search-trial ratio {worst['search'][0]:.3f} ({worst['search'][1]}); "
          f"worst total-trial ratio {worst['total'][0]:.3f} ({worst['total'][1]})")
    print("\ntraining search (largest batch): request = 90 % of full throughput, limit = 98 %")
    for model in MODELS:
        runner = TableRunner.from_csv(PROFILES / f"{model}.csv")
        training = training_search(runner, batch=max(runner.batches))
        print(f"  {model:<14} request {training.sm_request:.2f}  limit {training.sm_limit:.2f}  "
              f"trials {training.trials}")


if __name__ == "__main__":
    main()
