"""The LDS check of docs/counterfactual.md under the one rule of the verdict tables (research/verdicts.py): per
environment and scorer, the mean LDS over the checked rounds with its 95 % t-interval (the rounds of one run as the
sample), and each scorer minus random scores paired by round: the paired t-test, Holm over the scorers of one
environment and outcome, the verdict word only where the Holm p is below 0.05.
It reads the committed printouts of `research/analysis_variants.py counterfactual` (results/make_figures.sh):

    python results/counterfactual_lds.py > results/figures/counterfactual_lds.md
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "research"))
import verdicts  # noqa: E402

FIGURES = os.path.join(ROOT, "results", "figures")
ENVS = {"FrozenLake-v1": "counterfactual_frozenlake.md", "Acrobot-v1": "counterfactual_acrobot.md",
        "MiniGrid-Empty-8x8-v0": "counterfactual_minigrid.md"}


def read(path):
    """{scorer: {round: (LDS on f_return, LDS on the test return or None)}} of a printout's first table"""
    out = {}
    for line in open(path):
        m = re.fullmatch(r"\| (\w+) \| (\d+) \| ([+-][\d.]+) \|(?: ([+-][\d.]+) \|)?\n", line)
        if m:
            out.setdefault(m[1], {})[int(m[2])] = (float(m[3]), None if m[4] is None else float(m[4]))
    return out


def cell(x):
    mean, lo, hi = verdicts.t_interval(x)
    return f"{mean:+.3f} [{lo:+.3f}, {hi:+.3f}]"


print(__doc__.split("\n\n")[0].replace("\n", " ") + "\n")
print("| env | outcome | scorer | rounds | mean LDS | minus random, paired by round | p, Holm | |")
print("|---|---|---|---|---|---|---|---|")
for env, name in ENVS.items():
    lds = read(os.path.join(FIGURES, name))
    for col, outcome in ((0, "f_return"), (1, "test return")):
        found = {scorer: {k: v[col] for k, v in rounds.items() if v[col] is not None} for scorer, rounds in lds.items()}
        found = {scorer: x for scorer, x in found.items() if x}
        fam = verdicts.family({scorer: [x[k] - found["random"][k] for k in x] for scorer, x in found.items()
                               if scorer != "random"}, "+.3f", words=("above random", "below random"), unit="round")
        for scorer, x in found.items():
            row = f"| {env} | {outcome} | {scorer} | {len(x)} | {cell(list(x.values()))} |"
            if scorer == "random":
                print(row + " - | - | |")
                continue
            c = fam[scorer]
            print(row + f" {c['text']} | {verdicts.p_text(c['p_holm'])} | {c['verdict']} |")
