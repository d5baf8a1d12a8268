"""Where I-PPO's loss weights go, from the episodes.jsonl of results/ippo.sh's runs (written by every run; not
committed, half a megabyte each): per method and task, mean over rounds and seeds of the kept episodes' effective
sample size under the weights, (sum w)^2 / sum w^2 over the kept count (1: equal weights); the largest weight; the
share of the kept episodes whose reward is above the round's mean (on the chain-of-thought task: the right
answers) and the share of the loss weight they carry; and on that task the share of unfaithful chains among the
right answers kept, counted and weighted.

    python results/ippo_weights.py > results/figures/ippo_weights.md
"""
import argparse
import json
import os

import numpy as np

LABELS = {"i-ppo": "I-PPO", "i-ppo-noreweight": "I-PPO, no reweighting", "i-ppo-v16": "I-PPO, 16 reference answers",
          "influence": "IIF (f_seq)", "none": "PPO"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="results/runs")
    ap.add_argument("--tasks", nargs="+", default=["ippo-cot", "ippo-detox"])
    ap.add_argument("--seeds", nargs="+", default=["1", "2", "3", "4", "5"])
    a = ap.parse_args()
    for task in a.tasks:
        cot = task.endswith("cot")
        print(f"\n{task}: mean over rounds and seeds\n")
        print("| method | effective sample size / kept | largest weight | above-mean reward: share of kept | "
              "their share of the weight |" + (" unfaithful among right kept: counted | weighted |" if cot else ""))
        print("|---|---|---|---|---|" + ("---|---|" if cot else ""))
        for label, name in LABELS.items():
            stats = []
            for seed in a.seeds:
                path = os.path.join(a.runs, f"{task}__{label}__{seed}", "episodes.jsonl")
                if not os.path.exists(path):
                    continue
                episodes = [json.loads(line) for line in open(path)]
                for k in sorted({e["round"] for e in episodes}):
                    round_ = [e for e in episodes if e["round"] == k]
                    kept = [e for e in round_ if e["kept"]]
                    if not kept:
                        continue
                    w = np.array([e["weight"] for e in kept])
                    good = np.array([e["reward"] > np.mean([x["reward"] for x in round_]) for e in kept])
                    row = [w.sum() ** 2 / (w ** 2).sum() / len(w), w.max(), good.mean(), w[good].sum() / w.sum()]
                    if cot:
                        right = [(e["faithful"], e["weight"]) for e in kept if e["right"]]
                        row += [np.mean([not f for f, _ in right]) if right else np.nan,
                                sum(x for f, x in right if not f) / sum(x for _, x in right) if right else np.nan]
                    stats.append(row)
            if stats:
                m = np.nanmean(np.array(stats), 0)
                print(f"| {name} | " + " | ".join(f"{x:.2f}" if i != 1 else f"{x:.1f}" for i, x in enumerate(m)) + " |")


if __name__ == "__main__":
    main()
