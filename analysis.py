r"""The paper's diagnostics (Sec. 4, Sec. 5.2, App. C) from what iif.py saves.

Each subcommand prints the numbers of a figure or table, and all but efficiency and ablation
draw it in a PNG:

    python analysis.py curves --runs results/runs --env FrozenLake-v1
    python analysis.py efficiency --runs results/runs --env FrozenLake-v1 Acrobot-v1
    python analysis.py sensitivity --runs results/tuned/runs --env FrozenLake-v1
    D=results/diagnostics
    python analysis.py bottom-records --run $D/FrozenLake-v1__none__1 --rounds 2 5 10
    python analysis.py advantage-diagnosis --run $D/FrozenLake-v1__none__1 --round 5
    python analysis.py counterfactual --run $D/FrozenLake-v1__tracin__1 --rounds 0 4 8 12 16
    python analysis.py rlhf --runs results/runs --env rlhf-toy
    python analysis.py ippo --runs results/runs --env ippo-cot ippo-detox

Runs follow results/reproduce.sh's naming, <runs>/<env>__<label>__<seed>/metrics.csv, where the
label is iif.py's (or rlhf_iif.py's) --filter-method (influence, none, random) or any other tag.
The diagnostics read the rounds/ of a run made with --save-rounds, such as (docs/results.md)

    python iif.py --env-id FrozenLake-v1 --filter-method none --save-rounds --seed 1 \
        --total-timesteps 40960 --runs-dir results/diagnostics --run-name FrozenLake-v1__none__1
"""
import copy
import csv
import glob
import json
import math
import os
from collections import defaultdict
import dataclasses
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Literal, Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import scipy.stats  # noqa: E402
import torch  # noqa: E402
import tyro  # noqa: E402

import iif  # noqa: E402
import iif_variants as variants  # noqa: E402

LABELS = {"influence": "IIF", "none": "Standard", "random": "Random", "f_return": "IIF (f_return)",
          "release-none": "Standard, released code", "release-influence": "IIF, released code",
          "none-all": "Standard, every checkpoint"}
COLORS = {"influence": "tab:red", "none": "tab:blue", "random": "tab:gray",
          "adv-error": "tab:orange", "adv-product": "tab:purple", "td-weight": "tab:green",
          "f_return": "tab:olive"}


def fail(msg):
    raise SystemExit(f"analysis.py: error: {msg}")


def read_metrics(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    return [{k: float(v) if v != "" else math.nan for k, v in row.items()} for row in rows]


def load_runs(runs_dir, env_id):
    """{label: {seed: rows}} of every <runs_dir>/<env_id>__<label>__<seed>/metrics.csv."""
    runs = defaultdict(dict)
    for path in sorted(glob.glob(os.path.join(runs_dir, f"{env_id}__*__*", "metrics.csv"))):
        _, label, seed = os.path.basename(os.path.dirname(path)).rsplit("__", 2)
        runs[label][seed] = read_metrics(path)
    if not runs:
        fail(f"no {env_id}__<label>__<seed>/metrics.csv under --runs {runs_dir}")
    return runs


def planned_rounds(runs_dir, env_id, label, seed, default):
    """The rounds a run was started for (its config.json's num_rounds), else default."""
    try:
        with open(os.path.join(runs_dir, f"{env_id}__{label}__{seed}", "config.json")) as f:
            return int(json.load(f)["num_rounds"])
    except (OSError, KeyError, ValueError):
        return default


def label_order(label):
    """LABELS' labels first, in its order, then the others alphabetically"""
    return (label not in LABELS, list(LABELS).index(label) if label in LABELS else label)


# ---- Sec. 5.2: sample efficiency and runtime ----

def first_round(returns, v):
    """m(v): rounds of training until the test return first reaches v; inf if it never does."""
    return next((k + 1 for k, r in enumerate(returns) if r >= v), math.inf)


def record_levels(returns):
    """The strictly increasing sequence of record test returns set by a run (its running maxima).
    A run made with --eval-every N has nan for its untested rounds: they set no level, and m(v)
    counts rounds, so SE is measured on the tested rounds."""
    levels = []
    for r in returns:
        if math.isnan(r):
            continue
        if not levels or r > levels[-1]:
            levels.append(r)
    return levels


def performance_levels(returns, reading="records", n=10):
    """Sec. 5.2's "list of strictly increasing performance levels reached by standard training",
    read two ways: records, the record test returns standard training set (its running maxima);
    even, n evenly spaced levels above its lowest tested return, the last at its peak (the lowest
    itself is left out: standard reaches it before any training shows)."""
    if reading == "records":
        return record_levels(returns)
    tested = [r for r in returns if not math.isnan(r)]
    return list(np.linspace(min(tested), max(tested), n + 1)[1:])


def efficiency(std_rows, iif_rows, reading="records"):
    """SE_ave, SE_peak, RT_peak of one IIF run against one standard run, and how many levels IIF
    never reached. SE(v) = 1 - m_IIF(v) / m_std(v), averaged over performance_levels(reading). A
    level IIF never reaches counts with m_IIF = its number of rounds + 1, a bound in IIF's favour.
    RT_peak = 1 - (IIF's influence + optimisation time until it matches standard's peak) /
    (standard's optimisation time over all its rounds): Table 3's formula (FrozenLake 1 - 64.64 /
    93.85 = 31.1 %); standard PPO needs no influence. SE_peak and RT_peak do not depend on the
    reading."""
    std = [r["test_return_mean"] for r in std_rows]
    iif = [r["test_return_mean"] for r in iif_rows]
    levels = performance_levels(std, reading)
    m_iif = [min(first_round(iif, v), len(iif) + 1) for v in levels]
    se = [1 - mi / first_round(std, v) for mi, v in zip(m_iif, levels)]  # Sec. 5.2: SE(v)
    t_std = np.cumsum([r["t_optim"] for r in std_rows])
    t_iif = np.cumsum([r["t_influence"] + r["t_optim"] for r in iif_rows])
    t_iif_peak = t_iif[m_iif[-1] - 1] if m_iif[-1] <= len(iif) else t_iif[-1]
    return dict(se_ave=float(np.mean(se)), se_peak=se[-1], rt_peak=1 - t_iif_peak / t_std[-1],
                n_levels=len(levels), n_unreached=sum(mi > len(iif) for mi in m_iif),
                order=(sum(x > 0 for x in se), sum(x == 0 for x in se), sum(x < 0 for x in se)))


def mean_ci(x):
    """Mean over seeds and its 95 % percentile-bootstrap interval (scipy.stats.bootstrap, 10,000
    resamples, a fixed seed so that tables are reproducible)."""
    x = np.asarray(x, dtype=float)
    if len(x) < 2 or np.ptp(x) == 0:
        return float(np.mean(x)), float(np.mean(x)), float(np.mean(x))
    ci = scipy.stats.bootstrap((x,), np.mean, n_resamples=10_000, method="percentile",
                               rng=np.random.default_rng(0)).confidence_interval
    return float(np.mean(x)), float(ci.low), float(ci.high)


def fmt_ci(x, scale=100.0, fmt=".1f"):
    mean, low, high = (scale * v for v in mean_ci(x))
    return f"{mean:{fmt}} [{low:{fmt}}, {high:{fmt}}]"


@dataclass
class Efficiency:
    """SE_ave (both readings of the levels), SE_peak, RT_peak with 95 % bootstrap intervals over
    seeds, and the runtime breakdown (Fig. 6b, Table 3)"""
    env: tuple[str, ...]
    """env ids"""
    runs: str = "results/runs"
    """folder of <env>__<label>__<seed> runs"""
    label: str = "influence"
    """label compared with standard PPO ('none')"""
    at: tuple[float, ...] = ()
    """also print SE(v) at these test-return levels v"""
    levels: Literal["both", "records", "even"] = "both"
    """SE_ave's performance levels: standard's record returns, 10 even levels up to its peak, or
    a column for each"""
    rounds: int = 0
    """compare the first N rounds of each run only (0: all; the released code's LunarLander
    comparison window is 100)"""
    tested_every: int = 1
    """read the test returns of every N-th round only (rounds N-1, 2N-1, ...), as if tested with
    --eval-every N but trained alike: what testing less often does to the numbers"""


def cmd_efficiency(args):
    name = LABELS.get(args.label, args.label)
    if args.rounds < 0:
        fail(f"--rounds must be 0 (all) or a number of rounds, got {args.rounds}")
    if args.tested_every < 1:
        fail(f"--tested-every must be at least 1, got {args.tested_every}")
    readings = ("records", "even") if args.levels == "both" else (args.levels,)
    print("Mean over seeds [95 % bootstrap interval], in %. SE_ave over standard's record returns "
          "and/or 10 even levels up to its peak; levels: records per seed (how many "
          f"{name} never reached)\n")
    head = " | ".join(f"SE_ave, {r}" for r in readings)
    print(f"| env | method | seeds | {head} | SE_peak | RT_peak | levels |")
    print("|---|---|---|" + "---|" * len(readings) + "---|---|---|")
    breakdown, at, left_out, order = [], [], [], []
    for env_id in args.env:
        runs = load_runs(args.runs, env_id)
        if args.rounds:
            runs = {lb: {s: rows[:args.rounds] for s, rows in r.items()} for lb, r in runs.items()}
        if args.tested_every > 1:
            runs = {lb: {s: [row if (row["round"] + 1) % args.tested_every == 0
                             else {**row, "test_return_mean": math.nan} for row in rows]
                         for s, rows in r.items()} for lb, r in runs.items()}
        seeds = sorted(set(runs.get("none", {})) & set(runs.get(args.label, {})))
        if not seeds:
            left_out.append(f"{env_id}: no seed has both a standard ('none') and "
                            f"a '{args.label}' run")
            continue
        n = max(len(runs[lb][s]) for lb in ("none", args.label) for s in seeds)
        unfinished = [s for s in seeds if min(len(runs["none"][s]), len(runs[args.label][s])) < n]
        if unfinished:  # a run still under way would be compared on fewer rounds
            left_out.append(f"{env_id}: seed(s) {', '.join(unfinished)} left out, unfinished")
            seeds = [s for s in seeds if s not in unfinished]
        if not seeds:
            continue
        res = [efficiency(runs["none"][s], runs[args.label][s]) for s in seeds]
        by_reading = {"records": res}
        if "even" in readings:
            by_reading["even"] = [efficiency(runs["none"][s], runs[args.label][s], "even")
                                  for s in seeds]
        cells = [fmt_ci([e["se_ave"] for e in by_reading[r]]) for r in readings]
        cells += [fmt_ci([r["se_peak"] for r in res]), fmt_ci([r["rt_peak"] for r in res])]
        levels = ", ".join(f"{r['n_levels']} ({r['n_unreached']})" for r in res)
        print(f"| {env_id} | {name} | {len(seeds)} | {' | '.join(cells)} | {levels} |")
        first, tied, later = np.sum([r["order"] for r in res], axis=0)
        order.append(f"{env_id}: of standard's {first + tied + later} record levels, {name} "
                     f"reached {first} first, {tied} at the same round, {later} later")
        for v in args.at:  # seeds whose standard run never reaches v have no SE(v)
            m = []
            for s in seeds:
                m_lb = first_round([r["test_return_mean"] for r in runs[args.label][s]], v)
                m_std = first_round([r["test_return_mean"] for r in runs["none"][s]], v)
                m.append((m_lb, m_std))
            se = [1 - min(a, len(runs[args.label][s]) + 1) / b
                  for (a, b), s in zip(m, seeds) if b < math.inf]
            row = f"| {env_id} | {name} | {v:g} | {', '.join(f'{a} / {b}' for a, b in m)} | "
            if se:
                row += f"{100 * np.mean(se):.1f} % ({len(se)} of {len(m)} seeds) |"
            else:
                row += "- |"
            at.append(row)
        for label in ("none", args.label):
            rows = [r for s in seeds for r in runs[label][s]]
            keys = ("t_rollout", "t_influence", "t_optim", "t_eval", "n_kept", "n_updates")
            means = [np.mean([r[k] for r in rows]) for k in keys]
            breakdown.append((env_id, LABELS.get(label, label), *means))
    if left_out:
        print("\n" + "\n".join(left_out))
    if order:
        print("\n" + "\n".join(order))
    if at:
        print(f"\nSE at chosen levels v (rounds to reach v, {name} / standard, per seed):\n")
        print("| env | method | v | m / m_std | SE(v) |")
        print("|---|---|---|---|---|")
        print("\n".join(at))
    print("\nPer-round means (seconds; Table 3):\n")
    print("| env | method | rollout | influence | optimisation | evaluation | records kept "
          "| optimizer steps |")
    print("|---|---|---|---|---|---|---|---|")
    for env_id, label, *v in breakdown:
        print(f"| {env_id} | {label} | {v[0]:.2f} | {v[1]:.3f} | {v[2]:.2f} | {v[3]:.2f} "
              f"| {v[4]:.0f} | {v[5]:.0f} |")


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
    """One row per recipe: IIF against standard PPO under it (means over seeds [95 % bootstrap
    intervals]), and the final test returns of standard PPO, IIF and random filtering."""
    def pm(x, fmt):
        return f"{np.mean(x):{fmt}} ± {np.std(x):{fmt}}" if len(x) else "-"
    rounds = {e: int(n) for e, n in (c.split("=") for c in args.complete)}
    moves = []
    print("SE in %, mean over seeds [95 % bootstrap interval]; returns: mean ± std over seeds\n")
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


# ---- Fig. 6a, Fig. 13: test return over rounds ----

@dataclass
class Curves:
    """test return over rounds, mean and std band over seeds (Fig. 6a, 13)"""
    env: tuple[str, ...]
    """env ids, one panel each"""
    runs: str = "results/runs"
    """folder of <env>__<label>__<seed> runs"""
    labels: tuple[str, ...] = ()
    """labels to draw (default: all found)"""
    out: str = "curves.png"
    """PNG to write"""
    rounds: int = 0
    """draw the first N rounds of each run only (0: all)"""


def cmd_curves(args):
    n_env = len(args.env)
    fig, axes = plt.subplots(1, n_env, figsize=(4.5 * n_env, 3.4), squeeze=False)
    for ax, env_id in zip(axes[0], args.env):
        runs = load_runs(args.runs, env_id)
        print(f"{env_id}: final test return, mean ± std over seeds")
        labels = sorted(runs, key=label_order)
        if args.labels:
            labels = [lb for lb in labels if lb in args.labels]
        others = iter(["tab:olive", "tab:cyan", "tab:brown", "tab:pink", "black", "tab:purple",
                       "tab:green"])
        colors = {lb: COLORS[lb] if lb in COLORS else next(others, None) for lb in labels}
        full = max(len(rows) for lb in labels for rows in runs[lb].values())
        for label in labels:
            unfinished = [s for s, rows in runs[label].items()
                          if len(rows) < planned_rounds(args.runs, env_id, label, s, full)]
            if unfinished:  # a run still going (or cut) would shorten every curve of its label
                print(f"  {label}: seeds {', '.join(unfinished)} unfinished, left out")
                runs[label] = {s: r for s, r in runs[label].items() if s not in unfinished}
            if not runs[label]:
                continue
            n = min(len(rows) for rows in runs[label].values())
            n = min(n, args.rounds or n)
            curves = np.array([[r["test_return_mean"] for r in rows[:n]]
                               for rows in runs[label].values()])
            x = np.arange(1, n + 1)
            tested = ~np.isnan(curves).any(0)  # --eval-every N: only the tested rounds
            curves = curves[:, tested]
            x = x[tested]
            mean = curves.mean(0)
            std = curves.std(0)
            name = LABELS.get(label, label)
            ax.plot(x, mean, color=colors[label], label=f"{name} ({len(curves)} seeds)")
            ax.fill_between(x, mean - std, mean + std, color=colors[label], alpha=0.2, linewidth=0)
            print(f"  {name:>12}: {mean[-1]:.3f} ± {std[-1]:.3f} after {n} rounds")
            late = curves[:, x > n // 2].min(1)  # a late fall shows as a low minimum here
            print(f"  {'':>12}  per seed: final {', '.join(f'{v:.1f}' for v in curves[:, -1])}; "
                  f"lowest after round {n // 2}: {', '.join(f'{v:.1f}' for v in late)}")
        ax.set(title=env_id, xlabel="round", ylabel="test return")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


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
    table, best_rows, verdicts = [], [], []
    for j, env_id in enumerate(args.env):
        runs, n, left = tuned_runs(args.runs, env_id)
        n_seeds = max(len(seeds) for rates in runs.values() for seeds in rates.values())
        best = {}
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
                mean, low, high = mean_ci(diff)
                way = ("IIF higher" if low > 0 else "standard higher" if high < 0
                       else "no difference shown")
                verdicts.append(f"{env_id}: {way} (area, IIF at {m_iif:g} x minus standard at "
                                f"{m_std:g} x: {mean:{fmt}} [{low:{fmt}}, {high:{fmt}}], {len(seeds)} seeds)")
    print("Each (method, learning rate): area = mean test return over the tested rounds, final = test "
          "return after the last compared round; mean over seeds [95 % bootstrap interval]. Best: the "
          "rate with the highest mean area.\n")
    print("| env | method | lr / preset's | seeds | area | final | |\n|---|---|---|---|---|---|---|")
    for env_id, method, m, k, area, final, note in table:
        print(f"| {env_id} | {method} | {m:g} | {k} | {area} | {final} | {note} |")
    print("\nIIF against standard PPO, paired by seed: SE in %; finals and the area difference (IIF minus "
          "standard) in test return; mean [95 % bootstrap interval]\n")
    print("| env | comparison | standard's lr x | IIF's lr x | seeds | SE_ave, records | SE_ave, even | SE_peak "
          "| RT_peak | standard, final | IIF, final | area, IIF - standard |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(best_rows))
    print("\nWhich way it falls, best against best:\n" + "\n".join(verdicts))
    legend = {}  # one legend for every panel, below them
    for ax in axes.flat:
        legend.update(zip(*reversed(ax.get_legend_handles_labels())))
    fig.legend(legend.values(), legend.keys(), loc="lower center", ncol=4, fontsize=8)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


# ---- Sec. 5.3, Fig. 7, Table 4: RLHF ----

def smooth(x, w):
    # trailing mean: value j covers rounds j .. j + w - 1
    return np.convolve(x, np.ones(w) / w, mode="valid")


@dataclass
class Rlhf:
    """rlhf_iif.py and grpo_iif.py runs: reward, test toxicity, runtime (Fig. 7, Table 4)"""
    runs: str = "results/runs"
    """folder of <env>__<label>__<seed> runs"""
    env: str = "rlhf-toy"
    """the runs' name prefix"""
    smooth: int = 5
    """rounds in the trailing mean of the reward"""
    out: str = "rlhf.png"
    """PNG to write"""


def cmd_rlhf(args):
    """Training reward and test toxicity over rounds and over runtime (Fig. 7, 14); the rounds and
    runtime each method needs to reach standard PPO's final reward; the per-round runtime
    breakdown (Table 4)."""
    runs = load_runs(args.runs, args.env)
    labels = sorted(runs, key=label_order)
    name = {lb: LABELS.get(lb, lb) for lb in labels}
    others = iter(["tab:cyan", "tab:brown", "tab:pink", "black"])
    color = {lb: COLORS[lb] if lb in COLORS else next(others, None) for lb in labels}
    keys = ("t_generate", "t_forward", "t_influence", "t_optim")
    cum_t = defaultdict(dict)  # label -> seed -> runtime after each round
    for lb in labels:
        for s, rs in runs[lb].items():
            cum_t[lb][s] = np.cumsum([sum(r[k] for k in keys) for r in rs])
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
    for label in labels:
        n = min(len(rows) for rows in runs[label].values())
        rows = list(runs[label].values())
        x = np.arange(1, n + 1)
        t = np.mean([ts[:n] for ts in cum_t[label].values()], 0)
        panels = ((axes[0], "reward_mean", x), (axes[1], "eval_toxicity", x),
                  (axes[2], "reward_mean", t))
        for ax, key, xs in panels:
            c = np.array([[r.get(key, np.nan) for r in rs[:n]] for rs in rows])  # grpo_iif.py: no test
            mean = c.mean(0)
            std = c.std(0)
            ax.plot(xs, mean, color=color[label], label=f"{name[label]} ({len(c)} seeds)")
            ax.fill_between(xs, mean - std, mean + std, color=color[label], alpha=0.2, linewidth=0)
    titles = ("training reward", "test toxicity", "training reward")
    xlabels = ("round", "round", "seconds (generation, forward, influence, optimisation)")
    for ax, title, xlabel in zip(axes, titles, xlabels):
        ax.set(title=title, xlabel=xlabel)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)

    w = args.smooth
    print(f"{args.env}: mean ± std over seeds; rewards are trailing means over {w} rounds\n")
    print("| method | rounds | final reward | final test toxicity | test toxicity after round 0 |")
    print("|---|---|---|---|---|")
    for label in labels:
        fin = [smooth([r["reward_mean"] for r in rs], w)[-1] for rs in runs[label].values()]
        tox = [[r.get("eval_toxicity", np.nan) for r in rs] for rs in runs[label].values()]
        n = len(next(iter(runs[label].values())))
        last = [x[-w:] for x in tox if not np.isnan(x[-w:]).all()]
        print(f"| {name[label]} | {n} | {np.mean(fin):.2f} ± {np.std(fin):.2f} | "
              + (f"{np.mean([np.nanmean(x) for x in last]):.3f} | {np.mean([x[0] for x in tox]):.3f} |"
                 if last else "- | - |"))
    if "none" in runs:  # per seed: when does each method first reach standard PPO's final reward?
        print("\nRounds and runtime to reach standard PPO's final reward (per seed, smoothed):\n")
        print("| method | seed | level | rounds / standard's | runtime / standard's |")
        print("|---|---|---|---|---|")
        for label in [lb for lb in labels if lb != "none"]:
            for seed in sorted(set(runs["none"]) & set(runs[label])):
                sm = {lb: smooth([r["reward_mean"] for r in runs[lb][seed]], w)
                      for lb in ("none", label)}
                v = sm["none"][-1]
                m = {lb: next((j for j, r in enumerate(sm[lb]) if r >= v), None) for lb in sm}
                if m[label] is None:
                    print(f"| {name[label]} | {seed} | {v:.2f} | not reached | - |")
                    continue
                r_lb = m[label] + w  # the round that completes the window
                r_std = m["none"] + w
                t_lb = cum_t[label][seed][r_lb - 1]
                t_std = cum_t["none"][seed][r_std - 1]
                print(f"| {name[label]} | {seed} | {v:.2f} | {r_lb} / {r_std} = {r_lb / r_std:.0%} "
                      f"| {t_lb:.0f} s / {t_std:.0f} s = {t_lb / t_std:.0%} |")
    print("\nPer-round runtime, seconds, mean over rounds and seeds (Table 4):\n")
    print("| method | generation & scoring | forward | influence | optimisation | total "
          "| episodes kept |")
    print("|---|---|---|---|---|---|---|")
    rows = {label: [r for rs in runs[label].values() for r in rs] for label in labels}
    mean = {label: [np.mean([r[k] for r in rows[label]]) for k in keys] for label in labels}
    for label in labels:
        rel = ""
        if label != "none" and "none" in mean:
            rel = f" ({sum(mean[label]) / sum(mean['none']):.0%} of standard)"
        times = " | ".join(f"{x:.2f}" for x in mean[label])
        print(f"| {name[label]} | {times} | {sum(mean[label]):.2f}{rel} | "
              f"{np.mean([r['n_kept'] for r in rows[label]]):.1f} |")
    print(f"wrote {args.out}")


# ---- I-PPO's claims (rlhf_variants.py, docs/ippo.md) ----

IPPO_LABELS = {"sft": "SFT policy (not trained)", "none": "PPO", "influence": "IIF (f_seq)",
               "i-ppo": "I-PPO", "i-ppo-noreweight": "I-PPO, no reweighting",
               "i-ppo-v16": "I-PPO, 16 reference answers"}
IPPO_COLORS = {"sft": "black", "none": "tab:blue", "influence": "tab:red", "i-ppo": "tab:green",
               "i-ppo-noreweight": "tab:olive", "i-ppo-v16": "tab:cyan"}
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
    """Per task and method, over seeds, mean [95 % bootstrap interval]: the final reward, test
    metric and KL (means of the last --last rounds), the unfaithful share among right answers, the kept
    fraction and the first round it falls below a half, and the seconds per round and to PPO's
    final reward; then I-PPO's differences from SFT and PPO, seed by seed."""
    w = args.last
    tasks = [(env, load_runs(args.runs, env)) for env in args.env]
    fig, axes = plt.subplots(len(tasks), 3, figsize=(14, 3.3 * len(tasks)), squeeze=False)
    kfig, kaxes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 3.3), squeeze=False)
    for (env, runs), ax, kax in zip(tasks, axes, kaxes[0]):
        first_row = next(iter(next(iter(runs.values())).values()))[0]
        cot = not np.isnan(first_row.get("eval_accuracy", np.nan))
        metric, name = ("eval_accuracy", "test accuracy") if cot else ("eval_toxicity", "test toxicity")
        labels = [lb for lb in IPPO_LABELS if lb in runs]
        print(f"\n{env}: mean [95 % bootstrap interval] over seeds; reward and {name}: means of the last "
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
        for ippo in [lb for lb in ("i-ppo", "i-ppo-noreweight") if lb in stats]:
            print(f"\n{IPPO_LABELS[ippo]} minus each method, seed by seed, mean [95 % bootstrap interval]:\n")
            print(f"| against | final reward | {name} |" + (" unfaithful among right, test |" if cot else ""))
            print("|---|---|---|" + ("---|" if cot else ""))
            for lb in [b for b in labels if b != ippo]:
                seeds = sorted(set(stats[ippo][0]) & set(stats[lb][0]))
                d = [[stats[ippo][j][s] - stats[lb][j][s] for s in seeds] for j in range(len(stats[lb]))]
                print(f"| {IPPO_LABELS[lb]} ({len(seeds)} seeds) | "
                      + " | ".join(fmt_ci(x, 1, "+.3f") for x in d) + " |")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    kfig.tight_layout()
    kout = args.out.replace(".png", "_kept.png")
    kfig.savefig(kout, dpi=110)
    print(f"\nwrote {args.out} and {kout}")


# ---- Sec. 4.1, Fig. 3: what bottom records look like, and why ----

def load_round(run_dir, k):
    path = os.path.join(run_dir, "rounds", f"round_{k:04d}.pt")
    if not os.path.exists(path):
        fail(f"{path} not found: make the run with iif.py --save-rounds")
    return torch.load(path)


def load_config(run_dir):
    """A run's config.json with every flag of iif_variants.py."""
    with open(os.path.join(run_dir, "config.json")) as f:
        config = json.load(f)
    if "norm_adv" in config:  # runs made before these flags existed used the values below
        config["adv_norm"] = "buffer" if config.pop("norm_adv") else "none"
        config.setdefault("influence_loss", "full")
        config.setdefault("target_adv", "normalized" if config["adv_norm"] == "buffer" else "raw")
        config.setdefault("filter_ties", "drop")
    config.setdefault("env_backend", "gymnasium")
    for key, value in variants.ADDED_FLAGS.items():
        config.setdefault(key, value)
    # iif.py writes its own flags only: the others take iif_variants.py's defaults, its behaviour
    for field in dataclasses.fields(variants.Args):
        if field.default is not dataclasses.MISSING:
            config.setdefault(field.name, field.default)
    config.setdefault("env_kwargs", iif.PRESETS.get(config["env_id"], {}).get("env_kwargs", {}))
    return config


def raw_advantages(b):
    """The GAE estimate A_hat before normalisation (returns = A_hat + V)."""
    return (b["returns"] - b["values"]).numpy()


# left, down, right, up; y grows downwards
FROZENLAKE_ARROWS = {0: (-1, 0), 1: (0, 1), 2: (1, 0), 3: (0, -1)}


def draw_frozenlake(ax, desc, states, actions, adv, title):
    """Bottom records aggregated per (s, a) on the map: an arrow per action, green for A_hat > 0
    and red for A_hat < 0 (the sign held by most of the pair's records), width by record count."""
    n = len(desc)
    colors = {b"S": "#dde8f0", b"F": "#dde8f0", b"H": "#335", b"G": "#f3c94b"}
    for y in range(n):
        for x in range(n):
            ax.add_patch(plt.Rectangle((x, y), 1, 1, facecolor=colors[desc[y][x]],
                                       edgecolor="white"))
            ax.text(x + 0.06, y + 0.2, desc[y][x].decode(), fontsize=7, color="gray")
    pairs = defaultdict(list)
    for s, a, A in zip(states, actions, adv):
        pairs[(int(s), int(a))].append(A)
    most = max(len(advs) for advs in pairs.values())
    for (s, a), advs in pairs.items():
        y, x = divmod(s, n)
        dx, dy = FROZENLAKE_ARROWS[a]
        color = "tab:green" if np.mean(np.sign(advs)) > 0 else "tab:red"
        width = 0.02 + 0.08 * np.sqrt(len(advs) / most)
        ax.arrow(x + 0.5 + 0.1 * dx, y + 0.5 + 0.1 * dy, 0.25 * dx, 0.25 * dy, width=width,
                 head_width=2.2 * width, head_length=0.12, color=color, length_includes_head=True)
        ax.text(x + 0.5 + 0.42 * dx, y + 0.5 + 0.42 * dy, str(len(advs)), fontsize=6,
                ha="center", va="center")
    ax.set(xlim=(0, n), ylim=(n, 0), title=title, aspect="equal")
    ax.axis("off")
    return pairs


# unseen, empty, wall, goal; other objects grey-blue
MINIGRID_COLORS = {0: "#222", 1: "#eee", 2: "#888", 8: "#3a3"}
MINIGRID_ACTIONS = ["turn left", "turn right", "forward", "pickup", "drop", "toggle", "done"]


def draw_minigrid_view(ax, obs, action, adv, score):
    """The agent's 7x7 egocentric view (the agent at the bottom centre, facing up) and its
    action."""
    objects = obs[..., 0].T  # MiniGrid images are indexed [x, y]
    rgb = np.array([[matplotlib.colors.to_rgb(MINIGRID_COLORS.get(int(o), "#89a")) for o in row]
                    for row in objects])
    ax.imshow(rgb)
    ax.plot(3, 6, marker="^", color="tab:red", markersize=9)
    ax.set_title(f"{MINIGRID_ACTIONS[int(action)]}\nA_hat {adv:+.2f}, I {score:.1e}", fontsize=7)
    ax.set_xticks([])
    ax.set_yticks([])


@dataclass
class BottomRecords:
    """bottom records of FrozenLake (map) or MiniGrid (views) (Fig. 3a-b, 8)"""
    run: str
    """an iif.py run made with --save-rounds"""
    rounds: tuple[int, ...] = (2, 5, 10)
    """rounds k to draw"""
    n: int = 100
    """how many bottom records (FrozenLake; MiniGrid: views a row)"""
    out: str = "bottom_records.png"
    """PNG to write"""


def cmd_bottom_records(args):
    config = load_config(args.run)
    rounds = [load_round(args.run, k) for k in args.rounds]
    if config["env_id"].startswith("FrozenLake"):
        import gymnasium as gym
        desc = gym.make(config["env_id"], **config["env_kwargs"]).unwrapped.desc.tolist()
        fig, axes = plt.subplots(1, len(rounds), figsize=(3.2 * len(rounds), 3.6), squeeze=False)
        for ax, k, b in zip(axes[0], args.rounds, rounds):
            bottom = torch.argsort(b["influence"], stable=True)[:args.n].numpy()
            states = b["obs"].argmax(1).numpy()[bottom]
            actions = b["actions"].numpy()[bottom]
            adv = raw_advantages(b)[bottom]
            title = f"bottom {args.n} records, k = {k}"
            pairs = draw_frozenlake(ax, desc, states, actions, adv, title)
            print(f"round {k}: bottom {args.n} records by (state, action): count, share with "
                  "A_hat > 0, mean A_hat")
            for (s, a), advs in sorted(pairs.items(), key=lambda kv: -len(kv[1])):
                print(f"  s={s:2d} a={'LDRU'[a]}  {len(advs):3d}  "
                      f"{np.mean(np.array(advs) > 0):.2f}  {np.mean(advs):+.3f}")
    elif config["env_id"].startswith("MiniGrid"):
        fig, axes = plt.subplots(len(rounds), args.n, figsize=(1.6 * args.n, 2.0 * len(rounds)),
                                 squeeze=False)
        for row, k, b in zip(axes, args.rounds, rounds):
            bottom = torch.argsort(b["influence"], stable=True)[:args.n].numpy()
            adv = raw_advantages(b)
            print(f"round {k}: bottom {args.n} records (action, A_hat, influence)")
            for ax, i in zip(row, bottom):
                score = b["influence"][i]
                draw_minigrid_view(ax, b["obs"][i].numpy(), b["actions"][i], adv[i], score.item())
                print(f"  record {i:4d}: action {int(b['actions'][i])}  A_hat {adv[i]:+.3f}  "
                      f"I {score:.3e}")
            row[0].set_ylabel(f"k = {k}")
    else:
        fail("bottom-records draws FrozenLake and MiniGrid runs")
    fig.tight_layout()
    fig.savefig(args.out, dpi=130)
    print(f"wrote {args.out}")


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
        agreement = iif.target_agreement(agent, dict(b, advantages=weights))
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


def rankdata(x):
    """Ranks from 1, ties sharing their average rank."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    sorted_x = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sorted_x[j + 1] == sorted_x[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x, y):
    return float(np.corrcoef(rankdata(x), rankdata(y))[0, 1])


@dataclass
class AdvantageDiagnosis:
    """influence against Monte-Carlo advantage errors (Fig. 3c-d)"""
    run: str
    """a FrozenLake iif.py run made with --save-rounds"""
    round: int = 5
    """round k"""
    out: str = "advantage_diagnosis.png"
    """PNG to write"""


def cmd_advantage_diagnosis(args):
    config = load_config(args.run)
    if not config["env_id"].startswith("FrozenLake"):
        fail("the buffer's Monte-Carlo advantage needs a FrozenLake run")
    b = load_round(args.run, args.round)
    states = b["obs"].argmax(1).numpy()
    actions = b["actions"].numpy()
    # App. C.4: the Monte-Carlo advantage A_mc from the buffer's own episodes, (steps, envs) arrays
    columns = (states, actions, b["rewards"].numpy(), b["dones"].numpy())
    a_mc = variants.mc_advantage(*(x.reshape(-1, config["num_envs"]) for x in columns), config["gamma"])
    a_mc = a_mc.ravel()
    a_hat = raw_advantages(b)
    score = b["influence"].numpy()
    ok = ~np.isnan(a_mc)
    a_mc, a_hat, score = a_mc[ok], a_hat[ok], score[ok]
    order = np.argsort(-score, kind="stable")  # decreasing influence: rank 0 is the top record
    agree = np.sign(a_mc[order]) == np.sign(a_hat[order])
    n = len(order)
    q = n // 5
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.4))
    rank = np.arange(n)
    for ax in (ax1, ax2):
        ax.axvspan(0, q, color="tab:green", alpha=0.1, label="top 20 %")
        ax.axvspan(n - q, n, color="tab:red", alpha=0.1, label="bottom 20 %")
    err = np.abs(a_mc - a_hat)[order]
    ax1.scatter(rank[agree], err[agree], s=3, color="tab:blue", label="signs agree")
    ax1.scatter(rank[~agree], err[~agree], s=3, color="tab:red", label="signs differ")
    ax1.set(xlabel="record (sorted by decreasing influence)", ylabel="|A_mc - A_hat|",
            title=f"k = {args.round}")
    ax1.legend(fontsize=7)
    ax2.scatter(rank, (a_mc * a_hat)[order], s=3, color="tab:purple")
    ax2.axhline(0, color="black", linewidth=0.5)
    rho = spearman(score, a_mc * a_hat)
    # the paper's Fig. 3d: against the rank, top record first
    rho_rank = spearman(rank, (a_mc * a_hat)[order])
    ax2.set(xlabel="record (sorted by decreasing influence)", ylabel="A_mc * A_hat",
            title=f"Spearman with the record rank: {rho_rank:.2f}")
    fig.tight_layout()
    fig.savefig(args.out, dpi=130)
    print(f"round {args.round}: {n} records whose (s, a) has a Monte-Carlo estimate")
    print("| records | sign mismatch | mean abs(A_mc - A_hat) | mean A_mc * A_hat |")
    print("|---|---|---|---|")
    groups = (("top 20 %", slice(0, q)), ("all", slice(0, n)), ("bottom 20 %", slice(n - q, n)))
    for name, sl in groups:
        prod = (a_mc * a_hat)[order][sl]
        print(f"| {name} | {np.mean(~agree[sl]):.2f} | {err[sl].mean():.3f} | {prod.mean():+.4f} |")
    print("Spearman correlation of A_mc * A_hat with the record rank (top first, Fig. 3d): "
          f"{rho_rank:.3f}; with the influence itself: {rho:.3f}")
    print(f"wrote {args.out}")


# ---- Sec. 4.2, Fig. 4, 9: behaviour formation ----

def roughness(emb, scores, u):
    """Roughness (normalised Dirichlet energy, App. C.2) of the L-inf normalised scores on a
    similarity graph of the records: Gaussian weights exp(-|e_i - e_j|^2 / sigma^2), sigma the
    median pairwise distance, each record joined to its u nearest neighbours (the union of both
    directions)."""
    s = scores / np.abs(scores).max()
    sq = (emb ** 2).sum(1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2 * emb @ emb.T, 0.0)
    off = ~np.eye(len(s), dtype=bool)
    w = np.exp(-d2 / np.median(d2[off]))
    near = np.argsort(np.where(off, d2, np.inf), axis=1, kind="stable")[:, :u]
    mask = np.zeros_like(off)
    mask[np.repeat(np.arange(len(s)), near.shape[1]), near.ravel()] = True
    w = np.where(mask | mask.T, w, 0.0)
    return float((w * (s[:, None] - s[None, :]) ** 2).sum() / w.sum())


def agent_for(config, state_dict):
    env = iif.make_env(config["env_id"])()
    agent = iif.Agent(env.observation_space, env.action_space)
    env.close()
    agent.load_state_dict(state_dict)
    return agent


def embed(agent, obs):
    """Records as the network sees them: the policy's last hidden layer."""
    with torch.no_grad():
        return agent.actor[:-1](agent.features(obs)).numpy()


def saved_rounds(run_dir):
    """k of every rounds/round_KKKK.pt, in order"""
    return sorted(int(f[6:10]) for f in os.listdir(os.path.join(run_dir, "rounds")))


@dataclass
class BehaviorFormation:
    """pi(a*|s*) and the roughness of its top records (Fig. 4, 9)"""
    run: str
    """an iif.py run made with --save-rounds"""
    record: Optional[tuple[int, int]] = None
    """ROUND INDEX: (s*, a*) = this record of this round (default: the final buffer's record whose
    log pi(a|s) rose most from the first to the final network)"""
    action: Optional[int] = None
    """pick the default record among those taking this action only (e.g. 4, "slower", on
    highway-v0)"""
    neighbours: int = 50
    """u of the u-nearest-neighbour graph"""
    phases: tuple[float, ...] = ()
    """rounds at which to draw phase boundaries"""
    out: str = "behavior_formation.png"
    """PNG to write"""


def cmd_behavior_formation(args):
    config = load_config(args.run)
    cfg = SimpleNamespace(**config)
    rounds = saved_rounds(args.run)
    final = agent_for(config, torch.load(os.path.join(args.run, "agent.pt")))
    first = agent_for(config, load_round(args.run, rounds[0])["state_dict"])
    k_pick, i_pick = args.record if args.record else (rounds[-1], None)
    b_pick = load_round(args.run, k_pick)
    if i_pick is None:  # the behaviour that formed most: log pi(a|s) rose most from first to final
        with torch.no_grad():
            logp_final = final(b_pick["obs"], b_pick["actions"], critic=False)[0]
            logp_first = first(b_pick["obs"], b_pick["actions"], critic=False)[0]
        rise = logp_final - logp_first
        if args.action is not None:
            if b_pick["actions"].dim() > 1:
                fail(f"--action: {config['env_id']} has continuous actions; pick with --record")
            if not (b_pick["actions"] == args.action).any():
                fail(f"--action {args.action}: no record of round {k_pick} takes that action")
            rise[b_pick["actions"] != args.action] = -float("inf")
        i_pick = int(rise.argmax())
    s_star = b_pick["obs"][i_pick:i_pick + 1]
    a_star = b_pick["actions"][i_pick:i_pick + 1]
    print(f"target: record {i_pick} of round {k_pick}: action {a_star.tolist()} in state "
          f"{s_star.flatten().tolist()}")
    print("| round | pi(a*|s*) | positive-influence records | roughness |")
    print("|---|---|---|---|")
    pis = []
    rough = []
    for k in rounds:
        b = load_round(args.run, k)
        agent = agent_for(config, b["state_dict"])
        with torch.no_grad():
            pis.append(agent(s_star, a_star, critic=False)[0].exp().item())
        # Sec. 4.2: influence on the target f_action = log pi(a*|s*)
        target = (s_star, a_star, torch.ones(1))
        scores = variants.influence(agent, b, torch.arange(len(b["advantages"])), target, cfg,
                                    variants.scoring_advantages(b, cfg))
        top = torch.nonzero(scores > 0).flatten()
        rough.append(float("nan"))
        if len(top) > args.neighbours:
            emb = embed(final, b["obs"][top])
            rough[-1] = roughness(emb, scores[top].numpy(), args.neighbours)
        print(f"| {k} | {pis[-1]:.3f} | {len(top)} | {rough[-1]:.4f} |")
    fig, ax = plt.subplots(figsize=(6, 3.4))
    ax.plot(rounds, pis, color="black", label="pi(a*|s*)")
    ax.set(xlabel="round", ylabel="pi(a*|s*)", title=f"{config['env_id']}: behaviour formation")
    ax2 = ax.twinx()
    ax2.plot(rounds, rough, color="tab:red", label="roughness of top records")
    ax2.set_ylabel("roughness", color="tab:red")
    for edge in args.phases:
        ax.axvline(edge, color="gray", linestyle="--", linewidth=0.8)
    fig.legend(loc="upper left", bbox_to_anchor=(0.1, 0.88), fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=130)
    print(f"wrote {args.out}")


# ---- Sec. 4.3, Fig. 5, 10: single-round intervention ----

def retrain(config, b, kept, seed, rng=None, start=None):
    """theta(k) retrained on the kept records of B(k) by iif.py's Stage III, with a fresh optimizer
    (exact for SGD, which has no state); minibatches shuffled by rng, by default
    np.random.default_rng(seed). start: an agent at theta(k) to copy (default: one built from
    B(k)'s state_dict)."""
    cfg = SimpleNamespace(**config)
    agent = agent_for(config, b["state_dict"]) if start is None else copy.deepcopy(start)
    optimizer = iif.make_optimizer(agent, cfg)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed) if rng is None else rng
    variants.ppo_update(agent, optimizer, b, torch.nonzero(kept).flatten(), cfg, rng)
    return agent


def retrain_and_test(config, b, kept, seed, eval_envs, episodes):
    """Retrain from theta(k) on the kept records of B(k) and test."""
    return iif.evaluate(retrain(config, b, kept, seed), eval_envs, episodes, seed + 10_000)[0]


def make_test_envs(config, episodes):
    """Synchronous test environments for a run's config"""
    return variants.make_vec(SimpleNamespace(**{**config, "async_envs": False}), min(16, episodes))


@dataclass
class Intervention:
    """retrain one round without its negative records (Fig. 5, 10)"""
    run: tuple[str, ...]
    """standard iif.py runs made with --save-rounds (seeds)"""
    every: int = 1
    """use every n-th saved round"""
    episodes: int = 100
    """test episodes per retrained policy"""
    out: str = "intervention.png"
    """PNG to write"""


def cmd_intervention(args):
    deltas = defaultdict(lambda: defaultdict(list))  # round -> method -> [delta return]
    for run in args.run:
        config = load_config(run)
        eval_envs = make_test_envs(config, args.episodes)
        for k in saved_rounds(run)[::args.every]:
            b = load_round(run, k)
            scores = b["influence"]
            full = torch.ones(len(scores), dtype=torch.bool)
            no_negative = scores >= 0
            gen = torch.Generator().manual_seed(k)
            random_drop, _ = variants.filter_records(scores, "random", 1.0, gen)
            base = retrain_and_test(config, b, full, k, eval_envs, args.episodes)
            r_iif = retrain_and_test(config, b, no_negative, k, eval_envs, args.episodes)
            deltas[k]["IIF"].append(r_iif - base)
            r_random = retrain_and_test(config, b, random_drop, k, eval_envs, args.episodes)
            deltas[k]["Random"].append(r_random - base)
        eval_envs.close()
    rounds = sorted(deltas)
    print("| round | runs | mean delta return, negatives dropped "
          "| mean delta return, random drop |")
    print("|---|---|---|---|")
    for k in rounds:
        d = deltas[k]
        print(f"| {k} | {len(d['IIF'])} | {np.mean(d['IIF']):+.3f} | {np.mean(d['Random']):+.3f} |")
    all_iif = np.concatenate([deltas[k]["IIF"] for k in rounds])
    all_rand = np.concatenate([deltas[k]["Random"] for k in rounds])
    print(f"over all rounds and runs: negatives dropped {all_iif.mean():+.3f} "
          f"(better in {np.mean(all_iif > 0):.0%}), random drop {all_rand.mean():+.3f} "
          f"(better in {np.mean(all_rand > 0):.0%})")
    fig, ax = plt.subplots(figsize=(max(5.0, 0.5 * len(rounds)), 3.4))
    for offset, method, color in ((-0.18, "IIF", "tab:red"), (0.18, "Random", "tab:gray")):
        ax.boxplot([deltas[k][method] for k in rounds], positions=np.arange(len(rounds)) + offset,
                   widths=0.3, patch_artist=True, boxprops=dict(facecolor=color, alpha=0.5),
                   medianprops=dict(color="black"))
        label = {"IIF": "negatives dropped", "Random": "random drop"}[method]
        ax.plot([], [], color=color, linewidth=6, alpha=0.5, label=label)
    ax.axhline(0, color="tab:red", linestyle="--", linewidth=0.8)
    ax.set_xticks(np.arange(len(rounds)), [str(k) for k in rounds])
    ax.set(xlabel="round", ylabel="delta test return",
           title=f"{config['env_id']}: single-round intervention")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=130)
    print(f"wrote {args.out}")


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


COMMANDS = {  # subcommand: (its flags, what it runs)
    "curves": (Curves, cmd_curves),
    "efficiency": (Efficiency, cmd_efficiency),
    "ablation": (Ablation, cmd_ablation),
    "sensitivity": (Sensitivity, cmd_sensitivity),
    "bottom-records": (BottomRecords, cmd_bottom_records),
    "dropped": (Dropped, cmd_dropped),
    "rescore": (Rescore, cmd_rescore),
    "advantage-diagnosis": (AdvantageDiagnosis, cmd_advantage_diagnosis),
    "behavior-formation": (BehaviorFormation, cmd_behavior_formation),
    "intervention": (Intervention, cmd_intervention),
    "counterfactual": (Counterfactual, cmd_counterfactual),
    "rlhf": (Rlhf, cmd_rlhf),
    "ippo": (Ippo, cmd_ippo),
}


def main():
    flags = {name: cls for name, (cls, _) in COMMANDS.items()}
    args = tyro.extras.subcommand_cli_from_dict(flags, description=__doc__.splitlines()[0])
    for key in ("env", "variants", "rounds", "run"):  # lists that need at least one value
        if getattr(args, key, None) == ():
            fail(f"--{key} needs at least one value")
    torch.set_num_threads(1)
    torch.distributions.Distribution.set_default_validate_args(False)
    run = dict(COMMANDS.values())[type(args)]
    run(args)


if __name__ == "__main__":
    main()
