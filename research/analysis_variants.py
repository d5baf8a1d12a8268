r"""Analyses beyond the paper's figures, of the runs iif_variants.py and rlhf_variants.py write.

analysis.py reproduces the paper's diagnostics; this file imports it, as iif_variants.py imports iif.py, and adds:

    python research/analysis_variants.py efficiency --runs results/runs --env LunarLander-v3 --rounds 100 --at 0 100 200
    python research/analysis_variants.py frontier --runs results/frontier/runs --env ippo-detox ippo-cot

Each subcommand prints its table and draws its figure in a PNG. "[lo, hi]" is the 95 % t-interval of the mean over
seeds, and every verdict (ahead, behind, not detected) is research/verdicts.py's: the t-test, Holm over a family.
"""
import dataclasses
import functools
import glob
import json
import math
import os
import re
import sys
import zlib
from collections import defaultdict
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Literal

import numpy as np
import scipy.optimize
import scipy.stats
import torch
import tyro

sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # analysis.py and iif.py, one folder up
import analysis
import iif
import iif_variants as variants
from analysis import (COLORS, agent_for, fail, fmt_ci, load_round, load_runs, make_test_envs, mean_ci,
                      planned_rounds, plt, raw_advantages, read_metrics, saved_rounds, smooth, spearman)
import verdicts  # research/verdicts.py: the t-interval, the t-test, Holm and the verdict word of every table

retrain = functools.partial(analysis.retrain, update=variants.ppo_update)  # Stage III with iif_variants.py's switches
mean_t = verdicts.t_interval  # (mean, low, high), the name results/held_step.py reads
LABELS = {**analysis.LABELS, "release-none": "Standard, released code", "release-influence": "IIF, released code",
          "none-all": "Standard, every checkpoint"}  # the runs of results/release (convert.py)


def load_config(run_dir):
    """analysis.load_config with every flag of iif_variants.py: its defaults where iif.py wrote none"""
    config = analysis.load_config(run_dir)
    if "norm_adv" in config:  # runs made before these flags existed used the values below
        config["adv_norm"] = "buffer" if config.pop("norm_adv") else "none"
        config.setdefault("influence_loss", "full")
        config.setdefault("target_adv", "normalized" if config["adv_norm"] == "buffer" else "raw")
        config.setdefault("filter_ties", "drop")
    return {**{f.name: f.default for f in dataclasses.fields(variants.Args) if f.default is not dataclasses.MISSING},
            **variants.ADDED_FLAGS, **config}


# ---- Sec. 5.2's efficiency read other ways: even levels, SE at chosen levels, the first rounds, tested less often ----

def even_levels(returns, n=10):
    """Sec. 5.2's "list of strictly increasing performance levels reached by standard training" read another way: n
    evenly spaced levels above standard's lowest tested return, the last at its peak (the lowest itself is left out:
    standard reaches it before any training shows)"""
    tested = [r for r in returns if not math.isnan(r)]
    return list(np.linspace(min(tested), max(tested), n + 1)[1:])


def efficiency(std_rows, iif_rows, reading="records"):
    """analysis.efficiency over standard's record returns ("records", the paper's levels) or its even levels
    ("even")"""
    return analysis.efficiency(std_rows, iif_rows, even_levels if reading == "even" else "records")


def order_rows(label):
    """rows(env_id, runs, seeds) of the line that says how many of standard's record levels the method reached first,
    at the same round and later (the sign of SE at each level), over the seeds"""
    def rows(env_id, runs, seeds):
        se = [x for s in seeds for x in analysis.efficiency(runs["none"][s], runs[label][s])["se"]]
        first, tied, later = sum(x > 0 for x in se), sum(x == 0 for x in se), sum(x < 0 for x in se)
        return [f"{env_id}: of standard's {len(se)} record levels, {LABELS.get(label, label)} reached {first} first, "
                f"{tied} at the same round, {later} later"]
    return rows


@dataclass
class Efficiency(analysis.Efficiency):
    """analysis.py efficiency, and SE_ave over even levels, SE at chosen levels, on the first rounds, or as if tested
    less often"""
    levels: Literal["both", "records", "even"] = "both"
    """SE_ave's performance levels: standard's record returns, 10 even levels up to its peak, or a column for each"""
    at: tuple[float, ...] = ()
    """also print SE(v) at these test-return levels v"""
    rounds: int = 0
    """compare the first N rounds of each run only (0: all; the released code's LunarLander
    comparison window is 100)"""
    tested_every: int = 1
    """read the test returns of every N-th round only (rounds N-1, 2N-1, ...), as if tested with
    --eval-every N but trained alike: what testing less often does to the numbers"""
    test_episodes: int = 0
    """read each round's test return as if tested on N episodes, not the run's own M (its config.json): plus
    normal noise of sd test_return_std x sqrt(1/N - 1/M), drawn with --noise-seed (0: as recorded)"""
    noise_seed: int = 0
    """the seed of --test-episodes' draws"""


def cmd_efficiency(args):
    if args.rounds < 0:
        fail(f"--rounds must be 0 (all) or a number of rounds, got {args.rounds}")
    if args.tested_every < 1:
        fail(f"--tested-every must be at least 1, got {args.tested_every}")
    name = LABELS.get(args.label, args.label)

    def noisy(rows, env_id, lb, s):  # the test returns of rows as if tested on args.test_episodes episodes
        with open(os.path.join(args.runs, f"{env_id}__{lb}__{s}", "config.json")) as f:
            m = json.load(f)["eval_episodes"]
        if args.test_episodes >= m:
            fail(f"--test-episodes {args.test_episodes} must be below the runs' own {m} test episodes")
        rng = np.random.default_rng([args.noise_seed, int(s), zlib.crc32(lb.encode())])
        sd = np.array([r["test_return_std"] for r in rows]) * math.sqrt(1 / args.test_episodes - 1 / m)
        return [{**r, "test_return_mean": r["test_return_mean"] + e} for r, e in zip(rows, rng.normal(0, sd))]

    def prepare(runs, env_id):
        n, every = args.rounds or None, args.tested_every
        if args.test_episodes:
            runs = {lb: {s: noisy(rows, env_id, lb, s) for s, rows in r.items()} for lb, r in runs.items()}
        return {lb: {s: [row if (row["round"] + 1) % every == 0 else {**row, "test_return_mean": math.nan}
                         for row in rows[:n]] for s, rows in r.items()} for lb, r in runs.items()}

    def at_rows(env_id, runs, seeds):  # seeds whose standard run never reaches v have no SE(v)
        rows = []
        for v in args.at:
            m = [tuple(analysis.first_round([r["test_return_mean"] for r in runs[lb][s]], v)
                       for lb in (args.label, "none")) for s in seeds]
            se = [1 - min(a, len(runs[args.label][s]) + 1) / b for (a, b), s in zip(m, seeds) if b < math.inf]
            rows.append(f"| {env_id} | {name} | {v:g} | {', '.join(f'{a} / {b}' for a, b in m)} | "
                        + (f"{100 * np.mean(se):.1f} % ({len(se)} of {len(m)} seeds) |" if se else "- |"))
        return rows
    heading = (f"\nSE at chosen levels v (rounds to reach v, {name} / standard, per seed):\n\n"
               "| env | method | v | m / m_std | SE(v) |\n|---|---|---|---|---|\n")
    readings = [(f"SE_ave, {r}", even_levels if r == "even" else r) for r in ("records", "even")
                if args.levels in ("both", r)]
    said = {"both": "record returns and/or 10 even levels up to its peak", "records": "record returns",
            "even": "10 even levels up to its peak"}[args.levels]
    analysis.cmd_efficiency(args, prepare, readings, said, [("\n", order_rows(args.label)), (heading, at_rows)])


# ---- The released code's recipes, one row each (results/ablation) ----

@dataclass
class Ablation:
    """SE_ave, SE_peak, RT_peak and standard PPO's returns, one row per recipe"""
    variants: tuple[str, ...]
    """recipe folders, one row each"""
    env: tuple[str, ...]
    """env ids"""
    runs: str = "results/ablation"
    """folder of one <recipe>/ folder of runs per recipe"""
    at_round: int = 10
    """also print standard PPO's test return after this round"""
    complete: tuple[str, ...] = ()
    """ENV=ROUNDS: count only seeds whose two runs hold this many rounds (unfinished runs are
    skipped)"""
    seeds: tuple[str, ...] = ()
    """only these seeds (default: every seed with a standard and an IIF run)"""


def cmd_ablation(args):
    """One row per recipe: IIF against standard PPO under it (means over seeds [95 % t-intervals]),
    and the final test returns of standard PPO, IIF and random filtering."""
    def pm(x, fmt):
        return f"{np.mean(x):{fmt}} ± {np.std(x):{fmt}}" if len(x) else "-"
    rounds = {e: int(n) for e, n in (c.split("=") for c in args.complete)}
    moves = []
    print("SE in %, mean over seeds [95 % t-interval]; returns: mean ± std over seeds\n")
    print(f"| env | recipe | seeds | SE_ave, records | SE_ave, even | SE_peak | RT_peak "
          f"| standard, round {args.at_round} | standard, final | IIF, final | random, final |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for env_id in args.env:
        for variant in args.variants:
            path = os.path.join(args.runs, variant)
            runs = {}
            if glob.glob(os.path.join(path, f"{env_id}__*", "metrics.csv")):
                runs = load_runs(path, env_id)
            seeds = sorted(set(runs.get("none", {})) & set(runs.get("influence", {})))
            if args.seeds:
                seeds = [s for s in seeds if s in args.seeds]
            if env_id in rounds:
                seeds = [s for s in seeds
                         if len(runs["none"][s]) == len(runs["influence"][s]) == rounds[env_id]]
            if not seeds:  # a recipe not run on this env
                continue
            res = [efficiency(runs["none"][s], runs["influence"][s]) for s in seeds]
            even = [efficiency(runs["none"][s], runs["influence"][s], "even") for s in seeds]
            final = {m: [runs[m][s][-1]["test_return_mean"] for s in seeds
                         if s in runs.get(m, {}) and len(runs[m][s]) == len(runs["none"][s])]
                     for m in ("none", "influence", "random")}
            at = [runs["none"][s][args.at_round - 1]["test_return_mean"] for s in seeds]
            fmt = ".3f" if np.abs(final["none"]).max() <= 1 else ".0f"  # success rates, or returns
            se = [fmt_ci([r["se_ave"] for r in res]), fmt_ci([r["se_ave"] for r in even]),
                  fmt_ci([r["se_peak"] for r in res]), fmt_ci([r["rt_peak"] for r in res])]
            returns = [pm(at, fmt)] + [pm(final[m], fmt) for m in ("none", "influence", "random")]
            print(f"| {env_id} | {variant} | {len(seeds)} | {' | '.join(se)} "
                  f"| {' | '.join(returns)} |")
            rows = {m: [r for s in seeds for r in runs[m][s]] for m in ("none", "influence")}
            if all("kl" in r for m in rows for r in rows[m]):  # runs that log it
                kl = [np.median([r["kl"] for r in rows[m]]) for m in ("none", "influence")]
                filtered = np.mean([r["n_dropped"] > 0 for r in rows["influence"]])
                moves.append(f"| {env_id} | {variant} | {kl[0]:.4f} | {kl[1]:.4f} "
                             f"| {kl[1] / kl[0]:.1f} | {100 * filtered:.0f} % |")
    if moves:
        print("\nHow far a round moves the policy: median over rounds and seeds of "
              "KL(pi_theta(k) || pi_theta(k+1)) on B(k); rounds in which IIF dropped records\n")
        print("| env | recipe | KL, standard | KL, IIF | IIF / standard | rounds filtered |")
        print("|---|---|---|---|---|---|")
        print("\n".join(moves))


# ---- Each method at its own best learning rate ----

@dataclass
class Sensitivity:
    """Standard PPO and IIF at several learning rates: each (method, rate) scored by the area under
    its test curve (the mean test return over the tested rounds) and its final test return; each
    method's best rate (highest mean area); best against best, beside the paper's protocol (both at
    the preset's rate)"""
    env: tuple[str, ...]
    """env ids, one panel each"""
    runs: str = "results/tuned/runs"
    """folder of <env>__<method>-lr<m>x__<seed> runs (results/tuned.py), method none or influence,
    m the multiple of the preset's learning rate"""
    out: str = "sensitivity.png"
    """PNG to write"""


def tuned_runs(runs_dir, env_id):
    """{method: {multiple: {seed: rows}}} of the finished runs, the rounds compared (the fewest any
    run was started for: BipedalWalker's 250 of 500), and what was left out: {(method, multiple):
    [(seed, 'diverged' or 'unfinished')]}"""
    found = load_runs(runs_dir, env_id)
    plan = {(lb, s): planned_rounds(runs_dir, env_id, lb, s, len(rows))
            for lb, seeds in found.items() for s, rows in seeds.items()}
    n = min(plan.values())
    runs, left = defaultdict(lambda: defaultdict(dict)), defaultdict(list)
    for lb, seeds in found.items():
        method, m = method_and_rate(lb)
        for s, rows in seeds.items():
            err = os.path.join(runs_dir, f"{env_id}__{lb}__{s}.err")
            if os.path.exists(err) and "non-finite" in open(err).read():
                left[method, m].append((s, "diverged"))
            elif len(rows) < n:
                left[method, m].append((s, "unfinished"))
            else:
                runs[method][m][s] = rows[:n]
    for err in glob.glob(os.path.join(runs_dir, f"{env_id}__*__*.err")):  # diverged before round 0 ended
        lb, s = os.path.basename(err)[:-4].split("__")[1:]
        if (lb, s) not in plan and "non-finite" in open(err).read():
            left[method_and_rate(lb)].append((s, "diverged"))
    return runs, n, left


def method_and_rate(label):
    """'influence-lr3x' -> ('influence', 3.0)"""
    method, _, m = label.partition("-lr")
    return method, float(m[:-1])


def area_and_final(rows):
    tested = [r["test_return_mean"] for r in rows if not math.isnan(r["test_return_mean"])]
    return float(np.mean(tested)), tested[-1]


def cmd_sensitivity(args):
    names = {"none": "standard", "influence": "IIF"}
    fig, axes = plt.subplots(2, len(args.env), figsize=(3.6 * len(args.env), 5.6), squeeze=False)
    table, best_rows, best_diff, loso = [], [], {}, {}
    for j, env_id in enumerate(args.env):
        runs, n, left = tuned_runs(args.runs, env_id)
        n_seeds = max(len(seeds) for rates in runs.values() for seeds in rates.values())
        best, candidates = {}, {}
        for method in ("none", "influence"):
            areas, rows, xs, ys = {}, [], [], {"area": [], "final": []}
            for m in sorted(set(runs[method]) | {m for (mt, m) in left if mt == method}):
                seeds = runs[method].get(m, {})
                lost = left.get((method, m), [])
                diverged = [s for s, why in lost if why == "diverged"]
                note = ""
                if diverged:
                    note = f"diverged ({len(diverged)} of {len(seeds) + len(lost)} seeds)"
                elif len(seeds) < n_seeds:
                    note = f"{len(seeds)} of {n_seeds} seeds finished"
                cells = ["-", "-"]
                if seeds:
                    area, final = zip(*(area_and_final(r) for r in seeds.values()))
                    fmt = ".3f" if max(abs(x) for x in final) <= 1 else ".1f"
                    cells = [fmt_ci(area, 1, fmt), fmt_ci(final, 1, fmt)]
                    if not note:  # a candidate for the best rate
                        areas[m] = np.mean(area)
                        xs.append(m)
                        for key, v in (("area", area), ("final", final)):
                            ys[key].append(mean_ci(v))
                rows.append((env_id, names[method], m, len(seeds), *cells, note))
            if areas:
                best[method] = max(areas, key=areas.get)
                candidates[method] = list(areas)
            table += [(*r[:6], "best") if r[2] == best.get(method) else r for r in rows]
            color = COLORS[method]
            for i, key in enumerate(("area", "final")):
                if xs:
                    mean, low, high = np.array(ys[key]).T
                    axes[i, j].errorbar(xs, mean, yerr=[mean - low, high - mean], color=color,
                                        marker="o", capsize=3, label=LABELS[method])
                diverged = [m for (mt, m), lost in left.items()
                            if mt == method and any(why == "diverged" for _, why in lost)]
                for k, m in enumerate(diverged):
                    axes[i, j].axvline(m, color=color, linestyle=":", alpha=0.6,
                                       label=f"{LABELS[method]} diverged" if k == 0 else None)
        for i, key in enumerate(("mean test return over the rounds", "final test return")):
            axes[i, j].set(xscale="log", xlabel="learning rate / preset's", ylabel=key)
            axes[i, j].set_xticks(sorted({m for rates in runs.values() for m in rates}
                                         | {m for _, m in left}))
            axes[i, j].set_xticklabels([f"{m:g}" for m in axes[i, j].get_xticks()])
        axes[0, j].set_title(env_id, fontsize=10)
        if len(best) < 2:
            continue
        loso[env_id] = leave_one_seed_out(runs, candidates)
        for name, (m_std, m_iif) in (("best against best", (best["none"], best["influence"])),
                                     ("both at the preset's", (1.0, 1.0))):
            std, iif = runs["none"].get(m_std, {}), runs["influence"].get(m_iif, {})
            seeds = sorted(set(std) & set(iif))
            if not seeds:
                continue
            res = {rd: [efficiency(std[s], iif[s], rd) for s in seeds] for rd in ("records", "even")}
            diff = [area_and_final(iif[s])[0] - area_and_final(std[s])[0] for s in seeds]
            finals = [[area_and_final(r[s])[1] for s in seeds] for r in (std, iif)]
            fmt = ".3f" if max(abs(x) for f in finals for x in f) <= 1 else ".1f"
            best_rows.append(
                f"| {env_id} | {name} | {m_std:g} | {m_iif:g} | {len(seeds)} "
                f"| {fmt_ci([e['se_ave'] for e in res['records']])} "
                f"| {fmt_ci([e['se_ave'] for e in res['even']])} "
                f"| {fmt_ci([e['se_peak'] for e in res['records']])} "
                f"| {fmt_ci([e['rt_peak'] for e in res['records']])} "
                f"| {fmt_ci(finals[0], 1, fmt)} | {fmt_ci(finals[1], 1, fmt)} | {fmt_ci(diff, 1, fmt)} |")
            if name == "best against best":
                best_diff[env_id] = (diff, f"IIF at {m_iif:g} x minus standard at {m_std:g} x", fmt)
    words = ("IIF ahead", "standard PPO ahead")
    fam = verdicts.family({e: d for e, (d, _, _) in best_diff.items()}, words=words)
    ways = []
    for env_id, (diff, which, fmt) in best_diff.items():
        c = fam[env_id]
        ways.append(f"{env_id}: {c['verdict']} (area, {which}: {fmt_ci(diff, 1, fmt)}, p "
                    f"{verdicts.p_text(c['p'])}, Holm p {verdicts.p_text(c['p_holm'])})")
    fam = verdicts.family({e: d for e, (d, _) in loso.items() if d}, words=words)
    loso_rows = []
    for env_id, (diff, picks) in loso.items():
        if diff:
            fmt, c = ".3f" if max(abs(x) for x in diff) <= 1 else ".1f", fam[env_id]
            loso_rows.append(f"| {env_id} | {len(diff)} | {fmt_ci(diff, 1, fmt)} | {verdicts.p_text(c['p'])} | "
                             f"{verdicts.p_text(c['p_holm'])} | {c['verdict']} | {', '.join(picks['none'])} | "
                             f"{', '.join(picks['influence'])} |")
    print("Each (method, learning rate): area = mean test return over the tested rounds, final = test "
          "return after the last compared round; mean over seeds [95 % t-interval]. Best: the "
          "rate with the highest mean area.\n")
    print("| env | method | lr / preset's | seeds | area | final | |\n|---|---|---|---|---|---|---|")
    for env_id, method, m, k, area, final, note in table:
        print(f"| {env_id} | {method} | {m:g} | {k} | {area} | {final} | {note} |")
    print("\nIIF against standard PPO, paired by seed: SE in %; finals and the area difference (IIF minus "
          "standard) in test return; mean [95 % t-interval]\n")
    print("| env | comparison | standard's lr x | IIF's lr x | seeds | SE_ave, records | SE_ave, even | SE_peak "
          "| RT_peak | standard, final | IIF, final | area, IIF - standard |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(best_rows))
    print("\nWhich way it falls, best against best (the area difference above: the paired t-test, Holm over the "
          "environments, ahead only where the Holm p is below 0.05):\n" + "\n".join(ways))
    print("\nBest against best without peeking: for each seed, each method's rate is the one with the highest "
          "mean area over the other seeds, and the seed left out scores it; IIF minus standard in area, mean [95 % "
          "t-interval] over the seeds left out, the paired t-test and Holm over the environments (ahead or behind "
          "only where the Holm p is below 0.05), and each method's rates so picked\n")
    print("| env | seeds | area, IIF - standard | p | p, Holm | verdict | standard's picks (x preset's) | IIF's picks |"
          "\n|---|---|---|---|---|---|---|---|")
    print("\n".join(loso_rows))
    legend = {}  # one legend for every panel, below them
    for ax in axes.flat:
        legend.update(zip(*reversed(ax.get_legend_handles_labels())))
    fig.legend(legend.values(), legend.keys(), loc="lower center", ncol=4, fontsize=8)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


def leave_one_seed_out(runs, candidates):
    """Best against best with each method's rate chosen on the other seeds: the area differences (IIF minus
    standard) of the seeds left out, and each method's picks; no differences below 3 seeds"""
    area = {mt: {m: {s: area_and_final(r)[0] for s, r in runs[mt][m].items()} for m in candidates[mt]}
            for mt in ("none", "influence")}
    seeds = sorted(set.intersection(*(set(v) for mt in area for v in area[mt].values())))
    diff, picks = [], {"none": [], "influence": []}
    if len(seeds) < 3:
        return diff, picks
    for s in seeds:
        pick = {mt: max(area[mt], key=lambda m: np.mean([a for t, a in area[mt][m].items() if t != s]))
                for mt in area}
        diff.append(area["influence"][pick["influence"]][s] - area["none"][pick["none"]][s])
        for mt in pick:
            picks[mt].append(f"{pick[mt]:g}")
    return diff, picks


# ---- What the filter dropped, and the records rescored ----

@dataclass
class Dropped:
    """what the filter dropped, round by round: by action, by the sign of A_hat, by episode outcome,
    with the target's agreement and how far the round moved the policy on the kept and the dropped
    records"""
    run: str
    """an iif.py run made with --save-rounds"""
    every: int = 1
    """every N-th saved round"""


def episode_returns(b):
    """Each record's episode's undiscounted return within the buffer (nan if it did not end)."""
    rewards, dones = b["rewards"].numpy(), b["dones"].numpy()
    out = np.full(len(rewards), np.nan)
    start = 0
    for t in np.flatnonzero(dones):  # one environment: records are in step order
        out[start:t + 1] = rewards[start:t + 1].sum()
        start = t + 1
    return out


def cmd_dropped(args):
    config = load_config(args.run)
    if config["num_envs"] != 1:
        fail("dropped reads episodes from step order: a run with --num-envs 1")
    metrics = read_metrics(os.path.join(args.run, "metrics.csv"))
    rounds = saved_rounds(args.run)[::args.every]
    print("| round | test | agreement | KL | KL, kept | KL, dropped | dropped | A_hat > 0: dropped / all "
          "| from episodes with return > 0: dropped / all "
          "| most over-dropped action: dropped / all |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    saved = set(saved_rounds(args.run))
    for k in rounds:
        b = load_round(args.run, k)
        agent = agent_for(config, b["state_dict"])
        moved = {"kept": math.nan, "dropped": math.nan}  # KL(pi_theta(k) || pi_theta(k+1)) on each part
        if k + 1 in saved:
            after = agent_for(config, load_round(args.run, k + 1)["state_dict"])
            for part, mask in (("kept", b["kept"]), ("dropped", ~b["kept"])):
                if mask.any():
                    moved[part] = iif.approx_kl(after, {key: b[key][mask] for key in
                                                        ("obs", "actions", "logprobs")})
        adv = raw_advantages(b)
        weights = torch.as_tensor(adv if config["target_adv"] == "raw" else iif.normalize(adv))
        agreement = variants.target_agreement(agent, dict(b, advantages=weights))
        drop = ~b["kept"].numpy()
        success = episode_returns(b) > 0
        row = metrics[k]
        cells = [f"{row['test_return_mean']:.3f}", f"{agreement:+.2f}",
                 f"{row.get('kl', math.nan):.3g}", f"{moved['kept']:.3g}", f"{moved['dropped']:.3g}",
                 f"{drop.sum()}"]
        if not drop.any():
            print(f"| {k} | {' | '.join(cells)} | - | - | - |")
            continue
        cells.append(f"{np.mean(adv[drop] > 0):.2f} / {np.mean(adv > 0):.2f}")
        cells.append(f"{np.mean(success[drop]):.2f} / {np.mean(success):.2f}")
        if not b["actions"].is_floating_point():  # discrete actions
            actions = b["actions"].numpy()
            share = {a: (np.mean(actions[drop] == a), np.mean(actions == a))
                     for a in np.unique(actions)}
            a, (d, n) = max(share.items(), key=lambda kv: kv[1][0] - kv[1][1])
            cells.append(f"{a}: {d:.2f} / {n:.2f}")
        else:
            cells.append("-")
        print(f"| {k} | {' | '.join(cells)} |")
    print("\nagreement: mean pairwise cosine of grad f_return over 8 slices of B(k); KL: the "
          "round's KL(pi_theta(k) || pi_theta(k+1)) on B(k) from metrics.csv (nan where not logged); "
          "KL, kept / dropped: the same on the records the update trained on / the ones it dropped "
          "(theta(k+1) from the next round file; nan for the last)")


CHANGES = {  # rescore --change: the flags it sets
    "no-score-log-std": dict(score_log_std=False),
    "influence-loss-full": dict(influence_loss="full"),
    "target-adv-normalized": dict(target_adv="normalized"),
}


@dataclass
class Rescore:
    """what a scoring choice changes: every saved round scored again with one flag changed, against
    the run's own scores: the rank correlation and the overlap of the records each would drop"""
    run: str
    """an iif.py run made with --filter-method influence --save-rounds"""
    change: Literal[tuple(CHANGES)] = "no-score-log-std"
    """the flag changed: leave a Gaussian's log-std out of the score, score l_i with the full PPO
    loss, or weight f_return by the normalised A_hat"""
    every: int = 1
    """every N-th saved round"""


def cmd_rescore(args):
    config = load_config(args.run)
    if config["target"] != "f_return":
        fail(f"rescore re-scores f_return runs; {args.run} scored {config['target']}")
    cfgs = [SimpleNamespace(**config), SimpleNamespace(**{**config, **CHANGES[args.change]})]
    print(f"{args.run}, --{args.change}: the bottom floor(p x negatives) records, p = "
          f"{config['filter_p']}, under each scoring\n")
    print("| round | run's scores reproduced to | Spearman | dropped: run / changed | overlap |")
    print("|---|---|---|---|---|")
    rhos, overlaps = [], []
    for k in saved_rounds(args.run)[::args.every]:
        b = load_round(args.run, k)
        agent = agent_for(config, b["state_dict"])
        adv = raw_advantages(b)
        scores, drops = [], []
        for cfg in cfgs:
            weights = torch.as_tensor(adv if cfg.target_adv == "raw" else iif.normalize(adv))
            target = (b["obs"], b["actions"], weights)
            scores.append(variants.influence(agent, b, torch.arange(len(adv)), target, cfg,
                                             variants.scoring_advantages(b, cfg)))
            kept, _ = variants.filter_records(scores[-1], "influence", cfg.filter_p, None,
                                              cfg.filter_ties)
            drops.append(set(torch.nonzero(~kept)[:, 0].tolist()))
        err = float((scores[0] - b["influence"]).abs().max() / b["influence"].abs().max())
        rhos.append(spearman(scores[0].numpy(), scores[1].numpy()))
        overlaps.append(len(drops[0] & drops[1]) / max(len(drops[0]), 1))
        print(f"| {k} | {err:.1e} | {rhos[-1]:.3f} | {len(drops[0])} / {len(drops[1])} | "
              f"{overlaps[-1]:.2f} |")
    print(f"\nmedian over {len(rhos)} rounds: Spearman {np.median(rhos):.3f}, overlap of the "
          f"dropped records {np.median(overlaps):.2f} (the share of the run's drops that the "
          "changed scoring drops too)")


# ---- Counterfactual check: the linear datamodeling score (LDS; Park et al., TRAK, 2023) ----

def f_return(agent, b, config):
    """f_return(theta) on B(k), weighted by the A_hat the run's scores used (--target-adv;
    --adv-norm buffer saves the normalised A_hat, so the raw one is returns - values)."""
    raw = b["returns"] - b["values"] if config["adv_norm"] == "buffer" else b["advantages"]
    weights = raw if config["target_adv"] == "raw" else iif.normalize(raw)
    params = dict(agent.named_parameters())
    with torch.no_grad():
        return iif.f_return(agent, params, b["obs"], b["actions"], weights).item()


def update_scale(config):
    """First-order change of f per unit of summed influence over one round, or None for Adam.
    SGD: each of the E epochs visits a record once, in a step of lr / minibatch_size x its loss
    gradient, so delta f ~ lr x E / minibatch_size x sum_i I_i. Adam rescales every step by its
    moment estimates: not linear."""
    if config["optimizer"] != "sgd":
        return None
    return config["learning_rate"] * config["update_epochs"] / config["minibatch_size"]


def subset_masks(n, m, fraction, k):
    """m random subsets of round k's n records, each of round(fraction x n); subset j is drawn
    from seed (k, j)."""
    masks = torch.zeros(m, n, dtype=torch.bool)
    for j in range(m):
        chosen = np.random.default_rng([k, j]).choice(n, round(fraction * n), replace=False)
        masks[j, torch.as_tensor(chosen)] = True
    return masks


def round_scorers(b, k):
    """The scores each scorer gives B(k)'s records: snapshot (at theta(k)), tracin (summed over
    the round's steps, from --influence-mode tracin runs) and random (a floor)."""
    scorers = {"snapshot": b["influence"].double()}
    if b.get("influence_tracin") is not None:
        scorers["tracin"] = b["influence_tracin"].double()
    noise = np.random.default_rng([k, 1_000_003]).standard_normal(len(b["influence"]))
    scorers["random"] = torch.from_numpy(noise)
    return scorers


def counterfactual_round(config, b, k, m, fraction, eval_envs=None, episodes=0):
    """Retrain round k from theta(k) on m random subsets of B(k), with the same minibatch seed k
    for every subset, and on the full buffer. Returns f_return at theta(k), after the full-buffer
    round and after each subset's round, the subsets' test returns (with episodes), the masks, the
    scores and each scorer's predictions (summed scores over the subset) and LDS (their Spearman
    correlation with the outcomes)."""
    scorers = round_scorers(b, k)
    n = len(b["influence"])
    masks = subset_masks(n, m, fraction, k)
    start = agent_for(config, b["state_dict"])
    f0 = f_return(start, b, config)
    full = retrain(config, b, torch.ones(n, dtype=torch.bool), k, start=start)
    out = dict(f0=f0, masks=masks, scores=scorers, f=[], test=[], f_full=f_return(full, b, config))
    for mask in masks:
        agent = retrain(config, b, mask, k, start=start)
        out["f"].append(f_return(agent, b, config))
        if episodes:
            out["test"].append(iif.evaluate(agent, eval_envs, episodes, k + 10_000)[0])
    out["f"] = np.array(out["f"])
    out["pred"] = {name: (masks.double() @ s).numpy() for name, s in scorers.items()}
    out["lds"] = {name: spearman(p, out["f"]) for name, p in out["pred"].items()}
    out["lds_test"] = {}
    if episodes:
        out["lds_test"] = {name: spearman(p, np.array(out["test"]))
                           for name, p in out["pred"].items()}
    return out


def group_check(config, b, k, f_full):
    """The bottom-p set IIF drops from B(k) (the run's --filter-p and --filter-ties): the summed
    snapshot scores of the dropped records and the actual change of f_return when the round is
    retrained without them."""
    scores = b["influence"]
    kept, _ = variants.filter_records(scores, "influence", config["filter_p"], None,
                                      ties=config["filter_ties"])
    dropped = float(scores[~kept].double().sum())
    return dict(n_dropped=int((~kept).sum()), dropped_sum=dropped,
                actual=f_return(retrain(config, b, kept, k), b, config) - f_full)


@dataclass
class Counterfactual:
    """LDS: summed influence against retraining on random subsets"""
    run: str
    """an iif.py run made with --save-rounds (target f_return)"""
    rounds: tuple[int, ...]
    """rounds k to retrain"""
    subsets: int = 50
    """random subsets M per round"""
    fraction: float = 0.5
    """fraction F of B(k)'s records in each subset"""
    episodes: int = 0
    """also test each retrained policy on this many episodes"""
    out: str = "counterfactual.png"
    """PNG to write"""


def cmd_counterfactual(args):
    config = load_config(args.run)
    if config["target"] != "f_return":
        fail(f"counterfactual measures f_return: the run's scores are on {config['target']}")
    eval_envs = make_test_envs(config, args.episodes) if args.episodes else None
    scale = update_scale(config)
    results = {}
    groups = {}
    for k in args.rounds:
        b = load_round(args.run, k)
        results[k] = counterfactual_round(config, b, k, args.subsets, args.fraction, eval_envs,
                                          args.episodes)
        groups[k] = group_check(config, b, k, results[k]["f_full"])
        groups[k]["full_sum"] = float(b["influence"].double().sum())
    if eval_envs is not None:
        eval_envs.close()
    scorers = list(results[args.rounds[0]]["lds"])
    print(f"{config['env_id']}: {args.subsets} subsets of {args.fraction:.0%} of B(k) per round; "
          f"outcome f_return on B(k) after retraining round k ({config['optimizer']}, "
          f"lr {config['learning_rate']}, {config['update_epochs']} epochs, "
          f"minibatch {config['minibatch_size']})")
    test = bool(args.episodes)  # a column of LDS on the test return too
    print("\n| scorer | round | LDS |" + (" LDS on test return |" if test else ""))
    print("|---|---|---|" + ("---|" if test else ""))
    for name in scorers:
        for k in args.rounds:
            print(f"| {name} | {k} | {results[k]['lds'][name]:+.3f} |"
                  + (f" {results[k]['lds_test'][name]:+.3f} |" if test else ""))
        mean = np.mean([results[k]["lds"][name] for k in args.rounds])
        mean_test = np.mean([results[k]["lds_test"][name] for k in args.rounds]) if test else 0
        print(f"| {name} | mean | {mean:+.3f} |" + (f" {mean_test:+.3f} |" if test else ""))
    unit = "scaled by lr x epochs / minibatch"
    if not scale:
        unit = "summed scores (Adam: not first-order linear)"
    print(f"\nGroup check: the records IIF drops (p = {config['filter_p']}); predicted change of "
          f"f = -(their summed snapshot scores), {unit}; actual = f after the round without them - "
          "f after the full round. Full round: the same for all records against f(theta(k)).")
    print("| round | dropped | predicted delta f | actual delta f | full round: predicted "
          "| full round: actual |")
    print("|---|---|---|---|---|---|")
    s = scale or 1.0
    for k in args.rounds:
        g = groups[k]
        r = results[k]
        print(f"| {k} | {g['n_dropped']} | {-s * g['dropped_sum']:+.3e} | {g['actual']:+.3e} | "
              f"{s * g['full_sum']:+.3e} | {r['f_full'] - r['f0']:+.3e} |")
    pred = np.array([-s * groups[k]["dropped_sum"] for k in args.rounds])
    actual = np.array([groups[k]["actual"] for k in args.rounds])
    if len(args.rounds) > 2:
        ratio = f", actual / predicted {np.median(actual / pred):.2f} (median)" if scale else ""
        print(f"over rounds: Pearson {np.corrcoef(pred, actual)[0, 1]:+.3f}, "
              f"Spearman {spearman(pred, actual):+.3f}" + ratio)

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    colors = {"snapshot": "tab:red", "tracin": "tab:purple", "random": "tab:gray"}
    for name in scorers:
        lds = [results[k]["lds"][name] for k in args.rounds]
        axes[0].plot(args.rounds, lds, "o-", color=colors[name], label=name)
    axes[0].axhline(0, color="black", linewidth=0.6)
    axes[0].set_xticks(args.rounds)
    axes[0].set(xlabel="round k", ylabel="LDS (Spearman)", ylim=(-1.05, 1.05),
                title=f"LDS over {args.subsets} subsets of {args.fraction:.0%}")
    axes[0].legend(fontsize=8)
    cmap = plt.get_cmap("viridis")
    # each subset: predicted against actual change from the full-buffer round
    for i, k in enumerate(args.rounds):
        r = results[k]
        x = s * (r["pred"]["snapshot"] - float(r["scores"]["snapshot"].sum()))
        color = cmap(i / max(1, len(args.rounds) - 1))
        axes[1].scatter(x, r["f"] - r["f_full"], s=8, color=color, label=f"k={k}")
    axes[1].set(xlabel="predicted delta f (snapshot)", ylabel="actual delta f",
                title="subsets against the full round")
    axes[1].legend(fontsize=7, markerscale=2)
    axes[2].scatter(pred, actual, color="tab:red")
    for k, x, y in zip(args.rounds, pred, actual):
        axes[2].annotate(str(k), (x, y), fontsize=8, xytext=(3, 3), textcoords="offset points")
    for ax in axes[1:] if scale else []:
        lo, hi = ax.get_xlim()
        ax.plot([lo, hi], [lo, hi], color="black", linestyle="--", linewidth=0.8, label="y = x")
    axes[2].set(xlabel="predicted delta f" + ("" if scale else " (summed scores)"),
                ylabel="actual delta f", title="dropping IIF's bottom records")
    fig.suptitle(f"{config['env_id']}: counterfactual check of the snapshot influence", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=130)
    print(f"wrote {args.out}")


# ---- I-PPO's claims (rlhf_variants.py, docs/ippo.md) ----

IPPO_LABELS = {"sft": "SFT policy (not trained)", "none": "PPO", "influence": "IIF (f_seq)",
               "i-ppo": "I-PPO", "i-ppo-noreweight": "I-PPO, no reweighting",
               "i-ppo-v16": "I-PPO, 16 reference answers", "random": "random dropping"}
IPPO_COLORS = {"sft": "black", "none": "tab:blue", "influence": "tab:red", "i-ppo": "tab:green",
               "i-ppo-noreweight": "tab:olive", "i-ppo-v16": "tab:cyan", "random": "tab:gray"}
ROUND_TIME = ("t_generate", "t_forward", "t_influence", "t_optim")


@dataclass
class Ippo:
    """rlhf_variants.py's runs of results/ippo.sh: I-PPO against SFT, PPO and IIF"""
    runs: str = "results/runs"
    """folder of <env>__<label>__<seed> runs"""
    env: tuple[str, ...] = ("ippo-cot", "ippo-detox")
    """the runs' name prefixes, one per task"""
    last: int = 5
    """rounds in the trailing means of the reward and the test metric"""
    out: str = "ippo.png"
    """PNG of the curves; the kept fractions go to the same name with _kept"""


def load(plain, rows):
    """The load on the machine during rows' run against plain's: the ratio of their mean seconds a
    round of generation and forward pass, the same work under every method (a rough correction of
    a ratio of times: it assumes the load slowed every stage alike)"""
    return np.mean([r["t_generate"] + r["t_forward"] for r in plain]) / np.mean(
        [r["t_generate"] + r["t_forward"] for r in rows])


def cmd_ippo(args):
    """Per task and method, over seeds, mean [95 % t-interval]: the final reward, test
    metric and KL (means of the last --last rounds), the unfaithful share among right answers, the kept
    fraction and the first round it falls below a half, and the seconds per round and to PPO's
    final reward; then I-PPO's (and I-PPO without reweighting's) differences from each method and IIF's from PPO,
    seed by seed, with the paired t-test, Holm over each table's column and the verdict word (ippo_differences)."""
    w = args.last
    print("$ python research/analysis_variants.py " + " ".join(sys.argv[1:]))
    tasks = [(env, load_runs(args.runs, env)) for env in args.env]
    fig, axes = plt.subplots(len(tasks), 3, figsize=(14, 3.3 * len(tasks)), squeeze=False)
    kfig, kaxes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 3.3), squeeze=False)
    for (env, runs), ax, kax in zip(tasks, axes, kaxes[0]):
        first_row = next(iter(next(iter(runs.values())).values()))[0]
        cot = not np.isnan(first_row.get("eval_accuracy", np.nan))
        metric, name = ("eval_accuracy", "test accuracy") if cot else ("eval_toxicity", "test toxicity")
        labels = [lb for lb in IPPO_LABELS if lb in runs]
        print(f"\n{env}: mean [95 % t-interval] over seeds; reward and {name}: means of the last "
              f"{w} rounds; seconds: generation, forward, scoring and update (test left out)\n")
        print(f"| method | seeds | final reward | {name} | KL to the reference |" + (" unfaithful among right, test | unfaithful "
              "among right, trained on |" if cot else "") + " kept, first 5 rounds | kept, last 5 | first round "
              "kept < 1/2 | s a round | s a round / PPO's, load-adjusted | reaches PPO's final reward | s to it / "
              "PPO's, load-adjusted |")
        print("|---|---|---|---|---|" + ("---|---|" if cot else "") + "---|---|---|---|---|---|---|")
        stats = {}
        for lb in labels:
            seeds = runs[lb]
            final = {s: np.mean([r["reward_mean"] for r in rs[-w:]]) for s, rs in seeds.items()}
            test = {s: np.nanmean([r[metric] for r in rs[-w:]]) for s, rs in seeds.items()}
            stats[lb] = (final, test) + (({s: np.nanmean([r["eval_unfaithful"] for r in rs[-w:]])
                                           for s, rs in seeds.items()},) if cot else ())
            kept = [[r["n_kept"] / (r["episodes"] / (r["round"] + 1)) for r in rs] for rs in seeds.values()]
            below = [next((k for k, x in enumerate(ks) if x < 0.5), None) for ks in kept]
            per_round = [np.mean([sum(r[k] for k in ROUND_TIME) for r in rs]) for rs in seeds.values()]
            vs_ppo = [np.mean([sum(r[k] for k in ROUND_TIME) for r in rs]) / np.mean(
                [sum(r[k] for k in ROUND_TIME) for r in runs["none"][s]]) * load(runs["none"][s], rs)
                for s, rs in seeds.items() if s in runs.get("none", {})]
            kl = [np.mean([r["kl"] for r in rs[-w:]]) for rs in seeds.values()]
            line = f"| {IPPO_LABELS[lb]} | {len(seeds)} | {fmt_ci(list(final.values()), 1, '.3f')} | " \
                   f"{fmt_ci(list(test.values()), 1, '.3f')} | {fmt_ci(kl, 1, '.2f')} |"
            if cot:
                unf_test = list(stats[lb][2].values())
                col = "unfaithful_buffer" if lb in ("none", "sft") else "unfaithful_kept"
                unf_kept = [np.nanmean([r[col] for r in rs]) for rs in seeds.values()]
                line += f" {fmt_ci(unf_test, 1, '.3f')} | {fmt_ci(unf_kept, 1, '.3f')} |"
            reach, ratio = 0, []
            if lb not in ("sft", "none") and "none" in runs:
                for s, rs in seeds.items():
                    plain = runs["none"].get(s)
                    if plain is None:
                        continue
                    target = np.mean([r["reward_mean"] for r in plain[-w:]])
                    sm = smooth([r["reward_mean"] for r in rs], w)
                    j = next((j for j, v in enumerate(sm) if v >= target), None)
                    if j is None:
                        continue
                    reach += 1
                    secs = np.cumsum([sum(r[k] for k in ROUND_TIME) for r in rs])[j + w - 1]
                    secs_plain = np.cumsum([sum(r[k] for k in ROUND_TIME) for r in plain])[-1]
                    ratio.append(secs / secs_plain * load(plain, rs))
            never = sum(b is None for b in below)
            first_below = (f"{np.mean([b for b in below if b is not None]):.1f}"
                           + (f" ({never} never)" if never else "")) if never < len(below) else "never"
            trained = lb != "sft"
            line += (f" {fmt_ci([np.mean(k[:5]) for k in kept], 1, '.2f') if trained else '-'} | "
                     f"{fmt_ci([np.mean(k[-5:]) for k in kept], 1, '.2f') if trained else '-'} | "
                     f"{first_below if trained else '-'} | {fmt_ci(per_round, 1, '.2f')} | "
                     f"{fmt_ci(vs_ppo, 1, '.2f') if vs_ppo else '-'} | "
                     + (f"{reach} of {len(seeds)} | {fmt_ci(ratio, 1, '.2f') if ratio else '-'} |"
                        if lb not in ("sft", "none") else "- | - |"))
            print(line)
            n = min(len(rs) for rs in seeds.values())
            x = np.arange(1, n + 1)
            panels = [(ax[0], [[r["reward_mean"] for r in rs[:n]] for rs in seeds.values()], "training reward"),
                      (ax[1], [[r[metric] for r in rs[:n]] for rs in seeds.values()], name)]
            if cot:
                panels.append((ax[2], [[r["eval_unfaithful"] for r in rs[:n]] for rs in seeds.values()],
                               "unfaithful share of right test answers"))
            else:
                panels.append((ax[2], [[r["kl"] for r in rs[:n]] for rs in seeds.values()], "KL to the reference"))
            for a, c, title in panels:
                c = np.array(c, dtype=float)
                mean = np.nanmean(c, 0)
                a.plot(x, mean, color=IPPO_COLORS[lb], label=f"{IPPO_LABELS[lb]} ({len(c)})")
                a.fill_between(x, mean - np.nanstd(c, 0), mean + np.nanstd(c, 0), color=IPPO_COLORS[lb], alpha=0.12,
                               linewidth=0)
                a.set(title=f"{env}: {title}", xlabel="round")
            if trained:
                k = np.array([ks[:n] for ks in kept])
                kax.plot(x, k.mean(0), color=IPPO_COLORS[lb], label=IPPO_LABELS[lb])
                kax.fill_between(x, k.min(0), k.max(0), color=IPPO_COLORS[lb], alpha=0.12, linewidth=0)
        kax.axhline(0.5, color="gray", linewidth=0.8, linestyle=":")
        kax.set(title=f"{env}: kept fraction (mean, range over seeds)", xlabel="round", ylim=(0, 1.05))
        kax.legend(fontsize=7)
        ax[0].legend(fontsize=7)
        columns = [("final reward", False), (name, not cot)] + ([("unfaithful among right, test", True)] if cot else [])
        arms = [lb for lb in ("i-ppo", "i-ppo-noreweight") if lb in stats]
        for i, ippo in enumerate(arms):  # each pair once: no reweighting minus I-PPO is I-PPO's row, turned
            ippo_differences(env, stats, ippo, [b for b in labels if b != ippo and b not in arms[:i]], columns,
                             "".join(f"; against {IPPO_LABELS[b]}: that table's row, turned" for b in arms[:i]))
        if "influence" in stats and "none" in stats:
            ippo_differences(env, stats, "influence", ["none"], columns)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    kfig.tight_layout()
    kout = args.out.replace(".png", "_kept.png")
    kfig.savefig(kout, dpi=110)
    print(f"\nwrote {args.out} and {kout}")


def ippo_differences(env, stats, arm, against, columns, note=""):
    """cmd_ippo's paired table: arm minus each method of against, seed by seed (the seeds both ran), per column the
    mean [95 % t-interval], the two-sided paired t-test's p, its Holm adjustment over the column (the comparisons of
    one metric on one task in this table) and the verdict word (research/verdicts.py). columns: (name, lower is
    better) of each of stats' per-seed dicts, in their order; note: added to the header"""
    rows = {}
    for lb in against:
        seeds = sorted(set(stats[arm][0]) & set(stats[lb][0]))
        rows[lb] = [[stats[arm][j][s] - stats[lb][j][s] for s in seeds] for j in range(len(columns))]
    fams = [verdicts.family({lb: d[j] for lb, d in rows.items()}, "+.3f", lower)
            for j, (_, lower) in enumerate(columns)]
    n = len(against)
    print(f"\n{env}: {IPPO_LABELS[arm]} minus {'each method' if n > 1 else IPPO_LABELS[against[0]]}, seed by seed: "
          f"mean [95 % t-interval], the paired two-sided t-test's p, "
          + (f"Holm over each column (the {n} comparisons of one metric on this task in this table)"
             if n > 1 else "Holm over each column (one comparison, so Holm's p is the p)") + note
          + "; 'ahead' or 'behind' only where the Holm p is below 0.05 (lower is better in "
          + " and ".join(f"'{c}'" for c, lower in columns if lower) + ")\n")
    print("| against | " + " | ".join(f"{c} | p | Holm p | verdict" for c, _ in columns) + " |")
    print("|---|" + "---|---|---|---|" * len(columns))
    for lb, d in rows.items():
        cells = [f[lb] for f in fams]
        print(f"| {IPPO_LABELS[lb]} ({len(d[0])} seeds) | " + " | ".join(
            f"{c['text']} | {verdicts.p_text(c['p'])} | {verdicts.p_text(c['p_holm'])} | {c['verdict']}"
            for c in cells) + " |")


def t_text(x, fmt):
    """'[low, high]': the 95 % t-interval of x's mean, formatted"""
    _, lo, hi = verdicts.t_interval(x)
    return f"[{lo:{fmt}}, {hi:{fmt}}]"


# ---- Fig. 6(b) against the paper, under the one rule (t-intervals, t-tests, Welch's against its mean ± std, Holm) ----

PAPER_FIG6B = {  # the paper's Fig. 6(b), in %: mean and std over its 3 seeds of SE_ave, SE_peak, RT_peak
    "FrozenLake-v1": ((33.7, 3.4), (19.6, 8.4), (31.3, 3.3)),
    "Acrobot-v1": ((36.7, 6.5), (48.5, 0.8), (55.2, 1.0)),
    "MiniGrid-Empty-8x8-v0": ((67.5, 5.1), (67.4, 4.4), (71.6, 1.1)),
    "highway-v0": ((37.7, 6.1), (55.1, 2.9), (59.9, 0.7)),
    "LunarLander-v3": ((28.2, 1.3), (41.6, 5.7), (44.1, 2.3)),
    "BipedalWalker-v3": ((31.0, 8.7), (26.2, 8.0), (29.2, 0.7)),
}


@dataclass
class Paper:
    """Fig. 6(b) under the one rule (research/verdicts.py): SE_ave (both readings of the levels), SE_peak and RT_peak,
    each a mean over seeds with its 95 % t-interval; against standard PPO the paired t-test, against the paper
    Welch's t-test of our seeds against its mean ± std over its 3 seeds, each with Holm over the environments of one
    measure. A verdict word only where the Holm-adjusted p is below 0.05"""
    env: tuple[str, ...]
    """env ids"""
    runs: str = "results/runs"
    """folder of <env>__<label>__<seed> runs"""
    label: str = "influence"
    """label compared with standard PPO"""
    baseline: str = "none"
    """standard PPO's label (results/held_step.py's runs: standard)"""


PAPER_MEASURES = (("SE_ave, records", "se_ave", "records", 0), ("SE_ave, even", "se_ave", "even", 0),
                  ("SE_peak", "se_peak", "records", 1), ("RT_peak", "rt_peak", "records", 2))  # 0-2: PAPER_FIG6B's


def cmd_paper(args):
    name = LABELS.get(args.label, args.label)
    print(f"{name} against standard PPO and against the paper's Fig. 6(b), in %: mean over seeds [95 % t-interval]; "
          "against standard PPO the paired t-test, against the paper's mean ± std over its 3 seeds Welch's two-sided "
          "test; each p Holm-adjusted over the environments of one measure, and ahead or behind, above or below only "
          "where that is below 0.05\n")
    print("| env | measure | seeds | ours | p | p, Holm | against standard PPO | paper | p | p, Holm | against the paper |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    found = {}  # env: {measure: 100 x per-seed values}, or the seeds when fewer than 2
    for env_id in args.env:
        runs = load_runs(args.runs, env_id)
        std = runs.get(args.baseline, {})
        seeds = sorted(set(std) & set(runs.get(args.label, {})))
        n = max((len(r[s]) for r in (std, runs.get(args.label, {})) for s in seeds), default=0)
        seeds = [s for s in seeds if min(len(std[s]), len(runs[args.label][s])) == n]
        if len(seeds) < 2:
            found[env_id] = seeds
            continue
        res = {r: [efficiency(std[s], runs[args.label][s], r) for s in seeds] for r in ("records", "even")}
        found[env_id] = {m: 100 * np.array([r[key] for r in res[rd]]) for m, key, rd, _ in PAPER_MEASURES}
    done = [e for e in args.env if isinstance(found[e], dict)]
    vs_std = {m: verdicts.family({e: found[e][m] for e in done}) for m, *_ in PAPER_MEASURES}
    vs_paper = {}
    for m, _, _, ref in PAPER_MEASURES:
        ps = {e: verdicts.welch(found[e][m], *PAPER_FIG6B[e][ref]) for e in done if e in PAPER_FIG6B}
        vs_paper[m] = dict(zip(ps, zip(ps.values(), verdicts.holm(list(ps.values())))))
    for env_id in args.env:
        if env_id not in done:
            print(f"| {env_id} | - | {len(found[env_id])} | fewer than 2 finished seeds with both runs | | | | | | | |")
            continue
        for m, _, _, ref in PAPER_MEASURES:
            c = vs_std[m][env_id]
            cells = "- | - | - | -"
            if env_id in vs_paper[m]:
                (pm, ps), (p, pa) = PAPER_FIG6B[env_id][ref], vs_paper[m][env_id]
                word = verdicts.verdict(c["mean"] - pm, pa, c["n"], "above", "below")
                cells = (f"{pm:.1f} ± {ps:.1f} | {verdicts.p_text(p)} | {verdicts.p_text(pa)} | "
                         + ("not detected to differ" if word.startswith("not") else word))
            print(f"| {env_id} | {m} | {c['n']} | {c['text']} | {verdicts.p_text(c['p'])} | "
                  f"{verdicts.p_text(c['p_holm'])} | {c['verdict']} | {cells} |")


# ---- RLHF methods at equal KL to the reference (results/frontier.sh) ----

@dataclass
class Frontier:
    """rlhf_variants.py's runs at a sweep of the KL penalty beta (results/frontier.sh), or grpo_variants.py's
    (results/grpo_frontier.sh): each method's final policy (final.json: its reward and test metric on the test
    prompts, and its KL to the reference on the same samples) against PPO's (GRPO's) frontier: with --rule points,
    the upper envelope of its per-beta points; with --rule runs (the verdicts), a monotone fit over its runs of the
    other seeds, seed by seed"""
    runs: str = "results/frontier/runs"
    """folder of <env>__<label>-b<beta>__<seed> runs"""
    env: tuple[str, ...] = ("ippo-detox", "ippo-cot")
    """the runs' name prefixes, one per task (grpo-<task>: results/grpo_frontier.sh's, GRPO in place of PPO)"""
    resamples: int = 2000
    """bootstrap resamples of the seeds of every point"""
    seeds: tuple[str, ...] = ()
    """only these seeds (default: every seed run)"""
    baseline: tuple[str, ...] = ("none",)
    """the labels of the frontiers every other method is compared with (none: PPO; none-vf0.01: PPO with
    VF_COEF=0.01)"""
    out: str = "frontier.png"
    """PNG of the points and the baselines' frontiers"""
    rule: Literal["points", "runs"] = "points"
    """points: each beta's mean against the upper envelope of the baseline's per-beta means, ahead or behind where
    every compared point's t-interval lies on one side of 0 (results/figures/frontier.md); runs: every run against
    the baseline's monotone frontier fitted over its runs of the other seeds, seed by seed minus the baseline's own
    left-out seed, Holm over the methods of one task, with the null check on the baseline's own seeds
    (results/figures/frontier_verdicts.md)"""


FRONTIER_METRICS = {"final_reward": "reward", "final_toxicity": "test toxicity", "final_accuracy": "test accuracy",
                    "final_unfaithful": "unfaithful among right, test"}
LOWER_IS_BETTER = ("final_toxicity", "final_unfaithful")


def frontier_points(runs_dir, env, seeds, metrics):
    """{method: {beta: {metric: [one value a seed]}}}: frontier_runs' runs, grouped by beta; and the runs without a
    final.json"""
    runs, missing = frontier_runs(runs_dir, env, seeds, metrics)
    points = {}
    for method, found in runs.items():
        for beta, _, values in found:
            point = points.setdefault(method, {}).setdefault(beta, {m: [] for m in metrics})
            for m in metrics:
                point[m].append(values[m])
    return points, missing


def frontier_name(method, learner="PPO"):
    """IPPO_LABELS' name (learner for none), with the value coefficient of a <label>-vf<coef> run"""
    base, vf, horizon = label_parts(method)
    return (learner if base == "none" else IPPO_LABELS[base]) + (f", value coefficient {vf}" if vf else "") + (
        f", KL horizon {horizon}" if horizon else "")


def label_parts(method):
    """A frontier label's method, its -vf<coef> (VF_COEF) and its -h<episodes> (KL_HORIZON)"""
    m = re.fullmatch(r"(.+?)(?:-vf([\d.]+))?(?:-h(\d+))?", method)
    return m.group(1), m.group(2), m.group(3)


def envelope(points, lower_is_better=False):
    """A frontier, the best value reached at a KL as low or lower: of the points (KL, value), by KL, those that no
    point of a lower KL matches, and the last of them again at the largest KL of any point"""
    out = []
    for kl, y in sorted(points):
        if not out or (y < out[-1][1] if lower_is_better else y > out[-1][1]):
            out.append((kl, y))
    largest = max(kl for kl, _ in points)
    return out + [(largest, out[-1][1])] if largest > out[-1][0] else out


def at_kl(front, kl):
    """The frontier read at kl, linearly in log KL between its two nearest points: (value, the index of the left
    point, the weight of the right one); nan outside its KLs"""
    xs, ys = zip(*front)
    if not xs[0] <= kl <= xs[-1]:
        return np.nan, None, None
    j = min(int(np.searchsorted(xs, kl, side="right")) - 1, len(xs) - 2) if len(xs) > 1 else 0
    w = 0.0 if len(xs) == 1 or xs[j + 1] == xs[j] else (np.log(kl) - np.log(xs[j])) / (np.log(xs[j + 1]) - np.log(xs[j]))
    return float(ys[j] + w * (ys[j + 1] - ys[j])) if len(xs) > 1 else float(ys[0]), j, w


def equal_kl(points, method, metric, resamples, rng, baseline="none"):
    """method's points against the baseline's frontier at the same KL: per beta of method whose mean KL lies
    inside the frontier's KLs, the difference of the metric's mean from the frontier read there, its 95 %
    t-interval (Welch-Satterthwaite: the method's seeds of metric and KL, and the seeds of the two frontier points
    it is read between, their KLs taken as known), its 95 % percentile bootstrap interval (every point's seeds
    resampled, the frontier rebuilt) and the share of resamples that fell outside the frontier's KLs (left out of
    the bootstrap interval). Rows: (beta, KL, difference, t low, t high, boot low, boot high, share outside)."""
    lower = metric in LOWER_IS_BETTER
    base, out = points[baseline], []
    keys = sorted(base)

    def diff(take):
        front_pts = [(np.mean(take(base[b]["final_kl"])), np.nanmean(take(base[b][metric])), b) for b in keys]
        front = envelope([(x, y) for x, y, _ in front_pts], lower)
        return front, front_pts
    front, front_pts = diff(np.asarray)
    by_kl = {(x, y): b for x, y, b in front_pts}
    for beta, p in sorted(points[method].items()):
        kl, y = np.asarray(p["final_kl"]), np.asarray(p[metric])
        value, j, w = at_kl(front, kl.mean())
        if np.isnan(value) or np.isnan(y).any():
            continue
        d = y.mean() - value
        # variance components (variance of a mean, seeds) of the difference; nan with one seed
        def var_mean(x):
            return x.var(ddof=1) / len(x) if len(x) > 1 else np.nan
        parts = [(var_mean(y), len(y))]
        if len(front) > 1:
            slope = (front[j + 1][1] - front[j][1]) / (np.log(front[j + 1][0]) - np.log(front[j][0]) or np.inf)
            parts.append((slope ** 2 * var_mean(kl) / kl.mean() ** 2, len(kl)))
            for wt, i in ((1 - w, j), (w, j + 1)):  # the flat end of the frontier: its last point's seeds
                ys = np.asarray(base[by_kl.get(front[i]) or by_kl[front[i - 1]]][metric])
                parts.append((wt ** 2 * var_mean(ys), len(ys)))
        else:
            ys = np.asarray(base[by_kl[front[0]]][metric])
            parts.append((var_mean(ys), len(ys)))
        var = sum(v for v, _ in parts)
        df = var ** 2 / sum(v ** 2 / (n - 1) for v, n in parts if v > 0) if var > 0 else np.inf
        h = scipy.stats.t.ppf(0.975, df) * np.sqrt(var)
        boot = []
        for _ in range(resamples):
            take = lambda x: rng.choice(np.asarray(x), len(x))  # noqa: E731
            f, _ = diff(take)
            boot.append(np.mean(take(y)) - at_kl(f, np.mean(take(kl)))[0])
        boot = np.asarray(boot)
        outside = float(np.isnan(boot).mean())
        lo, hi = np.percentile(boot[~np.isnan(boot)], [2.5, 97.5]) if outside < 1 else (np.nan, np.nan)
        out.append((beta, float(kl.mean()), float(d), d - h, d + h, float(lo), float(hi), outside))
    return out


def verdict(rows, lower_is_better=False, name="PPO", seeds=None):
    """ahead / behind where every compared point's t-interval lies on one side of 0 (the better side: above 0, or
    below it where lower is better), else not detected; with the KL range of the compared points"""
    if not rows:
        return "no KL in common"
    kls = [r[1] for r in rows]
    where = f"at KL {min(kls):.2g}" + (f"-{max(kls):.2g}" if max(kls) > min(kls) else "") + f" ({len(rows)} point" \
        + ("s" if len(rows) > 1 else "") + ")"
    above, below = all(r[3] > 0 for r in rows), all(r[4] < 0 for r in rows)
    if above or below:
        return f"{'ahead of' if above != lower_is_better else 'behind'} {name} {where}"
    return f"not detected {where}" + (f" over {seeds} seeds" if seeds else "")


# -- the rule "runs" (--rule runs): every run against a monotone frontier fitted over the baseline's other seeds --

def frontier_runs(runs_dir, env, seeds, metrics):
    """{method: [(beta, seed, {metric: value})]}, a run each, from every run's final.json (nan where a metric is
    empty), and the runs without one"""
    out, missing = {}, []
    for label, by_seed in seeds.items():
        method, _, beta = label.rpartition("-b")
        if not method:
            continue
        for seed in by_seed:
            path = os.path.join(runs_dir, f"{env}__{label}__{seed}", "final.json")
            if not os.path.exists(path):
                missing.append(f"{label}__{seed}")
                continue
            with open(path) as f:
                final = json.load(f)
            out.setdefault(method, []).append(
                (float(beta), seed, {m: np.nan if final[m] == "" else float(final[m]) for m in metrics}))
    return out, missing


def monotone_fit(kl, y, lower_is_better=False):
    """A frontier fitted over runs: the isotonic regression (pool-adjacent-violators, scipy's) of the values y on
    log KL, nondecreasing (nonincreasing where lower is better); runs at one KL are pooled first, and runs with no
    value or a KL not above 0 left out. Returns (the distinct log KLs, ascending; the fitted value at each)"""
    kl, y = np.asarray(kl, dtype=float), np.asarray(y, dtype=float)
    ok = np.isfinite(kl) & np.isfinite(y) & (kl > 0)
    if not ok.any():
        return np.array([]), np.array([])
    x, inverse, counts = np.unique(np.log(kl[ok]), return_inverse=True, return_counts=True)
    means = np.bincount(inverse, weights=y[ok]) / counts
    return x, scipy.optimize.isotonic_regression(means, weights=counts, increasing=not lower_is_better).x


def read_fit(fit, kl):
    """A monotone_fit read at kl: linear in log KL between its KLs, nan outside them"""
    x, f = fit
    kl = np.asarray(kl, dtype=float)
    if not len(x):
        return np.full(kl.shape, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        lk = np.log(kl)
    return np.where((lk >= x[0]) & (lk <= x[-1]), np.interp(lk, x, f), np.nan)


def seed_fits(base_runs, metric, lower_is_better=False):
    """{seed s: the baseline's frontier fitted over its runs of every seed but s}, a seed of the baseline each"""
    return {s: monotone_fit([v["final_kl"] for _, t, v in base_runs if t != s],
                            [v[metric] for _, t, v in base_runs if t != s], lower_is_better)
            for s in sorted({s for _, s, _ in base_runs})}


def seed_residuals(runs, fits, metric):
    """Per seed s, the mean over its runs inside fits[s]'s KLs of (the run's value - fits[s] at the run's KL):
    ({seed: mean}, [(beta, seed) of the runs left out: outside the KLs, no value, or a seed with no fit])"""
    res, outside = {}, []
    for beta, seed, v in runs:
        r = v[metric] - float(read_fit(fits[seed], v["final_kl"])) if seed in fits else np.nan
        if np.isfinite(r):
            res.setdefault(seed, []).append(r)
        else:
            outside.append((beta, seed))
    return {s: float(np.mean(res[s])) for s in sorted(res)}, outside


def frontier_cells(runs, base, metric, lower_is_better=False):
    """The rule runs' differences on one task, baseline and metric, before any test. Per seed s of the baseline,
    its frontier over its runs of the other seeds (seed_fits), and at it each run's residual at its own final KL, a
    mean per seed (seed_residuals). Returns ({seed: the baseline's own residual}, the baseline's runs left out,
    {method: dict(n, own, base: the residuals of the method and of the baseline at the seeds both have, outside:
    the method's runs left out, runs, cell: the method's residual minus the baseline's, seed by seed)})"""
    fits = seed_fits(runs[base], metric, lower_is_better)
    own_base, base_out = seed_residuals(runs[base], fits, metric)
    out = {}
    for m in runs:
        if m == base:
            continue
        own, outside = seed_residuals(runs[m], fits, metric)
        seeds = [s for s in own if s in own_base]
        out[m] = dict(n=len(seeds), own=[own[s] for s in seeds], base=[own_base[s] for s in seeds],
                      outside=outside + [(b, s) for b, s, _ in runs[m] if s in own and s not in own_base],
                      runs=len(runs[m]), cell=[own[s] - own_base[s] for s in seeds])
    return own_base, base_out, out


def frontier_family(runs, base, metric, lower_is_better=False):
    """The rule runs on one task, baseline and metric (frontier_cells). The null check: the baseline's own
    left-out seeds, read as a family of one. Each other method: its residual minus the baseline's of the same seed,
    the methods with a difference one verdict family (verdicts.family: t-interval, t-test, Holm; ahead is higher,
    or lower where lower is better). Returns (null: its family cell with residuals, outside and runs, {method:
    frontier_cells' dict and, where it has a difference, its family cell})"""
    own_base, base_out, extra = frontier_cells(runs, base, metric, lower_is_better)
    null = verdicts.family({base: list(own_base.values())}, "+.3f", lower_is_better)[base] if own_base else dict(n=0)
    null.update(residuals=own_base, outside=base_out, runs=len(runs[base]))
    for m, c in verdicts.family({m: c["cell"] for m, c in extra.items() if c["n"]}, "+.3f", lower_is_better).items():
        extra[m].update(c)
    return null, extra


def envelope_null(base_runs, metric, lower_is_better=False, per_beta=True):
    """The upper envelope on the null: per seed s of the baseline, the envelope of its other seeds (of their
    per-beta means if per_beta, the rule points' frontier; else of their runs), each run of seed s read against it
    at its own KL (at_kl, nan outside): {seed: mean residual}"""
    out = {}
    for s in sorted({s for _, s, _ in base_runs}):
        others = [(b, v) for b, t, v in base_runs if t != s and np.isfinite(v[metric])]
        if per_beta:
            pts = [(np.mean([v["final_kl"] for c, v in others if c == b]),
                    np.mean([v[metric] for c, v in others if c == b])) for b in sorted({b for b, _ in others})]
        else:
            pts = [(v["final_kl"], v[metric]) for _, v in others]
        if not pts:
            continue
        front = envelope(pts, lower_is_better)
        r = [v[metric] - at_kl(front, v["final_kl"])[0] for _, t, v in base_runs if t == s]
        r = [x for x in r if np.isfinite(x)]
        if r:
            out[s] = float(np.mean(r))
    return out


def runs_left_out(outside):
    """[(beta, seed)] as 'beta 0.05: seeds 1 2; beta 3.2: seed 5'"""
    by_beta = defaultdict(list)
    for b, s in outside:
        by_beta[b].append(s)
    return "; ".join(f"β {b:g}: seed{'s' if len(v) > 1 else ''} {' '.join(sorted(v))}"
                     for b, v in sorted(by_beta.items()))


def frontier_task(args, env):
    """A task's runs {label: {seed: rows}} (--seeds only), its learner, its metrics (those its final.json has, in
    FRONTIER_METRICS' order) and the name of a method"""
    seeds = {lb: {s: rows for s, rows in by_seed.items() if not args.seeds or s in args.seeds}
             for lb, by_seed in load_runs(args.runs, env).items()}
    learner = "GRPO" if env.startswith("grpo") else "PPO"
    finals = sorted(glob.glob(os.path.join(args.runs, f"{env}__*__*", "final.json")))
    if not finals:
        fail(f"{env}: no run with a final.json under {args.runs}")
    with open(finals[0]) as f:
        final = json.load(f)
    return ({lb: by_seed for lb, by_seed in seeds.items() if by_seed}, learner,
            [m for m in FRONTIER_METRICS if m in final], functools.partial(frontier_name, learner=learner))


def cmd_frontier_runs(args):
    """--rule runs: per task and baseline, the null check on the baseline's own seeds (this rule's frontier and
    the two upper envelopes beside it), each method's seed-by-seed difference from the baseline at equal KL per
    metric with Holm over the methods, a summary of the verdicts, and a figure of every run and the frontiers"""
    print("$ python research/analysis_variants.py " + " ".join(sys.argv[1:]) + "\n")
    print("The rule (runs). For each task, baseline and metric: for each seed s of the baseline, the baseline's "
          "frontier is the isotonic regression (monotone: nondecreasing in KL, nonincreasing for toxicity and the "
          "unfaithful share) of the metric on log KL over the baseline's runs of its other seeds (every beta), read "
          "linearly in log KL between its KLs. Every run of seed s, the baseline's and each method's, is read "
          "against that frontier at the run's own final KL (a run outside the frontier's KLs is left out, and "
          "named); "
          "a seed's residual is the mean over its runs. A method's difference at seed s is its residual minus the "
          "baseline's (the arms of one seed share the seed, and both are read against the same frontier, fitted "
          "without either); over the seeds, the mean and its 95 % t-interval, the two-sided t-test, Holm over the "
          "methods of one task, baseline and metric (research/verdicts.py), 'ahead' or 'behind' only where the Holm "
          "p is below 0.05. The null check: the baseline's own left-out seeds against the frontier of its other "
          "seeds must read 'not detected' (raw p); beside it, the same check of two upper envelopes, of the other "
          "seeds' per-beta means (the frontier of results/figures/frontier.md) and of their runs.")
    fig, axes = plt.subplots(len(args.env), 3, figsize=(15, 3.6 * len(args.env)), squeeze=False)
    summary = []
    for env, ax in zip(args.env, axes):
        seeds, learner, metrics, name_of = frontier_task(args, env)
        runs, missing = frontier_runs(args.runs, env, seeds, ["final_kl", *metrics])
        print(f"\n## {env}\n")
        if missing:
            print(f"{len(missing)} run(s) without final.json, left out: {', '.join(missing)}\n")
        methods = sorted(runs, key=lambda m: (list(IPPO_LABELS).index(label_parts(m)[0]), m))
        print("| method | runs | seeds | final KL to the reference, runs (min-max) |\n|---|---|---|---|")
        for m in methods:
            kl = [v["final_kl"] for _, _, v in runs[m]]
            print(f"| {name_of(m)} | {len(runs[m])} | {len({s for _, s, _ in runs[m]})} | "
                  f"{min(kl):.3g}-{max(kl):.3g} |")
        for base in args.baseline:
            if base not in runs:
                print(f"\n{env}: no {base}-b<beta> runs to compare with")
                continue
            name = name_of(base)
            print(f"\n### {env}: against {name}'s frontier\n")
            print(f"The null check: {name}'s left-out seed minus the frontier of its other seeds, at each run's own "
                  f"KL; mean over seeds [95 % t-interval], raw two-sided p\n")
            print("| metric | frontier | seeds | runs inside | left-out seed - frontier | p | verdict |")
            print("|---|---|---|---|---|---|---|")
            fams = {}
            for k in metrics:
                lower = k in LOWER_IS_BETTER
                fams[k] = frontier_family(runs, base, k, lower)
                null = fams[k][0]
                rows = [("monotone fit over runs (this rule)", null)]
                for label, per_beta in (("upper envelope of per-beta means", True),
                                        ("upper envelope of runs", False)):
                    r = envelope_null(runs[base], k, lower, per_beta)
                    rows.append((label, dict(verdicts.family({0: list(r.values())}, "+.3f", lower)[0], residuals=r)
                                 if r else dict(n=0)))
                for label, c in rows:
                    inside = f"{null['runs'] - len(null['outside'])} of {null['runs']}" if c is null else "-"
                    cells = f"{c['text']} | {verdicts.p_text(c['p'])} | {c['verdict']}" if c["n"] else "- | - | -"
                    print(f"| {FRONTIER_METRICS[k]} | {label} | {c['n']} | {inside} | {cells} |")
            if fams[metrics[0]][0]["outside"]:
                print(f"\n{name}'s runs outside the frontier of its other seeds ({FRONTIER_METRICS[metrics[0]]}): "
                      + runs_left_out(fams[metrics[0]][0]["outside"]))
            for k in metrics:
                _, extra = fams[k]
                n_fam = sum(1 for c in extra.values() if c["n"])
                print(f"\n{env}, {FRONTIER_METRICS[k]}: each method minus {name}, seed by seed, both read against "
                      f"the frontier of {name}'s other seeds ({'lower' if k in LOWER_IS_BETTER else 'higher'} is "
                      f"better); Holm over the {n_fam} methods with a difference\n")
                print(f"| method | seeds | runs inside | method - frontier | {name} - frontier, same seeds | "
                      f"difference [95 % t-interval] | p | Holm p | verdict |")
                print("|---|---|---|---|---|---|---|---|---|")
                for m in methods:
                    if m not in extra:
                        continue
                    c = extra[m]
                    inside = f"{c['runs'] - len(c['outside'])} of {c['runs']}"
                    if not c["n"]:
                        print(f"| {name_of(m)} | 0 | {inside} | - | - | no run inside the frontier's KLs | - | - | "
                              f"no KL in common |")
                        continue
                    print(f"| {name_of(m)} | {c['n']} | {inside} | {np.mean(c['own']):+.3f} | "
                          f"{np.mean(c['base']):+.3f} | {c['text']} | {verdicts.p_text(c['p'])} | "
                          f"{verdicts.p_text(c['p_holm'])} | {c['verdict']} |")
                    summary.append((env, name, k, name_of(m), c))
            left = {m: c["outside"] for m, c in fams[metrics[0]][1].items() if c["outside"]}
            if left:
                print(f"\n{env}: runs left out, outside the frontier of {name}'s other seeds (or of a seed where "
                      f"{name} has no run inside it; {FRONTIER_METRICS[metrics[0]]}):")
                for m in methods:
                    if m in left:
                        print(f"- {name_of(m)}: {len(left[m])} of {fams[metrics[0]][1][m]['runs']} "
                              f"({runs_left_out(left[m])})")
        for a, metric in zip(ax, metrics):
            for m in methods:
                kl = [v["final_kl"] for _, _, v in runs[m]]
                y = [v[metric] for _, _, v in runs[m]]
                base_m, vf, horizon = label_parts(m)
                a.scatter(kl, y, s=10, color=IPPO_COLORS[base_m], marker="s" if vf else "^" if horizon else "o",
                          alpha=0.6, label=name_of(m))
                if m in args.baseline:
                    x, f = monotone_fit(kl, y, metric in LOWER_IS_BETTER)
                    a.plot(np.exp(x), f, color=IPPO_COLORS[base_m], linestyle="--" if vf else "-")
            a.set(xscale="log", xlabel="final policy's KL to the reference",
                  title=f"{env}: {FRONTIER_METRICS[metric]}")
        ax[0].legend(fontsize=6)
        for a in ax[len(metrics):]:
            a.axis("off")
    if summary:
        print("\n## The verdicts\n\nEach method minus the baseline at equal KL (the tables above): difference "
              "[95 % t-interval] over seeds, Holm p, verdict\n")
        print("| task | against | metric | method | difference | Holm p | verdict |\n|---|---|---|---|---|---|---|")
        for env, name, k, m, c in summary:
            print(f"| {env} | {name} | {FRONTIER_METRICS[k]} | {m} | {c['text']} | {verdicts.p_text(c['p_holm'])} | "
                  f"{c['verdict']} |")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"\nwrote {args.out} (dots: every run; lines: each baseline's monotone frontier over all its seeds, shown "
          f"only: a run is read against the frontier of the baseline's other seeds)")


def cmd_frontier(args):
    """Per task: every method's final-policy points (beta: KL to the reference, reward and test metrics, mean
    [95 % t-interval] over seeds), the differences from each baseline's frontier at equal KL, a verdict per method
    and metric with the KL range it holds at, and a figure"""
    if args.rule == "runs":
        return cmd_frontier_runs(args)
    rng = np.random.default_rng(0)
    fig, axes = plt.subplots(len(args.env), 3, figsize=(15, 3.6 * len(args.env)), squeeze=False)
    for env, ax in zip(args.env, axes):
        runs, learner, metrics, name_of = frontier_task(args, env)
        points, missing = frontier_points(args.runs, env, runs, ["final_kl", *metrics])
        if missing:
            print(f"{env}: {len(missing)} run(s) without final.json (unfinished, or made before the final test), "
                  f"left out: {', '.join(missing)}")
        if "none" not in points:
            fail(f"{env}: no {learner} (none-b<beta>) run with a final.json under {args.runs}")
        print(f"\n{env}: the final policies on the test prompts (final.json): mean [95 % t-interval] over seeds\n")
        print("| method | beta | seeds | KL to the reference | " + " | ".join(FRONTIER_METRICS[m] for m in metrics)
              + " |")
        print("|---|---|---|---|" + "---|" * len(metrics))
        methods = sorted(points, key=lambda m: (list(IPPO_LABELS).index(label_parts(m)[0]), m))
        for m in methods:
            for beta, p in sorted(points[m].items()):
                print(f"| {name_of(m)} | {beta:g} | {len(p['final_kl'])} | "
                      f"{np.mean(p['final_kl']):.3g} {t_text(p['final_kl'], '.3g')} | "
                      + " | ".join(f"{np.nanmean(p[k]):.3f} {t_text(p[k], '.3f')}" for k in metrics) + " |")
        for base in args.baseline:
            if base not in points:
                print(f"\n{env}: no {base}-b<beta> runs to compare with")
                continue
            name = name_of(base)
            fronts = {k: envelope([(np.mean(p["final_kl"]), np.nanmean(p[k])) for p in points[base].values()],
                                  k in LOWER_IS_BETTER) for k in metrics}
            print(f"\n{env}: {name}'s frontier, the upper envelope of its points (lower for toxicity and the "
                  f"unfaithful share): " + "; ".join(f"{FRONTIER_METRICS[k]} at KL "
                                                      + ", ".join(f"{x:.3g}" for x, _ in f) for k, f in fronts.items()))
            print(f"\n{env}: each method minus {name}'s frontier at the same KL (read at the method's mean KL, "
                  f"linearly in log KL between the frontier's points; points outside its KLs are left out): "
                  f"difference [95 % t-interval] (95 % bootstrap interval, {args.resamples} resamples of every "
                  f"point's seeds; share of resamples outside the frontier's KLs)\n")
            print("| method | beta | KL | " + " | ".join(FRONTIER_METRICS[m] for m in metrics) + " |")
            print("|---|---|---|" + "---|" * len(metrics))
            words = {}
            for m in methods:
                if m == base:
                    continue
                per_metric = {k: equal_kl(points, m, k, args.resamples, rng, base) for k in metrics}
                n = min(len(p["final_kl"]) for q in (points[m], points[base]) for p in q.values())
                words[m] = {k: "no verdict: a point of one seed has no interval" if n < 2 and v else
                               verdict(v, k in LOWER_IS_BETTER, name, n) for k, v in per_metric.items()}
                rows = {r[0]: {} for v in per_metric.values() for r in v}
                for k, v in per_metric.items():
                    for r in v:
                        rows[r[0]][k] = r
                for beta, cells in sorted(rows.items()):
                    kl = next(iter(cells.values()))[1]
                    print(f"| {name_of(m)} | {beta:g} | {kl:.3g} | " + " | ".join(
                        f"{c[2]:+.3f} [{c[3]:+.3f}, {c[4]:+.3f}] ({c[5]:+.3f}, {c[6]:+.3f}; {c[7]:.0%} outside)"
                        if (c := cells.get(k)) else "outside" for k in metrics) + " |")
            print(f"\n{env}: verdicts against {name}'s frontier at equal KL (ahead or behind: every compared "
                  "point's t-interval on one side of 0; ahead is higher reward and accuracy, lower toxicity and "
                  "unfaithful share)\n")
            print("| method | " + " | ".join(FRONTIER_METRICS[m] for m in metrics) + " |")
            print("|---|" + "---|" * len(metrics))
            for m, v in words.items():
                print(f"| {name_of(m)} | " + " | ".join(v.values()) + " |")
        for a, metric in zip(ax, metrics):
            for m in methods:
                pts = sorted(points[m].items())
                kl = np.array([np.mean(p["final_kl"]) for _, p in pts])
                y = np.array([np.nanmean(p[metric]) for _, p in pts])
                color = IPPO_COLORS[label_parts(m)[0]]
                style = "--" if label_parts(m)[1] else ":" if label_parts(m)[2] else "-"
                a.errorbar(kl, y, xerr=[np.std(p["final_kl"]) for _, p in pts],
                           yerr=[np.nanstd(p[metric]) for _, p in pts], color=color, linestyle="none", marker="o",
                           markersize=3, capsize=2, label=name_of(m))
                if m in args.baseline:
                    a.plot(*zip(*envelope(list(zip(kl, y)), metric in LOWER_IS_BETTER)), color=color,
                           linestyle=style)
                for (beta, _), x, yy in zip(pts, kl, y):
                    a.annotate(f"{beta:g}", (x, yy), fontsize=6, xytext=(2, 2), textcoords="offset points")
            a.set(xscale="log", xlabel="final policy's KL to the reference", title=f"{env}: {FRONTIER_METRICS[metric]}")
        ax[0].legend(fontsize=7)
        for a in ax[len(metrics):]:
            a.axis("off")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"\nwrote {args.out} (points: mean over seeds, bars: std over seeds, labels: beta; lines: the baselines' "
          f"frontiers)")


COMMANDS = {  # subcommand: (its flags, what it runs)
    "curves": (analysis.Curves, functools.partial(analysis.cmd_curves, names=LABELS)),  # with the names above
    "efficiency": (Efficiency, cmd_efficiency),
    "sensitivity": (Sensitivity, cmd_sensitivity),
    "ablation": (Ablation, cmd_ablation),
    "dropped": (Dropped, cmd_dropped),
    "rescore": (Rescore, cmd_rescore),
    "counterfactual": (Counterfactual, cmd_counterfactual),
    "ippo": (Ippo, cmd_ippo),
    "frontier": (Frontier, cmd_frontier),
    "paper": (Paper, cmd_paper),
}


def main():
    args = tyro.extras.subcommand_cli_from_dict({name: cls for name, (cls, _) in COMMANDS.items()},
                                                description=__doc__.splitlines()[0])
    if getattr(args, "env", None) == ():
        fail("--env needs at least one value")
    torch.set_num_threads(1)
    dict(COMMANDS.values())[type(args)](args)


if __name__ == "__main__":
    main()
