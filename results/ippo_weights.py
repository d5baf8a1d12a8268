"""Where I-PPO's loss weights go, from what runs write to episodes.jsonl: per method and task, mean over rounds and
seeds of the kept episodes' effective sample size under the weights, (sum w)^2 / sum w^2 over the kept count (1:
equal weights); the largest weight; the share of the kept episodes whose reward is above the round's mean (on the
chain-of-thought task: the right answers) and the share of the loss weight they carry; and on that task the share of
unfaithful chains among the right answers kept, counted and weighted.

    python results/ippo_weights.py --compact results/frontier/episodes-b0.2.csv.gz    # from the runs, once
    python results/ippo_weights.py > results/figures/ippo_weights.md                  # from that file

The runs' episodes.jsonl are half a megabyte each and not committed; --compact keeps the fields this table reads, of
results/frontier.sh's beta = 0.2 runs (results/ippo.sh's settings, made on the machine of the frontier), in a
committed file of about half a megabyte.
"""
import argparse
import csv
import gzip
import json
import os
from collections import defaultdict

import numpy as np

LABELS = {"i-ppo": "I-PPO", "i-ppo-noreweight": "I-PPO, no reweighting", "i-ppo-v16": "I-PPO, 16 reference answers",
          "influence": "IIF (f_seq)", "none": "PPO"}
FIELDS = ["task", "label", "seed", "round", "kept", "weight", "reward", "right", "faithful"]


def compact(runs, tasks, tag, seeds, out):
    """The fields the table reads, of every <runs>/<task>__<label><tag>__<seed>/episodes.jsonl, into a .csv.gz"""
    with gzip.open(out, "wt", newline="") as f:
        w = csv.writer(f)
        w.writerow(FIELDS)
        for task in tasks:
            for label in LABELS:
                for seed in seeds:
                    path = os.path.join(runs, f"{task}__{label}{tag}__{seed}", "episodes.jsonl")
                    if not os.path.exists(path):
                        continue
                    for line in open(path):
                        e = json.loads(line)
                        w.writerow([task, label, seed, e["round"], int(e["kept"]), f"{e['weight']:.6g}",
                                    f"{e['reward']:.6g}", e.get("right", ""), e.get("faithful", "")])


def load(path):
    """{(task, label): {(seed, round): [episode, ...]}} of a --compact file"""
    out = defaultdict(lambda: defaultdict(list))
    with gzip.open(path, "rt") as f:
        for r in csv.DictReader(f):
            e = dict(kept=r["kept"] == "1", weight=float(r["weight"]), reward=float(r["reward"]),
                     right=r["right"] == "True", faithful=r["faithful"] == "True")
            out[r["task"], r["label"]][r["seed"], int(r["round"])].append(e)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", default="results/frontier/episodes-b0.2.csv.gz", help="a --compact file")
    ap.add_argument("--compact", help="write this file from --runs instead of printing the table")
    ap.add_argument("--runs", default="results/frontier/runs")
    ap.add_argument("--tag", default="-b0.2", help="the label's suffix in the runs' names")
    ap.add_argument("--tasks", nargs="+", default=["ippo-cot", "ippo-detox"])
    ap.add_argument("--seeds", nargs="+", default=["1", "2", "3", "4", "5"])
    a = ap.parse_args()
    if a.compact:
        compact(a.runs, a.tasks, a.tag, a.seeds, a.compact)
        return
    episodes = load(a.episodes)
    print(f"From {a.episodes}")
    for task in a.tasks:
        cot = task.endswith("cot")
        seeds = sorted({seed for (t, _), runs in episodes.items() if t == task for seed, _ in runs})
        print(f"\n{task}: mean over rounds and seeds (seeds {', '.join(seeds)})\n")
        print("| method | effective sample size / kept | largest weight | above-mean reward: share of kept | "
              "their share of the weight |" + (" unfaithful among right kept: counted | weighted |" if cot else ""))
        print("|---|---|---|---|---|" + ("---|---|" if cot else ""))
        for label, name in LABELS.items():
            stats = []
            for round_ in episodes.get((task, label), {}).values():
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
