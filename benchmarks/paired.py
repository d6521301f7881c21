"""The paired difference between two stored runs of any configurations (tab:comparison pairs each row's main
configurations only): ``AUC_A - AUC_B`` and ``TPR@1%_A - TPR@1%_B`` with the 95% paired bootstrap interval over
prompts (``metrics.paired_bootstrap``, 1,000 draws as tab:comparison), the pairing checked from the stored runs
(``collect.paired_scores``). Runs of several training seeds are given as comma-separated keys in the same seed order;
their difference is the mean over seeds, with the t-interval over seeds beside it.

    python benchmarks/paired.py --results STORE RUN_A[,RUN_A2,...] RUN_B[,RUN_B2,...]

The READMEs under ``results/reference/`` quote it where they compare configurations of one method.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main() -> None:
    from harness.cell import metrics
    from harness.report.collect import paired_scores
    from harness.report.frames import COMPARISON_DRAWS
    from harness.store.stages import Store

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("a")
    parser.add_argument("b")
    args = parser.parse_args()
    runs_a, runs_b = args.a.split(","), args.b.split(",")
    if len(runs_a) != len(runs_b):
        raise SystemExit("give A and B the same number of runs (one per training seed, in the same order)")
    scores, on = paired_scores(Store(args.results), runs_a, runs_b)
    found = metrics.paired_bootstrap(*scores, bootstrap=COMPARISON_DRAWS)
    print(f"{found['n']} prompts, {found['seeds']} seed(s), paired on {on}")
    for name, key in (("AUC", "auc"), ("TPR@1%", "tpr")):
        lo, hi = found[f"{key}_diff_ci95"]
        line = f"{name} A - B: {found[f'{key}_diff']:+.4f} [{lo:+.4f}, {hi:+.4f}] (prompts)"
        if found["seeds"] > 1:
            line += " [{:+.4f}, {:+.4f}] (seeds)".format(*metrics.seed_interval(found[f"{key}_diff_per_seed"]))
        print(line)


if __name__ == "__main__":
    main()
