"""The sweep of results/grpo_frontier.sh at the KL coefficient of results/grpo_filters.sh (detox 0.2, addition
0.04) against that comparison's runs: whether each run trains the same generation batches (reward and kept count
of every one), and, paired by seed, each method minus plain GRPO in the final training reward (trailing mean of
5 generation batches, the comparison's reading), in the training KL that metrics.csv now logs (kl_ref, per
token, over the last 5 batches) and in the final policy's KL to the reference on the test prompts (final.json):
mean [95 % t-interval] over seeds (the paired t-test's p, Holm-adjusted over the methods of one task and column:
research/verdicts.py), higher or lower only where that p is below 0.05.

    python results/grpo_frontier_check.py > results/figures/grpo_frontier_check.md
"""
import csv
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "research"))
import verdicts  # noqa: E402

TASKS = {"detox": "0.2", "add": "0.04"}
SEEDS = range(1, 6)


def rows(path):
    with open(os.path.join(ROOT, "results", path, "metrics.csv")) as f:
        return list(csv.DictReader(f))


def reading(task, label, seed):
    r = rows(f"frontier/runs/grpo-{task}__{label}-b{TASKS[task]}__{seed}")
    with open(os.path.join(ROOT, "results", "frontier", "runs", f"grpo-{task}__{label}-b{TASKS[task]}__{seed}",
                           "final.json")) as f:
        final = json.load(f)
    return (np.mean([float(x["reward_mean"]) for x in r[-5:]]), np.mean([float(x["kl_ref"]) for x in r[-5:]]),
            final["final_kl"])


def differences(task, label):
    """(seeds, 3): the method's readings minus plain GRPO's, seed by seed"""
    return np.array([reading(task, label, s) for s in SEEDS]) - np.array([reading(task, "none", s) for s in SEEDS])


columns = {task: [verdicts.family({lb: differences(task, lb)[:, col] for lb in ("influence", "random")},
                                  words=("higher", "lower")) for col in range(3)] for task in TASKS}
print(__doc__.split("\n\n")[0].replace("\n", " ") + "\n")
print("| task | method | seeds with the comparison's generation batches | final training reward - plain GRPO's "
      "| training KL per token - plain GRPO's | final policy's KL - plain GRPO's |")
print("|---|---|---|---|---|---|")
for task, beta in TASKS.items():
    for label in ("none", "influence", "random"):
        same = sum(all((a["reward_mean"], a["n_kept"]) == (b["reward_mean"], b["n_kept"]) for a, b in zip(
            rows(f"runs/grpo-filters-{task}__{label}__{s}"), rows(f"frontier/runs/grpo-{task}__{label}-b{beta}__{s}")))
            for s in SEEDS)
        cells = []
        if label != "none":
            for col, fmt in ((0, ".3f"), (1, ".2g"), (2, ".2f")):
                c = columns[task][col][label]
                cells.append(f"{c['mean']:+{fmt}} [{c['lo']:+{fmt}}, {c['hi']:+{fmt}}] ({verdicts.p_text(c['p_holm'])}) "
                             f"{c['verdict']}")
        print(f"| {task} (beta {beta}) | {label} | {same} of {len(SEEDS)} | " + " | ".join(cells or ["-"] * 3) + " |")
