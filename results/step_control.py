"""Standard PPO at IIF's step size. A round of IIF moves the policy further than a round of standard
PPO (KL(pi_theta(k) || pi_theta(k+1)) on B(k), metrics.csv's kl); does standard PPO with a learning
rate scaled to move as far gain as much as IIF? (docs/results.md, "Standard PPO at IIF's step size")

    python results/step_control.py kl        # FrozenLake, Acrobot, MiniGrid: the Fig. 6(b) runs again,
                                             # now with a kl column (into results/step-control/preset)
    python results/step_control.py pilot     # 20 rounds, no tests, seed 1: standard PPO at lr x each
                                             # multiple, and IIF; picks the multiple whose KL is nearest IIF's
    python results/step_control.py control   # standard PPO at the picked multiple, the Fig. 6(b) protocol
    python results/step_control.py table     # KL and SE of the control, IIF and random against standard

Every stage skips finished runs and resumes unfinished ones (iif_variants.py --resume). --envs and
--seeds narrow a stage. Runs: results/step-control/{preset,pilot,runs}/<env>__<label>__<seed>/.
"""
import argparse
import glob
import json
import math
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "research"))  # analysis_variants.py, verdicts.py
OUT = os.path.join(ROOT, "results", "step-control")
# env: (the flags of its runs in results/runs, its seeds there, the rounds compared)
ENVS = {
    "FrozenLake-v1": (["--env-backend", "gymnasium"], 3, 50),
    "Acrobot-v1": (["--env-backend", "gymnasium", "--eval-episodes", "100"], 3, 50),
    "MiniGrid-Empty-8x8-v0": (["--env-backend", "gymnasium", "--eval-episodes", "100"], 3, 40),
    "highway-v0": ([], 5, 100),
    "LunarLander-v3": (["--eval-episodes", "200"], 5, 150),
    "BipedalWalker-v3": (["--eval-episodes", "100"], 5, 250),
}
# tested every 2nd round; the first 250 rounds of the 500 in results/runs, as results/bipedalwalker-climb
FULL = {"BipedalWalker-v3": ["--eval-every", "2", "--total-timesteps", "512000"]}
NO_KL = ("FrozenLake-v1", "Acrobot-v1", "MiniGrid-Empty-8x8-v0")  # runs/ made before the kl column
MULTIPLES = (1.25, 1.5, 2, 3, 5, 10, 20)
PILOT_ROUNDS = 20


def preset_lr(env_id):
    import iif
    return iif.PRESETS[env_id]["learning_rate"]


def run(runs, env_id, label, seed, flags):
    """iif_variants.py into <runs>/<env>__<label>__<seed>, resumed if unfinished, skipped if finished;
    False if it stopped with an error (a learning rate that diverges: its message is in <run>.err)."""
    name, rounds = f"{env_id}__{label}__{seed}", None
    path = os.path.join(runs, name, "metrics.csv")
    os.makedirs(runs, exist_ok=True)
    cmd = [sys.executable, "research/iif_variants.py", "--env-id", env_id, "--seed", str(seed), "--runs-dir",
           os.path.relpath(runs, ROOT),
           "--run-name", name, "--resume", *flags]
    if os.path.exists(path):
        with open(os.path.join(runs, name, "config.json")) as f:
            rounds = json.load(f)["num_rounds"]
        with open(path) as f:
            if sum(1 for _ in f) - 1 >= rounds:
                print(f"skipped {name}: finished in {os.path.relpath(os.path.join(runs, name), ROOT)}",
                      file=sys.stderr, flush=True)
                return True
    print(" ".join(cmd[1:]), file=sys.stderr, flush=True)  # progress: stdout is the stages' tables
    with open(os.path.join(runs, name + ".err"), "w") as err:
        ok = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err).returncode == 0
    if ok:
        os.remove(os.path.join(runs, name + ".err"))
    return ok


def method_flags(label, env_id):
    if label.startswith("lr"):
        return ["--filter-method", "none", "--learning-rate", f"{preset_lr(env_id) * float(label[2:-1]):g}"]
    return ["--filter-method", label]


def kl_of(path, rounds=None):
    import analysis
    rows = analysis.read_metrics(os.path.join(path, "metrics.csv"))[:rounds]
    return float(np.median([r["kl"] for r in rows]))


def picked():
    with open(os.path.join(OUT, "multiples.json")) as f:
        return json.load(f)


def stage_kl(envs, seeds):
    for s in seeds:
        for env_id in envs:
            if env_id in NO_KL and s <= ENVS[env_id][1]:
                for label in ("none", "influence", "random"):
                    run(os.path.join(OUT, "preset"), env_id, label, s, [*ENVS[env_id][0], *method_flags(label, env_id)])


def stage_pilot(envs):
    pilot = os.path.join(OUT, "pilot")
    labels = ["none", "influence"] + [f"lr{m:g}x" for m in MULTIPLES]
    for env_id in envs:
        for label in labels:  # no test episodes: they would draw from the training's random stream
            run(pilot, env_id, label, 1, [*ENVS[env_id][0], "--total-timesteps", str(2048 * PILOT_ROUNDS), "--eval-every",
                                          str(10 * PILOT_ROUNDS), *method_flags(label, env_id)])
    out = ["Pilot: seed 1, the first 20 rounds without tests; median over rounds of KL(pi_theta(k) || "
           "pi_theta(k+1)) on B(k)\n", "| env | standard | IIF | " + " | ".join(labels[2:]) + " | picked |",
           "|---|---|---|" + "---|" * len(MULTIPLES) + "---|"]
    choice = picked() if os.path.exists(os.path.join(OUT, "multiples.json")) else {}
    for env_id in ENVS:
        paths = {lb: os.path.join(pilot, f"{env_id}__{lb}__1") for lb in labels}
        if not all(os.path.exists(os.path.join(p, "metrics.csv")) or os.path.exists(p + ".err")
                   for p in paths.values()):
            continue
        # a run that stopped (a non-finite loss) has no KL: "diverged"
        kl = {lb: math.nan if os.path.exists(p + ".err") else kl_of(p) for lb, p in paths.items()}
        trained = [m for m in MULTIPLES if not math.isnan(kl[f"lr{m:g}x"])]
        best = min(trained, key=lambda m: abs(math.log(kl[f"lr{m:g}x"] / kl["influence"])))
        choice[env_id] = best
        out.append(f"| {env_id} | " + " | ".join("diverged" if math.isnan(kl[lb]) else f"{kl[lb]:.2g}"
                                                 for lb in labels) + f" | {best:g} |")
    with open(os.path.join(OUT, "multiples.json"), "w") as f:
        json.dump(choice, f, indent=1)
    with open(os.path.join(OUT, "pilot.md"), "w") as f:
        f.write("\n".join(out) + "\n")
    print("\n".join(out))


def stage_control(envs, seeds):
    runs, choice = os.path.join(OUT, "runs"), picked()
    os.makedirs(runs, exist_ok=True)
    for env_id in envs:  # standard PPO, IIF and random of results/runs (with kl: preset/), as links
        src = "../preset" if env_id in NO_KL else "../../runs"
        for label in ("none", "influence", "random"):
            for s in range(1, ENVS[env_id][1] + 1):
                link = os.path.join(runs, f"{env_id}__{label}__{s}")
                if not os.path.islink(link):
                    os.symlink(f"{src}/{env_id}__{label}__{s}", link)
    for s in seeds:
        for env_id in envs:
            if env_id in choice and s <= ENVS[env_id][1]:
                label = f"lr{choice[env_id]:g}x"
                run(runs, env_id, label, s, [*ENVS[env_id][0], *FULL.get(env_id, []), *method_flags(label, env_id)])


def kl(runs, last):
    """median KL over the first `last` rounds of every seed's run; runs: {seed: rows}"""
    return np.median([r["kl"] for s in runs for r in runs[s][:last]])


def stage_table(envs):
    import analysis
    import analysis_variants
    import verdicts
    runs, choice = os.path.join(OUT, "runs"), picked()
    paired = []  # (env, multiple, fmt of the final return, [per-seed differences, the larger step's minus IIF's])
    print("Standard PPO at IIF's step size, against standard PPO: means over seeds [95 % t-interval]; "
          "KL: median over rounds and seeds of KL(pi_theta(k) || pi_theta(k+1)) on B(k), over the pilot's window "
          "(the multiple was picked there) and over all compared rounds; final: test return after the last "
          "compared round, mean ± std over seeds\n")
    print("| env | lr multiple | seeds | method | KL, rounds 0-19 | KL, all rounds | KL / standard's, all "
          "| SE_ave, records | SE_ave, even | SE_peak | final |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for env_id in envs:
        if env_id not in choice:
            continue
        n = ENVS[env_id][2]
        label = f"lr{choice[env_id]:g}x"
        found = analysis.load_runs(runs, env_id)
        seeds = sorted(s for s in found.get(label, {})
                       if min(len(found[label][s]), len(found["none"].get(s, []))) >= n)
        if not seeds:
            continue
        std_kl = kl({s: found["none"][s] for s in seeds}, n)
        per_seed = {}
        for lb in ("influence", label, "random"):  # seeds whose run has all n rounds
            rows = {s: found[lb][s][:n] for s in seeds if len(found.get(lb, {}).get(s, [])) >= n}
            if not rows:
                continue
            std = {s: found["none"][s][:n] for s in rows}
            res = {rd: [analysis_variants.efficiency(std[s], rows[s], rd) for s in rows]
                   for rd in ("records", "even")}
            final = [rows[s][-1]["test_return_mean"] for s in rows]
            per_seed[lb] = {s: (100 * res["records"][i]["se_ave"], 100 * res["even"][i]["se_ave"],
                                100 * res["records"][i]["se_peak"], final[i]) for i, s in enumerate(rows)}
            fmt = ".3f" if max(abs(x) for x in final) <= 1 else ".1f"
            name = {"influence": "IIF", "random": "random"}.get(lb, f"standard, lr x {choice[env_id]:g}")
            print(f"| {env_id} | {choice[env_id]:g} | {len(rows)} | {name} | "
                  f"{kl(rows, PILOT_ROUNDS):.2g} | {kl(rows, n):.2g} | {kl(rows, n) / std_kl:.1f} | "
                  f"{analysis.fmt_ci([e['se_ave'] for e in res['records']])} | "
                  f"{analysis.fmt_ci([e['se_ave'] for e in res['even']])} | "
                  f"{analysis.fmt_ci([e['se_peak'] for e in res['records']])} | "
                  f"{np.mean(final):{fmt}} ± {np.std(final):{fmt}} |")
        final = [found["none"][s][:n][-1]["test_return_mean"] for s in seeds]
        fmt = ".3f" if max(abs(x) for x in final) <= 1 else ".1f"
        std_kl20 = kl({s: found["none"][s] for s in seeds}, PILOT_ROUNDS)
        print(f"| {env_id} | 1 | {len(seeds)} | standard | {std_kl20:.2g} | {std_kl:.2g} | 1.0 | | | | "
              f"{np.mean(final):{fmt}} ± {np.std(final):{fmt}} |")
        both = sorted(set(per_seed.get("influence", {})) & set(per_seed.get(label, {})))
        if len(both) > 1:
            paired.append((env_id, choice[env_id], fmt, [[per_seed[label][s][i] - per_seed["influence"][s][i]
                                                          for s in both] for i in range(4)]))
    print("\nThe larger step against IIF, paired by seed: standard PPO at the multiple minus IIF, mean [95 % "
          "t-interval] (Holm p) and the verdict: the paired t-test, Holm over the environments of a column, ahead or "
          "behind (the larger step's) only where the Holm p is below 0.05\n")
    print("| env | lr multiple | seeds | SE_ave, records | SE_ave, even | SE_peak | final |")
    print("|---|---|---|---|---|---|---|")
    columns = [verdicts.family({env_id: diffs[i] for env_id, _, _, diffs in paired}) for i in range(4)]
    for env_id, m, fmt, diffs in paired:
        cells = []
        for i, fam in enumerate(columns):
            c, f = fam[env_id], fmt if i == 3 else ".1f"
            cells.append(f"{c['mean']:+{f}} [{c['lo']:+{f}}, {c['hi']:+{f}}] ({verdicts.p_text(c['p_holm'])}) "
                         f"{c['verdict']}")
        print(f"| {env_id} | {m:g} | {len(diffs[0])} | {' | '.join(cells)} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("stage", choices=["kl", "pilot", "control", "table"])
    parser.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3, 4, 5])
    a = parser.parse_args()
    dict(kl=lambda: stage_kl(a.envs, a.seeds), pilot=lambda: stage_pilot(a.envs),
         control=lambda: stage_control(a.envs, a.seeds), table=lambda: stage_table(a.envs))[a.stage]()
