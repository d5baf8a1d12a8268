"""Do gymnasium and envpool give the same test return? The final policy of a committed run (from its
checkpoint.pt, or agent.pt for older runs), tested on both backends with the same protocol
(stochastic policy, undiscounted return, the same number of episodes), mean ± standard error.

Then standard PPO and IIF trained on each backend (the runs of results/backends.sh).

    python benchmarks/backend_agreement.py [--runs results/runs] [--seed 50000] [--training-only]
"""
import argparse
import glob
import os
import sys
from collections import defaultdict

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import analysis  # noqa: E402
import iif  # noqa: E402

# (env, run whose final policy is tested, test episodes); each was trained on the backend its config.json names
CASES = [("Acrobot-v1", "Acrobot-v1__none__1", 1000), ("MiniGrid-Empty-8x8-v0", "MiniGrid-Empty-8x8-v0__none__1", 1000),
         ("LunarLander-v3", "../coarse/LunarLander-v3__none__1", 1000),  # the 3-seed runs tested coarsely
         ("BipedalWalker-v3", "../coarse/BipedalWalker-v3__none__1", 200),
         ("highway-v0", "../highway-noclip/highway-v0__none__1", 200)]  # trained before the preset clipped


def test_return(env_id, backend, agent, episodes, seed):
    args = argparse.Namespace(env_id=env_id, env_backend=backend)
    envs = iif.make_vec(args, episodes if backend == "envpool" else 16, backend)
    torch.manual_seed(seed)
    mean, std = iif.evaluate(agent, envs, episodes, seed)
    envs.close()
    return mean, std / np.sqrt(episodes)


def training_table(runs_dir):
    """PPO trained on each backend (results/backends.sh): per env, on the rounds every run has and tests,
    the test return after the last of them (mean ± std over seeds), its mean over them, and the first
    of them at which each seed reaches a level."""
    levels = {"Acrobot-v1": -150, "highway-v0": 25}
    curves = defaultdict(list)  # (env, label) -> one curve per seed
    for path in sorted(glob.glob(os.path.join(runs_dir, "*__*-*__*", "metrics.csv"))):
        env_id, label, _ = os.path.basename(os.path.dirname(path)).rsplit("__", 2)
        curves[env_id, label].append([r["test_return_mean"] for r in analysis.read_metrics(path)])
    print("\n| env | method | trained on | seeds | tested rounds | final test return | mean over tested rounds "
          "| rounds to reach |")
    print("|---|---|---|---|---|---|---|---|")
    for env_id in sorted({e for e, _ in curves}):
        n = min(len(c) for (e, _), cs in curves.items() if e == env_id for c in cs)
        rounds = np.arange(1, n + 1)
        tested = np.all([~np.isnan(c[:n]) for (e, _), cs in curves.items() if e == env_id for c in cs], axis=0)
        if not tested.any():
            continue
        for (e, label), cs in sorted(curves.items()):
            if e != env_id:
                continue
            c = np.array([x[:n] for x in cs])[:, tested]
            first = [next((str(k) for k, v in zip(rounds[tested], x) if v >= levels[env_id]), "-") for x in c]
            method, backend = label.split("-")
            print(f"| {env_id} | {method} | {backend} | {len(c)} | {tested.sum()} of {n} | {c[:, -1].mean():.1f} ± "
                  f"{c[:, -1].std():.1f} | {c.mean():.1f} | {levels[env_id]}: {', '.join(first)} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", default="results/runs")
    parser.add_argument("--seed", type=int, default=50_000, help="first seed of the test episodes")
    parser.add_argument("--env", nargs="*", help="only these envs")
    parser.add_argument("--backends", default="results/backends", help="the runs of results/backends.sh")
    parser.add_argument("--training-only", action="store_true", help="print only the table of training runs")
    cli = parser.parse_args()
    if cli.training_only:
        training_table(cli.backends)
        sys.exit()
    torch.set_num_threads(1)
    torch.distributions.Distribution.set_default_validate_args(False)
    print("| env | policy (trained on) | episodes | gymnasium | envpool | difference / SE |")
    print("|---|---|---|---|---|---|")
    for env_id, run, episodes in CASES:
        if cli.env and env_id not in cli.env:
            continue
        config = analysis.load_config(os.path.join(cli.runs, run))
        path = os.path.join(cli.runs, run, "checkpoint.pt")  # its agent is the final one
        if os.path.exists(path):
            agent = analysis.agent_for(config, torch.load(path)["agent"])
        else:  # runs made before checkpoints existed: agent.pt, made again by their reproduce command
            agent = analysis.agent_for(config, torch.load(os.path.join(cli.runs, run, "agent.pt")))
        g = test_return(env_id, "gymnasium", agent, episodes, cli.seed)
        e = test_return(env_id, "envpool", agent, episodes, cli.seed)
        z = (e[0] - g[0]) / np.hypot(g[1], e[1])
        print(f"| {env_id} | {run} ({config['env_backend']}) | {episodes} | {g[0]:.3f} ± {g[1]:.3f} | "
              f"{e[0]:.3f} ± {e[1]:.3f} | {z:+.1f} |", flush=True)
    training_table(cli.backends)
