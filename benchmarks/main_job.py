"""The README's main job against Stable-Baselines3 PPO training on the same 102,400 Acrobot steps.

ours: `python iif.py --env-id Acrobot-v1`, exactly as the README writes it: IIF, 50 rounds of 2048
steps on gymnasium's Acrobot-v1, 1000 test episodes of the stochastic policy after every round (batched on
envpool's port where it is installed, as iif.py chooses by default). sb3: SB3's PPO with the same hyperparameters (the Acrobot
preset: SGD 5e-3, n_steps 2048, minibatch 64, 10 epochs), training only, no evaluation. Each side is a
whole fresh process timed by the wall clock, imports included; both use one torch thread. The sides
alternate and the ratio is the median over the pairs.

    pip install stable-baselines3   # for this benchmark only
    python benchmarks/main_job.py [--repeats 3] > results/figures/main_job.md   # progress goes to stderr
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SB3 = """
import torch
torch.set_num_threads(1)
from stable_baselines3 import PPO
model = PPO("MlpPolicy", "Acrobot-v1", n_steps=2048, batch_size=64, n_epochs=10, learning_rate=5e-3, gamma=0.99,
            gae_lambda=0.95, clip_range=0.2, ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5, device="cpu", seed=1,
            policy_kwargs=dict(optimizer_class=torch.optim.SGD, net_arch=dict(pi=[64, 64], vf=[64, 64])))
model.learn(102_400)
"""


def timed(cmd, cwd):
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{' '.join(cmd[:3])} failed:\n{proc.stderr[-2000:]}")
    return time.perf_counter() - t0, proc.stdout


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="pairs of runs")
    cli = parser.parse_args()
    ours, sb3, rows = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(cli.repeats):
            t, out = timed([sys.executable, os.path.join(ROOT, "iif.py"), "--env-id", "Acrobot-v1",
                            "--run-name", f"main_job_{rep}"], tmp)
            ours.append(t)
            lines = out.splitlines()
            if rep == 0:  # the printout of the first run: its header, first and last rounds
                shown = [lines[0], lines[1], lines[-1]]
            sb3.append(timed([sys.executable, "-c", SB3], tmp)[0])
            rows.append(f"| {rep + 1} | {ours[-1]:.0f} | {sb3[-1]:.0f} | {ours[-1] / sb3[-1]:.2f} |")
            print(rows[-1], file=sys.stderr, flush=True)  # progress; the table below is the printout
    print("\n".join(shown) + "\n")
    print("| pair | iif.py main job (s) | SB3 PPO training (s) | ratio |")
    print("|---|---|---|---|")
    print("\n".join(rows))
    ratios = [a / b for a, b in zip(ours, sb3)]
    print(f"\nmedian: iif.py {statistics.median(ours):.0f} s, SB3 {statistics.median(sb3):.0f} s, "
          f"ratio {statistics.median(ratios):.2f} (over {cli.repeats} alternating pairs, whole processes)")
