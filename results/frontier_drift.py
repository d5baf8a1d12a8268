"""The table of results/frontier_drift.sh's runs: PPO's KL per round (the kl column, summed over a continuation's
tokens, mean over the buffer) in its first 6 rounds on detox, mean [min, max] over 3 seeds, per setting."""
import csv
import glob
import os

import numpy as np

RUNS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "frontier", "drift")
SETTINGS = {"b0.05": "beta 0.05, lr 3e-4, 4 epochs", "b3.2": "beta 3.2, lr 3e-4, 4 epochs",
            "b3.2-lr1e-4": "beta 3.2, lr 1e-4, 4 epochs", "b3.2-epochs1": "beta 3.2, lr 3e-4, 1 epoch"}
print(__doc__.split("\n\n")[0].replace("\n", " ") + "\n")
print("| setting | seeds | " + " | ".join(f"round {k}" for k in range(6)) + " |")
print("|---|---|" + "---|" * 6)
for key, name in SETTINGS.items():
    kl = []
    for path in sorted(glob.glob(os.path.join(RUNS, f"ippo-detox__{key}__*", "metrics.csv"))):
        with open(path) as f:
            rows = list(csv.DictReader(f))
        if len(rows) >= 6:
            kl.append([float(r["kl"]) for r in rows[:6]])
    if kl:
        kl = np.array(kl)
        print(f"| {name} | {len(kl)} | " + " | ".join(
            f"{kl[:, k].mean():.2f} [{kl[:, k].min():.2f}, {kl[:, k].max():.2f}]" for k in range(6)) + " |")
