"""Where each stage of iif.py runs fastest, per preset: the backends `--env-backend auto` takes (PRESETS' auto).

Stage I steps one environment 2048 times, the agent's act between steps; the test runs the preset's test episodes,
many environments at once. Per preset and backend, with an untrained agent on one torch thread:
- Stage I: microseconds per step of iif.collect_rollout (the agent's act, the env's step, the buffer's bookkeeping;
  GAE included), the median of 3 rollouts (highway-env: of 128 steps, it is that slow);
- the test: seconds for the preset's test episodes with iif.evaluate (envpool: one env an episode; gymnasium: 16
  envs, timed on 32 episodes and scaled to the preset's count).

    python benchmarks/backend_speed.py > results/benchmarks/backend_speed.md
"""
import os
import statistics
import sys
import time

import numpy as np
import torch
import tyro

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import iif  # noqa: E402


def rollout_us(args, backend, steps):
    args.num_steps = steps
    envs = iif.make_vec(args, 1, backend)
    agent = iif.Agent(envs.single_observation_space, envs.single_action_space)
    obs, _ = envs.reset(seed=1)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        _, obs, _ = iif.collect_rollout(agent, envs, obs, np.zeros((2, 1)), args)
        times.append((time.perf_counter() - t0) / steps * 1e6)
    envs.close()
    return statistics.median(times)


def test_seconds(args, backend):
    n = args.eval_episodes if backend == "envpool" else min(32, args.eval_episodes)
    envs = iif.make_vec(args, n if backend == "envpool" else 16, backend)
    agent = iif.Agent(envs.single_observation_space, envs.single_action_space)
    t0 = time.perf_counter()
    iif.evaluate(agent, envs, n, 10_000)
    envs.close()
    return (time.perf_counter() - t0) * args.eval_episodes / n


if __name__ == "__main__":
    torch.set_num_threads(1)
    torch.manual_seed(0)
    torch.distributions.Distribution.set_default_validate_args(False)  # as iif.py runs
    print("| preset | Stage I, us a step: gymnasium | envpool | test episodes | the test, s: gymnasium | envpool | "
          "auto (Stage I, test) |")
    print("|---|---|---|---|---|---|---|")
    for env_id, preset in iif.PRESETS.items():
        args = iif.resolve_args(tyro.cli(iif.Args, args=["--env-id", env_id]))
        backends = ("gymnasium", "envpool") if "envpool" in preset else ("gymnasium",)
        step = {b: rollout_us(args, b, 128 if env_id == "highway-v0" and b == "gymnasium" else 2048) for b in backends}
        test = {b: test_seconds(args, b) for b in backends}
        cells = [f"{step[b]:.0f}" if b in step else "(no port)" for b in ("gymnasium", "envpool")]
        tests = [f"{test[b]:.2f}" if b in test else "(no port)" for b in ("gymnasium", "envpool")]
        print(f"| {env_id} | {cells[0]} | {cells[1]} | {args.eval_episodes} | {tests[0]} | {tests[1]} | "
              f"{', '.join(args.backends)} |", flush=True)
