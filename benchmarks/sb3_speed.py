"""Training speed of iif.py's standard PPO against Stable-Baselines3's PPO, side by side.

Identical hyperparameters (the paper's: n_steps 2048, minibatch 64, 10 epochs, gamma 0.99, lambda 0.95,
clip 0.2, ent_coef 0, vf_coef 0.5, max_grad_norm 0.5, separate 64-64 tanh networks, SGD 5e-3 or Adam
3e-4 by preset), one environment, one torch thread, no evaluation. Runs alternate in one process;
each side's time is rollout + optimisation (+ iif.py's influence, which standard PPO computes too
for its n_negative column); steps/s are medians over repeats.

    pip install stable-baselines3   # for this benchmark only
    python benchmarks/sb3_speed.py [--rounds 4 --repeats 3]
"""
import argparse
import csv
import os
import statistics
import sys
import tempfile
import time

import torch
import tyro

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import iif  # noqa: E402

ENVS = ["Acrobot-v1", "LunarLander-v3", "BipedalWalker-v3"]


def ours(env_id, rounds, runs_dir, tag):
    args = iif.resolve_args(tyro.cli(iif.Args, args=[
        "--env-id", env_id, "--filter-method", "none", "--total-timesteps", str(2048 * rounds),
        "--eval-episodes", "1", "--env-backend", "gymnasium", "--runs-dir", runs_dir, "--run-name", tag]))
    iif.main(args)
    with open(os.path.join(runs_dir, tag, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    return 2048 * rounds / sum(float(r["t_rollout"]) + float(r["t_influence"]) + float(r["t_optim"]) for r in rows)


def sb3(env_id, rounds):
    from stable_baselines3 import PPO
    preset = iif.PRESETS[env_id]
    optimizer = torch.optim.SGD if preset["optimizer"] == "sgd" else torch.optim.Adam
    model = PPO("MlpPolicy", env_id, n_steps=2048, batch_size=64, n_epochs=10, learning_rate=preset["learning_rate"],
                gamma=0.99, gae_lambda=0.95, clip_range=0.2, ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5,
                policy_kwargs=dict(optimizer_class=optimizer, net_arch=dict(pi=[64, 64], vf=[64, 64])),
                device="cpu", seed=1)
    t0 = time.perf_counter()
    model.learn(2048 * rounds)
    return 2048 * rounds / (time.perf_counter() - t0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4, help="rounds of 2048 steps per run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per side and env")
    cli = parser.parse_args()
    torch.set_num_threads(1)
    torch.distributions.Distribution.set_default_validate_args(False)
    results = {}
    with tempfile.TemporaryDirectory() as runs_dir:
        ours("CartPole-v1", 1, runs_dir, "warmup")  # one-off import and first-call costs
        sb3(ENVS[0], 1)
        for env_id in ENVS:
            a, s = [], []
            for rep in range(cli.repeats):
                a.append(ours(env_id, cli.rounds, runs_dir, f"{env_id}_{rep}"))
                s.append(sb3(env_id, cli.rounds))
            results[env_id] = (statistics.median(a), statistics.median(s))
    print("\n| env | iif.py steps/s | SB3 steps/s | iif.py / SB3 |")
    print("|---|---|---|---|")
    for env_id, (a, s) in results.items():
        print(f"| {env_id} | {a:.0f} | {s:.0f} | {a / s:.2f} x |")
    print(f"\nmedians of {cli.repeats} alternating runs of {cli.rounds} rounds x 2048 steps; torch threads: 1; "
          "evaluation excluded.")
