"""The step and the choice of records, apart (docs/results.md, "IIF at standard PPO's step"). Each round of IIF moves
the policy further than standard PPO's round from the same theta(k) on the same buffer. Holding the step
(iif_variants.py --hold-step exact: the policy's learning rate rescaled until the update's KL on B(k) lands within
10 % of a reference update's, every try from theta(k)'s own state, the critic at its own rate) gives the 2 x 2 of
records (chosen by influence, or all) and step (IIF's, or standard's), and the control for the hold itself:

    standard     all records, standard's step     --filter-method none
    influence    chosen records, IIF's step       --filter-method influence (IIF)
    held         chosen records, standard's step  --filter-method influence --hold-step exact
    held-random  as many dropped at random, held  --filter-method random --hold-step exact
    lifted       all records, IIF's step          --filter-method none --hold-step exact --hold-to influence
    held-critic, held-random-critic: held and held-random, the critic's loss over all of B(k) in every arm
                                                  --critic-records all (and --save-states, for one_round.py)
    random       as many dropped at random        --filter-method random (Fig. 6(b)'s control, unheld)
    reseeded     standard PPO, reseeded after its first rollout: the noise floor of these comparisons, whose
                 arms share theta(0) and B(0)        --filter-method none --reseed-from 0

Held IIF against held random: does choosing the records help at an equal step? Lifted standard against IIF: does
the step explain IIF's gain? Every arm runs at the paper's test protocol (its preset's test episodes; envpool where
ported), so standard PPO and IIF are run again beside the held arms.

    python results/held_step.py runs          # seed by seed: standard, IIF, held, held random; then lifted, random
    python results/held_step.py table > results/held-step/table.md       # every comparison; verdicts: claims.py
    python results/held_step.py proxy > results/held-step/proxy.md   # --hold-step grad-norm against exact

Every stage skips finished runs and resumes unfinished ones (iif_variants.py --resume); --envs, --seeds and --arms
narrow a stage. Runs: results/held-step/runs/<env>__<arm>__<seed>/.
"""
import argparse
import math
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "research"))  # the files beyond the paper
sys.path.insert(0, os.path.join(ROOT, "results"))
from step_control import run  # noqa: E402

OUT = os.path.join(ROOT, "results", "held-step")
GENERIC = ["--optimizer", "adam", "--learning-rate", "3e-4", "--max-grad-norm", "0", "--filter-p", "0.5",
           "--min-agreement", "-1", "--total-timesteps", "61440", "--eval-episodes", "50"]  # results/generic.sh's base
PORT, GYM = ["--env-backend", "envpool"], ["--env-backend", "gymnasium"]  # the backend every run here was made on
# env: (seeds, rounds compared, flags beyond its preset's, the start of every how many rounds the critic arms keep
# for results/one_round.py). BipedalWalker: its first 100 rounds, tested every 2nd, as the cost allows (5 seeds in
# the critic arms, 3 in the others); CartPole and DoorKey: the generic defaults with --filter-method influence
ENVS = {
    "FrozenLake-v1": (5, 50, GYM, 10),
    "Acrobot-v1": (5, 50, PORT, 10),
    "MiniGrid-Empty-8x8-v0": (5, 40, PORT, 8),
    "highway-v0": (5, 100, PORT, 10),
    "LunarLander-v3": (5, 150, PORT, 10),
    "BipedalWalker-v3": (3, 100, [*PORT, "--eval-every", "2", "--total-timesteps", "204800"], 10),
    "CartPole-v1": (5, 30, [*GYM, *GENERIC], 6),
    "MiniGrid-DoorKey-5x5-v0": (5, 30, [*GYM, *GENERIC], 6),
}
ARMS = {
    "standard": ["--filter-method", "none"],
    "influence": ["--filter-method", "influence"],
    "held": ["--filter-method", "influence", "--hold-step", "exact"],
    "held-random": ["--filter-method", "random", "--hold-step", "exact"],
    "lifted": ["--filter-method", "none", "--hold-step", "exact", "--hold-to", "influence"],
    "random": ["--filter-method", "random"],  # Fig. 6(b)'s third method, at the paper's test protocol too
    "reseeded": ["--filter-method", "none", "--reseed-from", "0"],  # the noise floor: standard PPO's own copy
    # held and held-random with the critic's loss over all of B(k): the filter acts on the policy only
    "held-critic": ["--filter-method", "influence", "--hold-step", "exact", "--critic-records", "all"],
    "held-random-critic": ["--filter-method", "random", "--hold-step", "exact", "--critic-records", "all"],
}
CRITIC = ["held-critic", "held-random-critic"]
FIRST = ["standard", "influence", "held", "held-random"]  # they answer the main question; lifted after
# the table's rows: (name, baseline arm, compared arm)
ROWS = [("held IIF - held random", "held-random", "held"), ("held IIF - standard", "standard", "held"),
        ("held random - standard", "standard", "held-random"), ("IIF - standard", "standard", "influence"),
        ("IIF - lifted standard", "lifted", "influence"), ("lifted standard - standard", "standard", "lifted"),
        ("random - standard", "standard", "random"), ("reseeded standard - standard", "standard", "reseeded"),
        ("held IIF - held random, the critic on every record", "held-random-critic", "held-critic")]


def stage_runs(envs, seeds, arms):
    runs = os.path.join(OUT, "runs")
    for group in ([a for a in FIRST if a in arms], [a for a in arms if a not in FIRST]):
        for s in seeds:
            for env_id in envs:
                n_seeds, _, flags, every = ENVS[env_id]
                for arm in group:
                    if s <= (5 if arm in CRITIC else n_seeds):
                        states = ["--save-states", str(every)] if arm in CRITIC else []
                        run(runs, env_id, arm, s, [*flags, *ARMS[arm], *states])


def stage_proxy(envs):
    import analysis
    proxy, rounds = os.path.join(OUT, "proxy"), 20
    for env_id in envs:
        for mode in ("exact", "grad-norm"):  # no tests: they would draw from the training's random stream
            run(proxy, env_id, mode, 1, [*ENVS[env_id][2], "--total-timesteps", str(2048 * rounds), "--eval-every",
                                         str(10 * rounds), "--filter-method", "influence", "--hold-step", mode])
    print(f"--hold-step grad-norm against exact: seed 1, the first {rounds} rounds without tests; KL of IIF's update "
          "over standard PPO's from the same theta(k) (median [10th, 90th percentile] over rounds), the policy's "
          "learning-rate multiple, the updates tried a round, and the held step's extra seconds over the IIF "
          "update's\n")
    print("| env | mode | KL / standard's | lr multiple | tries a round | extra / IIF update's seconds |")
    print("|---|---|---|---|---|---|")
    for env_id in envs:
        for mode in ("exact", "grad-norm"):
            path = os.path.join(proxy, f"{env_id}__{mode}__1", "metrics.csv")
            if not os.path.exists(path):
                continue
            rows = [r for r in analysis.read_metrics(path) if r["n_tries"] > 0]  # rounds that dropped records
            ratio = [r["kl"] / r["kl_ref"] for r in rows]
            print(f"| {env_id} | {mode} | {np.median(ratio):.2f} [{np.percentile(ratio, 10):.2f}, "
                  f"{np.percentile(ratio, 90):.2f}] | {np.median([r['lr_scale'] for r in rows]):.2g} | "
                  f"{np.mean([r['n_tries'] for r in rows]):.1f} | "
                  f"{sum(r['t_hold'] for r in rows) / sum(r['t_optim'] for r in rows):.1f} |")


def compare(base, other, n):
    """Per seed where both ran n rounds ({seed: rows} each): of other against base, the area (mean test return over
    the n rounds), the final return, SE_ave over base's record levels (the paper's reading) and the antisymmetric
    SE_ave (research/verdicts.py: 0 in expectation for exchangeable arms), SE in %"""
    import analysis
    import verdicts
    seeds = sorted(s for s in other if s in base and min(len(other[s]), len(base[s])) >= n)
    out = dict(seeds=seeds, area=[], final=[], se_ave=[], anti=[])
    for s in seeds:
        a, b = base[s][:n], other[s][:n]
        tested = [i for i, r in enumerate(a) if not math.isnan(r["test_return_mean"])]
        out["area"].append(np.mean([b[i]["test_return_mean"] - a[i]["test_return_mean"] for i in tested]))
        out["final"].append(b[tested[-1]]["test_return_mean"] - a[tested[-1]]["test_return_mean"])
        out["se_ave"].append(100 * analysis.efficiency(a, b, "records")["se_ave"])
        out["anti"].append(float(verdicts.antisymmetric(out["se_ave"][-1],
                                                        100 * analysis.efficiency(b, a, "records")["se_ave"])))
    return out


def cell(x):
    """mean [95 % t-interval] over seeds (p of the paired t-test)"""
    import verdicts
    mean, lo, hi = verdicts.t_interval(x)
    fmt = ".1f" if abs(mean) >= 10 else ".3g"
    return f"{mean:{fmt}} [{lo:{fmt}}, {hi:{fmt}}] (p {verdicts.p_text(verdicts.p_value(x))})"


def stage_table(envs):
    import analysis
    print("The step and the choice of records apart, every comparison of the arms (results/held_step.py's docstring)"
          ": per env, of the seeds where both arms ran every compared round, the differences of the area (mean test "
          "return over the compared rounds), of the final test return, of SE_ave over the baseline arm's record "
          "levels (the paper's reading, %) and of the antisymmetric SE_ave (%); each the mean over seeds [95 % "
          "t-interval] (the paired t-test's p). The verdicts, with Holm over each claim's environments, are "
          "results/claims.py's.\n")
    print("| env | rounds | comparison | seeds | area | final | SE_ave, paper's reading % | SE_ave, antisymmetric % |")
    print("|---|---|---|---|---|---|---|---|")
    landing = []
    for env_id in envs:
        path = os.path.join(OUT, "runs")
        if not any(d.startswith(env_id + "__") for d in os.listdir(path)):
            continue
        found, n = analysis.load_runs(path, env_id), ENVS[env_id][1]
        for name, base, other in ROWS:
            c = compare(found.get(base, {}), found.get(other, {}), n)
            if c["seeds"]:
                print(f"| {env_id} | {n} | {name} | {len(c['seeds'])} | {cell(c['area'])} | {cell(c['final'])} | "
                      f"{cell(c['se_ave'])} | {cell(c['anti'])} |")
        for arm in ("held", "held-random", "lifted", *CRITIC):
            held = found.get(arm, {})
            tried = [r for s in held for r in held[s][:n] if r["n_tries"] > 0 and r["kl_ref"] > 0]  # held rounds
            if not tried:
                continue
            ratios = np.array([r["kl"] / r["kl_ref"] for r in tried])
            landing.append(f"| {env_id} | {arm} | {len(held)} | {np.mean(abs(ratios - 1) <= 0.1):.2f} | "
                           f"{np.median(ratios):.2f} | {np.mean([r['n_tries'] for r in tried]):.1f} | "
                           f"{np.median([r['lr_scale'] for r in tried]):.3g} "
                           f"[{np.percentile([r['lr_scale'] for r in tried], 10):.3g}, "
                           f"{np.percentile([r['lr_scale'] for r in tried], 90):.3g}] | "
                           f"{sum(r['t_hold'] for r in tried) / sum(r['t_optim'] for r in tried):.1f} |")
    print("\nThe hold, over every held run's rounds that were held (unfinished runs too): the share that ended within "
          "10 % of the reference update's KL (standard PPO's; IIF's for lifted), the median KL ratio, the updates "
          "tried a round, the policy's learning-rate multiple kept (median [10th, 90th percentile]; the critic's is "
          "1), and the held step's extra seconds over the seconds of the update it kept\n")
    print("| env | arm | runs | within 10 % | KL ratio | tries | policy's lr multiple | extra / update's seconds |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(landing))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("stage", choices=["runs", "proxy", "table"])
    parser.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3, 4, 5])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    a = parser.parse_args()
    dict(runs=lambda: stage_runs(a.envs, a.seeds, a.arms),
         proxy=lambda: stage_proxy(a.envs if a.envs != list(ENVS) else ["FrozenLake-v1", "Acrobot-v1",
                                                                         "MiniGrid-Empty-8x8-v0"]),
         table=lambda: stage_table(a.envs))[a.stage]()
