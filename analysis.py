r"""The paper's diagnostics (Sec. 4, 5.2, 5.3) from what iif.py, rlhf_iif.py and grpo_iif.py save.

Each subcommand prints the numbers of a figure or table, and all but efficiency draw it in a PNG:

    python analysis.py curves --runs results/runs --env FrozenLake-v1        # Fig. 6a
    python analysis.py curves --runs results/runs --env Acrobot-v1 --column approx_kl   # PPO's own
    python analysis.py efficiency --runs results/runs --env FrozenLake-v1 Acrobot-v1   # Fig. 6b, Table 3
    python analysis.py bottom-records --run results/diagnostics/FrozenLake-v1__none__1 --rounds 2 5 10
    python analysis.py rlhf --runs results/runs --env rlhf-toy                # Fig. 7, Table 4

Runs follow results/reproduce.sh's naming, <runs>/<env>__<label>__<seed>/metrics.csv, the label a
--filter-method (influence, none, random) or any other tag; the Sec. 4 diagnostics read the rounds/ of
a run made with iif.py --save-rounds (docs/analysis.md). "[lo, hi]" in every table is the 95 %
t-interval of the mean over seeds. research/analysis_variants.py adds the analyses beyond the paper.
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

LABELS = {"influence": "IIF", "none": "Standard", "random": "Random", "f_return": "IIF (f_return)"}
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
    """The rounds a run was started for (its config.json's num_rounds; rlhf_iif.py's: rounds), else default."""
    try:
        with open(os.path.join(runs_dir, f"{env_id}__{label}__{seed}", "config.json")) as f:
            config = json.load(f)
        return int(config["num_rounds"] if "num_rounds" in config else config["rounds"])
    except (OSError, KeyError, ValueError):
        return default


def label_order(label, names=LABELS):
    """names' labels first, in its order, then the others alphabetically"""
    return (label not in names, list(names).index(label) if label in names else label)


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


def efficiency(std_rows, iif_rows, levels="records"):
    """SE_ave, SE_peak, RT_peak of one IIF run against one standard run, SE at each level, and how
    many levels IIF never reached. SE(v) = 1 - m_IIF(v) / m_std(v), averaged over Sec. 5.2's "list
    of strictly increasing performance levels reached by standard training": "records", the record
    test returns standard training set (its running maxima), or levels(standard's test returns) for
    another reading, the last at its peak. A level IIF never reaches counts with m_IIF = its number
    of rounds + 1, a bound in IIF's favour.
    RT_peak = 1 - (IIF's influence + optimisation time until it matches standard's peak) /
    (standard's optimisation time over all its rounds): Table 3's formula (FrozenLake 1 - 64.64 /
    93.85 = 31.1 %); standard PPO needs no influence. SE_peak and RT_peak do not depend on the
    reading."""
    std = [r["test_return_mean"] for r in std_rows]
    iif = [r["test_return_mean"] for r in iif_rows]
    levels = record_levels(std) if levels == "records" else levels(std)
    m_iif = [min(first_round(iif, v), len(iif) + 1) for v in levels]
    se = [1 - mi / first_round(std, v) for mi, v in zip(m_iif, levels)]  # Sec. 5.2: SE(v)
    t_std = np.cumsum([r["t_optim"] for r in std_rows])
    t_iif = np.cumsum([r["t_influence"] + r["t_optim"] for r in iif_rows])
    t_iif_peak = t_iif[m_iif[-1] - 1] if m_iif[-1] <= len(iif) else t_iif[-1]
    return dict(se_ave=float(np.mean(se)), se_peak=se[-1], rt_peak=1 - t_iif_peak / t_std[-1],
                n_levels=len(levels), n_unreached=sum(mi > len(iif) for mi in m_iif), se=se)


def mean_ci(x, level=0.95):
    """Mean over seeds and its 95 % t-interval (Student's t, n - 1 degrees of freedom); with one
    seed, the mean alone (low = high = nan)"""
    x = np.asarray(x, dtype=float)
    if len(x) < 2:
        return float(np.mean(x)) if len(x) else math.nan, math.nan, math.nan
    h = scipy.stats.t.ppf((1 + level) / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return float(x.mean()), float(x.mean() - h), float(x.mean() + h)


def fmt_ci(x, scale=100.0, fmt=".1f"):
    mean, low, high = (scale * v for v in mean_ci(x))
    return f"{mean:{fmt}} [{low:{fmt}}, {high:{fmt}}]" if len(x) > 1 else f"{mean:{fmt}} (1 seed)"


@dataclass
class Efficiency:
    """SE_ave (over standard's record returns), SE_peak, RT_peak, each a mean over seeds with its
    95 % t-interval, and the runtime breakdown (Fig. 6b, Table 3)"""
    env: tuple[str, ...]
    """env ids"""
    runs: str = "results/runs"
    """folder of <env>__<label>__<seed> runs"""
    label: str = "influence"
    """label compared with standard PPO ('none')"""


def cmd_efficiency(args, prepare=None, readings=(("SE_ave", "records"),), said="record returns", extra=()):
    """The table. analysis_variants.py efficiency passes prepare(runs, env_id) -> the runs compared;
    readings, SE_ave's columns as (heading, efficiency's levels), and said, what levels they are;
    extra, tables of its own before the runtimes, (heading, rows(env_id, runs, seeds)) each."""
    name = LABELS.get(args.label, args.label)
    print(f"Mean over seeds [95 % t-interval], in %. SE_ave over standard's {said}; levels: "
          f"records per seed (how many {name} never reached)\n")
    print(f"| env | method | seeds | {' | '.join(h for h, _ in readings)} | SE_peak | RT_peak | levels |")
    print("|---|---|---|" + "---|" * len(readings) + "---|---|---|")
    breakdown, left_out, tables = [], [], [[] for _ in extra]
    for env_id in args.env:
        runs = load_runs(args.runs, env_id)
        runs = prepare(runs, env_id) if prepare else runs
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
        res = [efficiency(runs["none"][s], runs[args.label][s]) for s in seeds]  # SE_peak, RT_peak
        cells = [fmt_ci([efficiency(runs["none"][s], runs[args.label][s], lv)["se_ave"] for s in seeds])
                 for _, lv in readings]
        cells += [fmt_ci([r["se_peak"] for r in res]), fmt_ci([r["rt_peak"] for r in res])]
        levels = ", ".join(f"{r['n_levels']} ({r['n_unreached']})" for r in res)
        print(f"| {env_id} | {name} | {len(seeds)} | {' | '.join(cells)} | {levels} |")
        for rows, (_, more) in zip(tables, extra):
            rows += more(env_id, runs, seeds)
        for label in ("none", args.label):
            rows = [r for s in seeds for r in runs[label][s]]
            keys = ("t_rollout", "t_influence", "t_optim", "t_eval", "n_kept", "n_updates")
            means = [np.mean([r[k] for r in rows]) for k in keys]
            breakdown.append((env_id, LABELS.get(label, label), *means))
    if left_out:
        print("\n" + "\n".join(left_out))
    for (heading, _), rows in zip(extra, tables):
        if rows:
            print(heading + "\n".join(rows))
    print("\nPer-round means (seconds; Table 3):\n")
    print("| env | method | rollout | influence | optimisation | evaluation | records kept "
          "| optimizer steps |")
    print("|---|---|---|---|---|---|---|---|")
    for env_id, label, *v in breakdown:
        print(f"| {env_id} | {label} | {v[0]:.2f} | {v[1]:.3f} | {v[2]:.2f} | {v[3]:.2f} "
              f"| {v[4]:.0f} | {v[5]:.0f} |")


# ---- Fig. 6a, Fig. 13: test return over rounds ----

@dataclass
class Curves:
    """a metrics.csv column over rounds, mean and a band over seeds: the test return (Fig. 6a,
    13), or PPO's per-update diagnostics (pg_loss, vf_loss, entropy, approx_kl, clip_frac,
    explained_var; kl: the round's KL on B(k))"""
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
    column: str = "test_return_mean"
    """the metrics.csv column to draw"""
    band: Literal["std", "t"] = "std"
    """the band around the mean: the seeds' standard deviation, or the 95 % t-interval of the mean"""


def cmd_curves(args, names=LABELS):
    n_env, what = len(args.env), "test return" if args.column == "test_return_mean" else args.column
    cols, rows = min(n_env, 3), -(-n_env // 3)  # rows of 3 panels
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.4 * rows), squeeze=False)
    for ax, env_id in zip(axes.flat, args.env):
        runs = load_runs(args.runs, env_id)
        print(f"{env_id}: final {what}, mean ± std over seeds")
        labels = sorted(runs, key=lambda lb: label_order(lb, names))
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
            n = min(*(len(rows) for rows in runs[label].values()), args.rounds or math.inf)
            curves = np.array([[r.get(args.column, math.nan) for r in rows[:n]]
                               for rows in runs[label].values()])
            x = np.arange(1, n + 1)
            tested = ~np.isnan(curves).any(0)  # --eval-every N: only the tested rounds
            curves, x = curves[:, tested], x[tested]
            mean, std = curves.mean(0), curves.std(0)
            low, high = np.array([mean_ci(c)[1:] for c in curves.T]).T if args.band == "t" else (mean - std, mean + std)
            name = names.get(label, label)
            ax.plot(x, mean, color=colors[label], label=f"{name} ({len(curves)} seeds)")
            ax.fill_between(x, low, high, color=colors[label], alpha=0.2, linewidth=0)
            print(f"  {name:>12}: {mean[-1]:.3f} ± {std[-1]:.3f} after {n} rounds")
            late = curves[:, x > n // 2].min(1)  # a late fall shows as a low minimum here
            print(f"  {'':>12}  per seed: final {', '.join(f'{v:.1f}' for v in curves[:, -1])}; "
                  f"lowest after round {n // 2}: {', '.join(f'{v:.1f}' for v in late)}")
        ax.set(title=env_id, xlabel="round", ylabel=what)
        ax.legend(fontsize=8)
    fig.tight_layout()
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
    cum_t = {lb: {s: np.cumsum([sum(r[k] for k in keys) for r in rs]) for s, rs in runs[lb].items()}
             for lb in labels}  # label -> seed -> runtime after each round
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
            mean, std = c.mean(0), c.std(0)
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
                r_lb, r_std = m[label] + w, m["none"] + w  # the round that completes the window
                t_lb, t_std = cum_t[label][seed][r_lb - 1], cum_t["none"][seed][r_std - 1]
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


# ---- Sec. 4.1, Fig. 3: what bottom records look like, and why ----

def load_round(run_dir, k):
    path = os.path.join(run_dir, "rounds", f"round_{k:04d}.pt")
    if not os.path.exists(path):
        fail(f"{path} not found: make the run with iif.py --save-rounds")
    return torch.load(path)


def load_config(run_dir):
    """A run's config.json, with iif.py's defaults for flags it lacks."""
    with open(os.path.join(run_dir, "config.json")) as f:
        config = json.load(f)
    config.setdefault("env_backend", "gymnasium")
    config = {**{f.name: f.default for f in dataclasses.fields(iif.Args)
                 if f.default is not dataclasses.MISSING}, **config}
    config.setdefault("env_kwargs", iif.PRESETS.get(config["env_id"], {}).get("env_kwargs", {}))
    return config


def mc_advantage(states, actions, rewards, dones, gamma):
    """Monte-Carlo advantage from the buffer itself (Sec. 4.1, App. C.4; for discrete observations
    that recur): A_mc(s, a) = mean discounted return after the visits of (s, a) - mean after the
    visits of s. Arrays are (steps, envs); states hold hashable keys. Only finished episodes'
    returns count; a pair never seen in a finished episode gets nan."""
    T, N = rewards.shape
    returns = np.full((T, N), np.nan)
    for e in range(N):
        g, complete = 0.0, False
        for t in reversed(range(T)):
            if dones[t, e]:
                g, complete = 0.0, True
            g = rewards[t, e] + gamma * g
            returns[t, e] = g if complete else np.nan
    q, v = {}, {}
    for s, a, g in zip(states.ravel(), actions.ravel(), returns.ravel()):
        if not np.isnan(g):
            q.setdefault((s, a), []).append(g)
            v.setdefault(s, []).append(g)
    return np.array([np.mean(q[(s, a)]) - np.mean(v[s]) if (s, a) in q else np.nan
                     for s, a in zip(states.ravel(), actions.ravel())]).reshape(T, N)


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
    ax.set(xticks=[], yticks=[])


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
            pairs = draw_frozenlake(ax, desc, states, actions, adv, f"bottom {args.n} records, k = {k}")
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


def spearman(x, y):
    """Spearman's rank correlation, ties sharing their average rank"""
    return float(scipy.stats.spearmanr(x, y).statistic)


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
    a_mc = mc_advantage(*(x.reshape(-1, config["num_envs"]) for x in columns), config["gamma"]).ravel()
    a_hat = raw_advantages(b)
    score = b["influence"].numpy()
    ok = ~np.isnan(a_mc)
    a_mc, a_hat, score = a_mc[ok], a_hat[ok], score[ok]
    order = np.argsort(-score, kind="stable")  # decreasing influence: rank 0 is the top record
    agree = np.sign(a_mc[order]) == np.sign(a_hat[order])
    n, q = len(order), len(order) // 5
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
    rho_rank = spearman(rank, (a_mc * a_hat)[order])  # the paper's Fig. 3d: the rank, top record first
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
    model = os.path.join(args.run, "iif.cleanrl_model")  # iif.py --save-model's; iif_variants.py writes agent.pt
    state = torch.load(model if os.path.exists(model) else os.path.join(args.run, "agent.pt"))
    final = agent_for(config, state.get("agent", state))  # iif.py's older models: {"agent": state_dict}
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
    s_star, a_star = b_pick["obs"][i_pick:i_pick + 1], b_pick["actions"][i_pick:i_pick + 1]
    print(f"target: record {i_pick} of round {k_pick}: action {a_star.tolist()} in state "
          f"{s_star.flatten().tolist()}")
    print("| round | pi(a*|s*) | positive-influence records | roughness |")
    print("|---|---|---|---|")
    pis, rough = [], []
    for k in rounds:
        b = load_round(args.run, k)
        agent = agent_for(config, b["state_dict"])
        with torch.no_grad():
            pis.append(agent(s_star, a_star, critic=False)[0].exp().item())
        # Sec. 4.2: influence on the target f_action = log pi(a*|s*)
        target = (s_star, a_star, torch.ones(1))
        scores = iif.influence(agent, b, cfg, target)
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

def retrain(config, b, kept, seed, rng=None, start=None, update=iif.ppo_update):
    """theta(k) retrained on the kept records of B(k) by iif.py's Stage III, with a fresh optimizer
    (exact for SGD, which has no state); minibatches shuffled by rng, by default
    np.random.default_rng(seed). start: an agent at theta(k) to copy (default: one built from
    B(k)'s state_dict); update: Stage III (iif_variants.py's, with its switches, in analysis_variants.py)."""
    cfg = SimpleNamespace(**config)
    agent = agent_for(config, b["state_dict"]) if start is None else copy.deepcopy(start)
    optimizer = iif.make_optimizer(agent, cfg)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed) if rng is None else rng
    update(agent, optimizer, b, torch.nonzero(kept).flatten(), cfg, rng)
    return agent


def retrain_and_test(config, b, kept, seed, eval_envs, episodes):
    """Retrain from theta(k) on the kept records of B(k) and test."""
    return iif.evaluate(retrain(config, b, kept, seed), eval_envs, episodes, seed + 10_000)[0]


def make_test_envs(config, episodes):
    """Synchronous test environments for a run's config"""
    backend = config.get("backends", [config["env_backend"]] * 2)[1]  # runs made before backends: one for both
    return iif.make_vec(SimpleNamespace(**config), min(16, episodes), backend)


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
            gen = torch.Generator().manual_seed(k)
            random_drop, _ = iif.filter_records(scores, "random", 1.0, gen)
            base = retrain_and_test(config, b, full, k, eval_envs, args.episodes)
            for method, kept in (("IIF", scores >= 0), ("Random", random_drop)):  # negatives dropped
                deltas[k][method].append(retrain_and_test(config, b, kept, k, eval_envs, args.episodes) - base)
        eval_envs.close()
    rounds = sorted(deltas)
    print("| round | runs | mean delta return, negatives dropped "
          "| mean delta return, random drop |")
    print("|---|---|---|---|")
    for k in rounds:
        d = deltas[k]
        print(f"| {k} | {len(d['IIF'])} | {np.mean(d['IIF']):+.3f} | {np.mean(d['Random']):+.3f} |")
    all_iif, all_rand = (np.concatenate([deltas[k][m] for k in rounds]) for m in ("IIF", "Random"))
    print(f"over all rounds and runs: negatives dropped {all_iif.mean():+.3f} "
          f"(better in {np.mean(all_iif > 0):.0%}), random drop {all_rand.mean():+.3f} "
          f"(better in {np.mean(all_rand > 0):.0%})")
    fig, ax = plt.subplots(figsize=(max(5.0, 0.5 * len(rounds)), 3.4))
    for offset, method, color, label in ((-0.18, "IIF", "tab:red", "negatives dropped"),
                                         (0.18, "Random", "tab:gray", "random drop")):
        ax.boxplot([deltas[k][method] for k in rounds], positions=np.arange(len(rounds)) + offset,
                   widths=0.3, patch_artist=True, boxprops=dict(facecolor=color, alpha=0.5),
                   medianprops=dict(color="black"))
        ax.plot([], [], color=color, linewidth=6, alpha=0.5, label=label)
    ax.axhline(0, color="tab:red", linestyle="--", linewidth=0.8)
    ax.set_xticks(np.arange(len(rounds)), [str(k) for k in rounds])
    ax.set(xlabel="round", ylabel="delta test return",
           title=f"{config['env_id']}: single-round intervention")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=130)
    print(f"wrote {args.out}")


COMMANDS = {  # subcommand: (its flags, what it runs)
    "curves": (Curves, cmd_curves),
    "efficiency": (Efficiency, cmd_efficiency),
    "bottom-records": (BottomRecords, cmd_bottom_records),
    "advantage-diagnosis": (AdvantageDiagnosis, cmd_advantage_diagnosis),
    "behavior-formation": (BehaviorFormation, cmd_behavior_formation),
    "intervention": (Intervention, cmd_intervention),
    "rlhf": (Rlhf, cmd_rlhf),
}


def main():
    args = tyro.extras.subcommand_cli_from_dict({name: cls for name, (cls, _) in COMMANDS.items()},
                                                description=__doc__.splitlines()[0])
    for key in ("env", "variants", "rounds", "run"):  # lists that need at least one value
        if getattr(args, key, None) == ():
            fail(f"--{key} needs at least one value")
    torch.set_num_threads(1)
    torch.distributions.Distribution.set_default_validate_args(False)
    run = dict(COMMANDS.values())[type(args)]
    run(args)


if __name__ == "__main__":
    main()
