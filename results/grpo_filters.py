"""The comparison of docs/grpo.md: GRPO + IIF against the cheap filters, on the runs of results/grpo_filters.sh.

    python results/grpo_filters.py        # prints the tables, writes results/figures/grpo_filters.png
    python results/grpo_filters.py --runs runs --prefix gsm8k --out gsm8k_filters.png   # other runs

Per task and method, over seeds: the mean and its 95 % t-interval (analysis.py's mean_ci) of
the completions kept per generation batch, the final training reward (trailing mean of 5 generation
batches), the test metric after the last generation batch, and the generated completions and seconds
(generation, forward, influence or filtering, update; test evaluation left out) until the training
reward (trailing mean of 5) first reaches plain GRPO's final reward of the same seed, over the seeds
that reach it. The runs ran one after another on a machine whose load changed, so the seconds are
also given load-adjusted: the ratio to plain GRPO's seconds of the same seed is multiplied by the
ratio of the two runs' mean time per batch for generation and TRL's forward pass (the same work
under every method). Each method against plain GRPO, paired by seed, under the one rule
(research/verdicts.py): the paired t-test, Holm over the methods of one task and measure.
"""
import argparse
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "research"))  # verdicts.py
from analysis import fmt_ci, load_runs, plt, smooth  # noqa: E402
import verdicts  # noqa: E402

TASKS = [("grpo-filters-add", "2-digit addition, reward 1 or 0 (exact checker)", "eval_accuracy",
          "test accuracy"),
         ("grpo-filters-detox", "detox, classifier's reward", "eval_toxicity", "test toxicity")]
LABELS = ["none", "influence", "random", "zero-variance", "max-variance", "abs-advantage", "validation-target",
          "i-ppo"]
NAMES = {"none": "plain GRPO", "influence": "IIF", "random": "random", "zero-variance": "zero-variance (DAPO)",
         "max-variance": "max-variance (PODS)", "abs-advantage": "abs-advantage (CPPO)",
         "validation-target": "IIF, f on fresh validation completions", "i-ppo": "I-PPO (its rules)"}
COLORS = {"none": "tab:blue", "influence": "tab:red", "random": "tab:gray", "zero-variance": "tab:green",
          "max-variance": "tab:purple", "abs-advantage": "tab:orange", "validation-target": "tab:brown",
          "i-ppo": "black"}
TIMES = ("t_generate", "t_forward", "t_influence", "t_optim")
W = 5  # generation batches in the trailing mean of the reward


def planned(runs_dir, name):
    """The generation batches a run was started for: --max-steps over the optimizer steps per batch"""
    with open(os.path.join(runs_dir, name, "config.json")) as f:
        c = json.load(f)
    return c["max_steps"] * c["gradient_accumulation_steps"] * c["mini_batch_size"] // (
        c["batch_size"] * c["num_iterations"])


def per_seed(runs, label, seed, metric):
    rows = runs[label][seed]
    reward = smooth([r["reward_mean"] for r in rows], W)
    plain = smooth([r["reward_mean"] for r in runs["none"][seed]], W)[-1]
    seconds = np.cumsum([sum(r[k] for k in TIMES) for r in rows])
    first = next((j for j, v in enumerate(reward) if v >= plain), None)
    reach = None
    if first is not None:
        n = first + W  # the generation batch that completes the window
        reach = (sum(r["completions"] for r in rows[:n]), seconds[n - 1])
    # generation and TRL's forward pass: the same work under every method, so its time measures the load
    base = np.mean([r["t_generate"] + r["t_forward"] for r in rows])
    return dict(kept=np.mean([r["n_kept"] for r in rows]), final=reward[-1], test=rows[-1][metric],
                per_batch=seconds[-1] / len(rows), reach=reach, base=base)


def table(prefix, title, metric, metric_name, runs):
    labels = [lb for lb in LABELS if lb in runs]
    done = {lb: sorted(s for s in runs[lb] if s in runs.get("none", {})) for lb in labels}
    print(f"\n{title} ({prefix}): mean [95 % t-interval] over seeds\n")
    print(f"| method | seeds | kept of 64 | final reward | {metric_name} after the last batch | reach plain "
          "GRPO's final reward | completions to it | seconds to it | seconds to it / plain GRPO's | "
          "the same, load-adjusted | seconds per batch |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    stats = {lb: {s: per_seed(runs, lb, s, metric) for s in done[lb]} for lb in labels}
    for lb in labels:
        st = stats[lb]
        if not st:
            continue
        col = {k: [v[k] for v in st.values()] for k in ("kept", "final", "test", "per_batch")}
        reached = {s: v["reach"] for s, v in st.items() if v["reach"] is not None}
        ratio = [t / stats["none"][s]["reach"][1] for s, (_, t) in reached.items()]
        adjusted = [r * stats["none"][s]["base"] / st[s]["base"] for r, s in zip(ratio, reached)]
        f = "-" if not reached else None
        print(f"| {NAMES[lb]} | {len(st)} | {fmt_ci(col['kept'], 1, '.1f')} | {fmt_ci(col['final'], 1, '.3f')} "
              f"| {fmt_ci(col['test'], 1, '.3f')} | {len(reached)} of {len(st)} "
              f"| {f or fmt_ci([c for c, _ in reached.values()], 1, '.0f')} "
              f"| {f or fmt_ci([t for _, t in reached.values()], 1, '.1f')} | {f or fmt_ci(ratio, 1, '.2f')} "
              f"| {f or fmt_ci(adjusted, 1, '.2f')} "
              f"| {fmt_ci(col['per_batch'], 1, '.3f')} |")
    lower = metric != "eval_accuracy"  # toxicity: lower is better
    print(f"\nEach method minus plain GRPO, paired by seed: mean [95 % t-interval] (Holm p) and the verdict: the "
          f"paired t-test, Holm over the methods of a column, ahead or behind only where the Holm p is below 0.05 "
          f"(ahead: a higher final reward, a {'lower' if lower else 'higher'} {metric_name})\n")
    print(f"| method | seeds | final reward | {metric_name} after the last batch |")
    print("|---|---|---|---|")
    columns = [verdicts.family({lb: [stats[lb][s][k] - stats["none"][s][k] for s in stats[lb]] for lb in labels[1:]
                                if len(stats[lb]) > 1}, "+.3f", flip) for k, flip in (("final", False), ("test", lower))]
    for lb in labels[1:]:
        cells = [f"{c['text']} ({verdicts.p_text(c['p_holm'])}) {c['verdict']}" if (c := fam.get(lb)) else "-"
                 for fam in columns]
        print(f"| {NAMES[lb]} | {len(stats[lb])} | {' | '.join(cells)} |")
    print("\nSeconds per generation batch, mean over batches and seeds (the machine's load changed while the "
          "runs ran one after another, so compare the columns within a row more than across rows); the scoring's "
          "(or filter's) cost against the update: per seed, its mean time per batch over the run's own update "
          "time, and over plain GRPO's update time of the same seed scaled by the two runs' generation and "
          "forward time (load-adjusted):\n")
    print("| method | generation | forward | influence or filter | update | total | scoring / own update "
          "| scoring / plain GRPO's update, load-adjusted |")
    print("|---|---|---|---|---|---|---|---|")
    for lb in labels:
        rows = [r for s in done[lb] for r in runs[lb][s]]
        t = [np.mean([r[k] for r in rows]) for k in TIMES]
        mean = {s: {k: np.mean([r[k] for r in runs[lb][s]]) for k in TIMES} for s in done[lb]}
        plain = {s: {k: np.mean([r[k] for r in runs["none"][s]]) for k in TIMES} for s in done[lb]}
        own = [m["t_influence"] / m["t_optim"] for m in mean.values()]
        vs_plain = [mean[s]["t_influence"] / (plain[s]["t_optim"] * stats[lb][s]["base"] / stats["none"][s]["base"])
                    for s in done[lb]]
        print(f"| {NAMES[lb]} | " + " | ".join(f"{x:.3f}" for x in t) + f" | {sum(t):.3f} | "
              f"{fmt_ci(own, 1, '.2f')} | {fmt_ci(vs_plain, 1, '.2f')} |")
    for lb in ("validation-target", "i-ppo"):
        if lb in labels:
            early_stop(runs, done, lb, metric, metric_name)
    return labels


def early_stop(runs, done, label, metric, metric_name):
    """I-PPO's "intrinsic early stop": the generation batches on which a method keeps no completion,
    against plain GRPO's peak (the batch where its trailing mean of the training reward is highest, and
    the evaluation where its test metric is best) of the same seed"""
    print(f"\nThe early stop of {NAMES[label]} (kept 0 of a generation batch), per seed; plain GRPO's peak: the "
          f"batch ending its best trailing mean of {W} training rewards, and its best {metric_name}:\n")
    print("| seed | batches kept 0 | first such batch | plain GRPO's reward peak | plain GRPO's best test | "
          "fewest kept | kept, first 10 batches | last 10 |")
    print("|---|---|---|---|---|---|---|---|")
    lower_is_better = metric == "eval_toxicity"
    for s in done[label]:
        rows, plain = runs[label][s], runs["none"][s]
        zero = [int(r["round"]) for r in rows if r["n_kept"] == 0]
        peak = int(np.argmax(smooth([r["reward_mean"] for r in plain], W))) + W - 1
        tests = [(r[metric], r["round"]) for r in plain if not np.isnan(r[metric])]
        best = int((min if lower_is_better else max)(tests)[1])
        kept = [r["n_kept"] / r["completions"] for r in rows]
        print(f"| {s} | {len(zero)} | {zero[0] if zero else '-'} | {peak} | {best} "
              f"| {min(r['n_kept'] for r in rows):.0f} of 64 | {np.mean(kept[:10]):.2f} | {np.mean(kept[-10:]):.2f} |")


def draw(axes, runs, labels, metric, metric_name, title):
    for lb in labels:
        seeds = list(runs[lb].values())
        n = min(len(rs) for rs in seeds)
        reward = np.array([smooth([r["reward_mean"] for r in rs[:n]], W) for rs in seeds])
        x = np.arange(W, n + 1)
        seconds = np.mean([np.cumsum([sum(r[k] for k in TIMES) for r in rs[:n]]) for rs in seeds], 0)[W - 1:]
        test = np.array([[r[metric] for r in rs[:n]] for rs in seeds])
        measured = ~np.isnan(test).any(0)
        style = dict(color=COLORS[lb], label=f"{NAMES[lb]} ({len(seeds)})")
        axes[0].plot(x, reward.mean(0), **style)
        axes[0].fill_between(x, reward.min(0), reward.max(0), color=COLORS[lb], alpha=0.12, linewidth=0)
        axes[1].plot(np.arange(1, n + 1)[measured], test[:, measured].mean(0), marker=".", **style)
        axes[2].plot(seconds, reward.mean(0), **style)
    axes[0].set(title=f"{title}\ntraining reward (trailing mean of {W})", xlabel="generation batch")
    axes[1].set(title=f"{metric_name}, after the batch", xlabel="generation batch")
    axes[2].set(title="training reward", xlabel="seconds (test evaluation left out)")
    axes[0].legend(fontsize=7)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=os.path.join(ROOT, "results", "runs"), help="folder of the run folders")
    ap.add_argument("--prefix", nargs="*", help="run name prefixes (default: the two toy tasks)")
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "figures", "grpo_filters.png"))
    a = ap.parse_args()
    runs_dir = a.runs
    tasks = TASKS
    if a.prefix:  # the test metric from the runs' --reward-fn
        def task(prefix):
            name = next(d for d in sorted(os.listdir(runs_dir)) if d.startswith(prefix + "__"))
            with open(os.path.join(runs_dir, name, "config.json")) as f:
                exact = json.load(f).get("reward_fn") == "exact-answer"
            return (prefix, prefix, *(("eval_accuracy", "test accuracy") if exact else
                                      ("eval_toxicity", "test toxicity")))
        tasks = [task(p) for p in a.prefix]
    present = [t for t in tasks if any(d.startswith(t[0] + "__") for d in os.listdir(runs_dir))]
    fig, axes = plt.subplots(len(present), 3, figsize=(14, 3.8 * len(present)), squeeze=False)
    for row, (prefix, title, metric, metric_name) in zip(axes, present):
        runs = load_runs(runs_dir, prefix)
        runs = {lb: {s: rs for s, rs in seeds.items() if len(rs) == planned(runs_dir, f"{prefix}__{lb}__{s}")}
                for lb, seeds in runs.items()}  # the finished runs
        runs = {lb: seeds for lb, seeds in runs.items() if seeds}
        labels = table(prefix, title, metric, metric_name, runs)
        draw(row, runs, labels, metric, metric_name, title)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    out = os.path.abspath(a.out)
    print(f"\nwrote {os.path.relpath(out, ROOT) if out.startswith(ROOT + os.sep) else out}")


if __name__ == "__main__":
    main()
