r"""Analyses beyond the paper's figures, of the runs iif_variants.py and rlhf_variants.py write.

analysis.py reproduces the paper's diagnostics; this file imports it, as iif_variants.py imports iif.py, and adds:

    python analysis_variants.py frontier --runs results/frontier/runs --env ippo-detox ippo-cot

Each subcommand prints its table and draws its figure in a PNG.
"""
from dataclasses import dataclass

import numpy as np
import torch
import tyro

import analysis
from analysis import IPPO_COLORS, IPPO_LABELS, fail, load_runs, plt


# ---- RLHF methods at equal KL to the reference (results/frontier.sh) ----

@dataclass
class Frontier:
    """rlhf_variants.py's runs at a sweep of the KL penalty beta (results/frontier.sh): each method's final reward
    and test metric against its final KL to the reference, and each method against PPO at equal KL"""
    runs: str = "results/frontier/runs"
    """folder of <env>__<label>-b<beta>__<seed> runs"""
    env: tuple[str, ...] = ("ippo-detox", "ippo-cot")
    """the runs' name prefixes, one per task"""
    last: int = 5
    """rounds in the trailing means of the reward, the test metric and the KL"""
    resamples: int = 2000
    """bootstrap resamples of the seeds of every point"""
    out: str = "frontier.png"
    """PNG of the curves"""


def frontier_points(runs, last, metrics):
    """{method: {beta: {metric: [one value a seed]}}}, the metrics the means of a run's last rounds"""
    points = {}
    for label, seeds in runs.items():
        method, _, beta = label.rpartition("-b")
        if not method:
            continue
        point = {m: [np.nanmean([r[m] for r in rs[-last:]]) for rs in seeds.values()] for m in metrics}
        points.setdefault(method, {})[float(beta)] = point
    return points


def at_kl(curve, kl):
    """The curve {beta: (KL, value)} read at kl, linearly in log KL between its two nearest points (nan outside
    its KLs)"""
    xs, ys = zip(*sorted(curve.values()))
    if not xs[0] <= kl <= xs[-1]:
        return np.nan
    return float(np.interp(np.log(kl), np.log(xs), ys))


def equal_kl(points, method, metric, resamples, rng):
    """method's points against PPO's curve at the same KL: per beta of method whose mean KL lies inside PPO's KLs,
    the difference of the metric's mean from PPO's curve read there, and its 95 % bootstrap interval (each
    point's seeds resampled, PPO's curve redrawn from its resampled points)"""
    ppo, out = points["none"], []
    for beta, p in sorted(points[method].items()):
        def diff(take):
            curve = {b: (np.mean(take(q["kl"])), np.mean(take(q[metric]))) for b, q in ppo.items()}
            kl = np.mean(take(p["kl"]))
            return np.mean(take(p[metric])) - at_kl(curve, kl)
        d = diff(lambda x: np.asarray(x))
        if np.isnan(d):
            continue
        boot = [diff(lambda x: rng.choice(np.asarray(x), len(x))) for _ in range(resamples)]
        out.append((beta, float(np.mean(p["kl"])), d, *np.nanpercentile(boot, [2.5, 97.5])))
    return out


def verdict(rows):
    """ahead / behind where every compared point's interval lies on one side of 0, else not shown"""
    if not rows:
        return "no KL in common"
    if all(lo > 0 for *_, lo, _ in rows):
        return "ahead of PPO"
    if all(hi < 0 for *_, hi in rows):
        return "behind PPO"
    return "not shown"


def cmd_frontier(args):
    """Per task: every method's points (beta: final KL, reward and test metric, mean [95 % bootstrap interval]
    over seeds), the differences from PPO at equal KL, a verdict per method and metric, and a figure of reward and
    test metric against KL"""
    rng = np.random.default_rng(0)
    fig, axes = plt.subplots(len(args.env), 3, figsize=(15, 3.6 * len(args.env)), squeeze=False)
    for env, ax in zip(args.env, axes):
        runs = load_runs(args.runs, env)
        row = next(iter(next(iter(runs.values())).values()))[0]
        cot = not np.isnan(row.get("eval_accuracy", np.nan))
        tests = (["eval_accuracy", "eval_unfaithful"] if cot else ["eval_toxicity"])
        names = {"reward_mean": "final reward", "eval_accuracy": "test accuracy",
                 "eval_unfaithful": "unfaithful among right, test", "eval_toxicity": "test toxicity"}
        points = frontier_points(runs, args.last, ["kl", "reward_mean", *tests])
        if "none" not in points:
            fail(f"{env}: no PPO (none-b<beta>) runs under {args.runs}")
        print(f"\n{env}: final values, means of the last {args.last} rounds, mean [95 % bootstrap interval] over "
              f"seeds\n")
        print("| method | beta | seeds | KL to the reference | " + " | ".join(names[m] for m in ["reward_mean", *tests])
              + " |")
        print("|---|---|---|---|" + "---|" * (1 + len(tests)))
        methods = [m for m in IPPO_LABELS if m in points]
        for m in methods:
            for beta, p in sorted(points[m].items()):
                print(f"| {IPPO_LABELS[m]} | {beta:g} | {len(p['kl'])} | {analysis.fmt_ci(p['kl'], 1, '.2f')} | "
                      + " | ".join(analysis.fmt_ci(p[k], 1, ".3f") for k in ["reward_mean", *tests]) + " |")
        print(f"\n{env}: each method minus PPO at the same KL (PPO's curve read at the method's mean KL, linearly "
              f"in log KL between PPO's points; points outside PPO's KLs are left out), [95 % bootstrap interval, "
              f"{args.resamples} resamples of every point's seeds]\n")
        print("| method | beta | KL | " + " | ".join(names[m] for m in ["reward_mean", *tests]) + " |")
        print("|---|---|---|" + "---|" * (1 + len(tests)))
        verdicts = {}
        for m in methods[1:] if methods[0] == "none" else methods:
            if m == "none":
                continue
            per_metric = {k: equal_kl(points, m, k, args.resamples, rng) for k in ["reward_mean", *tests]}
            verdicts[m] = {k: verdict(v) for k, v in per_metric.items()}
            for i, (beta, kl, *_) in enumerate(per_metric["reward_mean"]):
                cells = [f"{v[i][2]:+.3f} [{v[i][3]:+.3f}, {v[i][4]:+.3f}]" for v in per_metric.values()]
                print(f"| {IPPO_LABELS[m]} | {beta:g} | {kl:.2f} | " + " | ".join(cells) + " |")
        print(f"\n{env}: verdicts at equal KL (ahead or behind: every compared point's interval on one side of 0; "
              "lower is better for toxicity and the unfaithful share)\n")
        print("| method | " + " | ".join(names[m] for m in ["reward_mean", *tests]) + " |")
        print("|---|" + "---|" * (1 + len(tests)))
        for m, v in verdicts.items():
            print(f"| {IPPO_LABELS[m]} | " + " | ".join(v.values()) + " |")
        for a, metric in zip(ax, ["reward_mean", *tests, "kl"][:3]):
            for m in methods:
                pts = sorted(points[m].items())
                kl = np.array([np.mean(p["kl"]) for _, p in pts])
                y = np.array([np.mean(p[metric]) for _, p in pts])
                a.errorbar(kl, y, xerr=[np.std(p["kl"]) for _, p in pts], yerr=[np.std(p[metric]) for _, p in pts],
                           color=IPPO_COLORS[m], marker="o", markersize=3, capsize=2, label=IPPO_LABELS[m])
                for (beta, _), x, yy in zip(pts, kl, y):
                    a.annotate(f"{beta:g}", (x, yy), fontsize=6, xytext=(2, 2), textcoords="offset points")
            a.set(xscale="log", xlabel="final KL to the reference", title=f"{env}: {names[metric]}")
        ax[0].legend(fontsize=7)
        if len(tests) == 1:
            ax[2].axis("off")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"\nwrote {args.out} (points: mean over seeds, bars: std over seeds, labels: beta)")


COMMANDS = {  # subcommand: (its flags, what it runs)
    "frontier": (Frontier, cmd_frontier),
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
