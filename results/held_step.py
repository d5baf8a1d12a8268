"""IIF held to standard PPO's step (iif_variants.py --hold-step exact): does IIF still gain when every round moves
the policy as far as standard PPO's round from the same theta(k) on the same buffer? The converse of
results/step_control.py (standard PPO at IIF's step); docs/results.md, "IIF at standard PPO's step".

    python results/held_step.py runs          # held-step IIF on the six presets, the Fig. 6(b) protocol of
                                              # results/step-control (5 seeds; BipedalWalker 3 seeds,
                                              # its first 100 rounds), and standard PPO
                                              # and IIF for seeds 4-5 where step-control has 3
    python results/held_step.py proxy --envs FrozenLake-v1 Acrobot-v1 MiniGrid-Empty-8x8-v0 \
        > results/held-step/proxy.md          # --hold-step grad-norm against exact: 20 rounds, seed 1, no tests
    python results/held_step.py table         # the table, from the runs (results/held-step/table.md)

The outside environments' runs (CartPole-v1, MiniGrid-DoorKey-5x5-v0) are results/generic.sh's recipe held,
beside its base and guard recipes; the table reads them too. Every stage skips finished runs and resumes
unfinished ones (iif_variants.py --resume); --envs and --seeds narrow a stage. Runs:
results/held-step/{runs,proxy}/<env>__<label>__<seed>/; standard PPO and IIF of step-control are linked.
"""
import argparse
import math
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "results"))
from step_control import ENVS, FULL, PILOT_ROUNDS, run  # noqa: E402

OUT = os.path.join(ROOT, "results", "held-step")
STEP_CONTROL = os.path.join(ROOT, "results", "step-control", "runs")
SEEDS = {env_id: 3 if env_id == "BipedalWalker-v3" else 5 for env_id in ENVS}
# BipedalWalker's held-step runs: the first 100 rounds of the 250 compared (tested every 2nd), as their cost allows
ROUNDS = {env_id: 100 if env_id == "BipedalWalker-v3" else ENVS[env_id][2] for env_id in ENVS}
HELD = ["--filter-method", "influence", "--hold-step", "exact"]
# the environments outside the paper: results/generic/<recipe>/, the generic defaults (Adam 3e-4, p 0.5)
GENERIC = {"CartPole-v1": 30, "MiniGrid-DoorKey-5x5-v0": 30}  # rounds compared
GENERIC_LABELS = {"none": ("base", "none"), "influence": ("base", "influence"), "guard": ("guard", "influence"),
                  "held": ("held", "influence")}


def stage_runs(envs, seeds):
    runs = os.path.join(OUT, "runs")
    os.makedirs(runs, exist_ok=True)
    for env_id in envs:  # step-control's standard PPO and IIF, as links
        for label in ("none", "influence"):
            for s in range(1, ENVS[env_id][1] + 1):
                link = os.path.join(runs, f"{env_id}__{label}__{s}")
                if not os.path.islink(link):
                    os.symlink(os.path.relpath(os.path.realpath(os.path.join(STEP_CONTROL, f"{env_id}__{label}__{s}")),
                                               runs), link)
    for s in seeds:
        for env_id in envs:
            if s > SEEDS[env_id]:
                continue
            flags = [*ENVS[env_id][0], *FULL.get(env_id, [])]
            held_budget = ["--total-timesteps", str(2048 * ROUNDS[env_id])] if env_id in FULL else []
            run(runs, env_id, "held", s, [*flags, *held_budget, *HELD])
            for label in ("none", "influence"):  # seeds step-control lacks
                if s > ENVS[env_id][1]:
                    run(runs, env_id, label, s, [*flags, "--filter-method", label])


def stage_proxy(envs):
    proxy = os.path.join(OUT, "proxy")
    for env_id in envs:
        for mode in ("exact", "grad-norm"):  # no tests: they would draw from the training's random stream
            run(proxy, env_id, mode, 1, [*ENVS[env_id][0], "--total-timesteps", str(2048 * PILOT_ROUNDS),
                                         "--eval-every", str(10 * PILOT_ROUNDS), "--filter-method", "influence",
                                         "--hold-step", mode])
    import analysis
    print(f"--hold-step grad-norm against exact: seed 1, the first {PILOT_ROUNDS} rounds without tests; KL of IIF's "
          "update over standard PPO's from the same theta(k) (median [10th, 90th percentile] over rounds), the "
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
            ratio = [r["kl"] / r["kl_standard"] for r in rows]
            print(f"| {env_id} | {mode} | {np.median(ratio):.2f} [{np.percentile(ratio, 10):.2f}, "
                  f"{np.percentile(ratio, 90):.2f}] | {np.median([r['lr_scale'] for r in rows]):.2g} | "
                  f"{np.mean([r['n_tries'] for r in rows]):.1f} | "
                  f"{sum(r['t_hold'] for r in rows) / sum(r['t_optim'] for r in rows):.1f} |")


def compare(std, other, n):
    """area (mean test return over the n rounds), final return and SE_ave of other against std, {seed: rows}"""
    import analysis
    seeds = sorted(s for s in other if s in std and min(len(other[s]), len(std[s])) >= n)
    out = dict(seeds=seeds, area=[], final=[], se_ave=[])
    for s in seeds:
        a, b = [r for r in std[s][:n]], [r for r in other[s][:n]]
        tested = [i for i, r in enumerate(a) if not math.isnan(r["test_return_mean"])]
        out["area"].append(np.mean([b[i]["test_return_mean"] - a[i]["test_return_mean"] for i in tested]))
        out["final"].append(b[tested[-1]]["test_return_mean"] - a[tested[-1]]["test_return_mean"])
        out["se_ave"].append(analysis.efficiency(a, b, "records")["se_ave"])
    return out


def cell(x, scale=1.0):
    """mean [95 % t-interval] [95 % bootstrap interval] over seeds"""
    import analysis
    from scipy import stats
    x = scale * np.asarray(x, dtype=float)
    mean, lo, hi = analysis.mean_ci(x)
    h = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)) if len(x) > 1 else math.nan
    fmt = ".1f" if scale != 1 or abs(mean) >= 10 else ".3g"
    return f"{mean:{fmt}} [{mean - h:{fmt}}, {mean + h:{fmt}}] [{lo:{fmt}}, {hi:{fmt}}]"


def stage_table(envs):
    import analysis
    print("IIF held to standard PPO's step (--hold-step exact) against standard PPO and against IIF: differences "
          "of the area (mean test return over the compared rounds), of the final test return and of SE_ave (%, "
          "over standard's record levels; for rows against IIF, SE of held-step IIF measured against IIF), each "
          "the mean over seeds [95 % t-interval] [95 % bootstrap interval]; KL ratio: median over rounds and seeds "
          "of held-step IIF's KL on B(k) over the KL standard PPO's update takes from the same theta(k)\n")
    print("| env | rounds | seeds | comparison | area | final | SE_ave | KL ratio |")
    print("|---|---|---|---|---|---|---|---|")
    sources = [(env_id, ROUNDS[env_id], None) for env_id in envs] + [(e, n, "generic") for e, n in GENERIC.items()]
    landing = []
    for env_id, n, kind in sources:
        if kind == "generic":  # results/generic/<recipe>/<env>__<method>__<seed>
            found = {}
            for label, (recipe, method) in GENERIC_LABELS.items():
                path = os.path.join(ROOT, "results", "generic", recipe)
                found[label] = analysis.load_runs(path, env_id).get(method, {}) if os.path.isdir(path) else {}
        else:
            found = analysis.load_runs(os.path.join(OUT, "runs"), env_id)
        held = found.get("held", {})
        if not held:
            continue
        tried = [r for s in held for r in held[s][:n] if r["n_tries"] > 0]  # rounds that dropped records
        ratios = np.array([r["kl"] / r["kl_standard"] for r in tried])
        ratio = np.median(ratios)
        landing.append(f"| {env_id} | {len(held)} | {np.mean(abs(ratios - 1) <= 0.1):.2f} "
                       f"| {ratio:.2f} | {np.mean([r['n_tries'] for r in tried]):.1f} | "
                       f"{np.median([r['lr_scale'] for r in tried]):.3f} | "
                       f"{sum(r['t_hold'] for r in tried) / sum(r['t_optim'] for r in tried):.1f} |")
        for name, ref, other in [("held - standard", "none", "held"), ("held - IIF", "influence", "held"),
                                 ("held - IIF with the guard", "guard", "held"),
                                 ("IIF - standard", "none", "influence"),
                                 ("IIF with the guard - standard", "none", "guard")]:
            c = compare(found.get(ref, {}), found.get(other, {}), n)
            if not c["seeds"]:
                continue
            print(f"| {env_id} | {n} | {len(c['seeds'])} | {name} | {cell(c['area'])} | {cell(c['final'])} | "
                  f"{cell(c['se_ave'], 100)} | {f'{ratio:.2f}' if other == 'held' else ''} |")
    print("\nThe hold, over every held run's rounds that dropped records (unfinished runs too): the share that ended "
          "within 10 % of standard PPO's KL, the median KL ratio, the updates tried a round, the median learning-"
          "rate multiple kept, and the held step's extra seconds over the seconds of the update it kept\n")
    print("| env | runs | within 10 % | KL ratio | tries | lr multiple | extra / update's seconds |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(landing))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("stage", choices=["runs", "proxy", "table"])
    parser.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3, 4, 5])
    a = parser.parse_args()
    dict(runs=lambda: stage_runs(a.envs, a.seeds), proxy=lambda: stage_proxy(a.envs),
         table=lambda: stage_table(a.envs))[a.stage]()
