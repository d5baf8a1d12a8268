"""Cost and exactness of iif.py's influence for the paper's three kinds of network.

For each network (MLP: Acrobot-v1, shared CNN: MiniGrid-Empty-8x8-v0, Gaussian: BipedalWalker-v3)
a short standard-PPO run of iif.py (--filter-method none --save-rounds) times rollout, influence and
optimisation side by side every round. On its saved buffers (theta_k and B(k), 2048 records) this
script then times one forward+backward pass of the whole buffer, the batched influence and a
per-record autograd loop, and measures the batched influence against the loop in float64.
Medians over rounds and repeats; ratios, not seconds, are the result.

    python benchmarks/influence_cost.py [--rounds 5]
"""
import argparse
import copy
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

NETWORKS = [("MLP", "Acrobot-v1"), ("CNN (shared)", "MiniGrid-Empty-8x8-v0"), ("Gaussian", "BipedalWalker-v3")]


def timed(fn, repeats=7):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def per_record_loop(agent, b, target, args, adv):
    """The naive reference: one autograd backward per record, of the loss iif.py scores with (its policy terms)
    at the advantages it scores with."""
    params = dict(agent.named_parameters())
    g = torch.autograd.grad(iif.f_return(agent, params, *target), list(params.values()), allow_unused=True)
    g = torch.cat([(torch.zeros_like(p) if x is None else x).flatten() for p, x in zip(params.values(), g)])
    out = []
    for i in range(len(b["advantages"])):
        i = torch.tensor([i])
        gi = torch.autograd.grad(iif.ppo_losses(agent, b, i, args, params, adv[i], 0.0).sum(),
                                 list(params.values()), allow_unused=True)
        gi = torch.cat([(torch.zeros_like(p) if x is None else x).flatten() for p, x in zip(params.values(), gi)])
        out.append(-(g @ gi))
    return torch.stack(out)


def bench(name, env_id, rounds, runs_dir):
    args = iif.resolve_args(tyro.cli(iif.Args, args=[
        "--env-id", env_id, "--filter-method", "none", "--save-rounds", "--total-timesteps", str(2048 * rounds),
        "--eval-episodes", "1", "--runs-dir", runs_dir, "--run-name", env_id]))
    iif.main(args)
    with open(os.path.join(runs_dir, env_id, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))[1:]  # round 0 pays one-off warm-up costs
    med = {key: statistics.median(float(r[key]) for r in rows) for key in ("t_rollout", "t_influence", "t_optim")}

    env = iif.make_env(env_id)()
    agent = iif.Agent(env.observation_space, env.action_space)
    fwd_bwd, infl, loop, errors = [], [], [], []
    for k in range(rounds):
        b = torch.load(os.path.join(runs_dir, env_id, "rounds", f"round_{k:04d}.pt"))
        agent.load_state_dict(b["state_dict"])
        idx = torch.arange(len(b["advantages"]))
        target = (b["obs"], b["actions"], b["advantages"])

        def forward_backward():
            agent.zero_grad()
            iif.ppo_losses(agent, b, idx, args).mean().backward()

        fwd_bwd.append(timed(forward_backward))
        adv = iif.normalize(b["advantages"])  # as iif.py's Stage II scores
        infl.append(timed(lambda: iif.influence(agent, b, args)))
        if k == rounds - 1:
            t0 = time.perf_counter()
            per_record_loop(agent, b, target, args, adv)
            loop.append(time.perf_counter() - t0)
            agent64 = copy.deepcopy(agent).double()
            b64 = {key: v.double() if torch.is_tensor(v) and v.is_floating_point() else v for key, v in b.items()}
            target64 = (b64["obs"], b64["actions"], b64["advantages"])
            ref = per_record_loop(agent64, b64, target64, args, iif.normalize(b64["advantages"]))
            ours = iif.influence(agent64, b64, args)
            errors.append(((ours - ref).abs().max() / ref.abs().max()).item())
    f_b, inf = statistics.median(fwd_bwd), statistics.median(infl)
    return dict(network=name, env=env_id, records=len(idx),
                round_s=med["t_rollout"] + med["t_optim"], optim_s=med["t_optim"], infl_run_s=med["t_influence"],
                infl_of_round=med["t_influence"] / (med["t_rollout"] + med["t_optim"]),
                infl_of_optim=med["t_influence"] / med["t_optim"], infl_over_fwd_bwd=inf / f_b,
                loop_over_optim=loop[0] / med["t_optim"], loop_over_infl=loop[0] / inf, rel_error=max(errors))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of 2048 records per network")
    cli = parser.parse_args()
    torch.set_num_threads(1)
    torch.distributions.Distribution.set_default_validate_args(False)
    with tempfile.TemporaryDirectory() as runs_dir:
        results = [bench(name, env_id, cli.rounds, runs_dir) for name, env_id in NETWORKS]
    print("\n| network | env | influence / PPO round | influence / optimisation | influence / one fwd+bwd of the "
          "buffer | per-record loop / optimisation | per-record loop / influence | max rel. error vs loop (float64) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['network']} | {r['env']} | {100 * r['infl_of_round']:.2f} % | {100 * r['infl_of_optim']:.2f} % | "
              f"{r['infl_over_fwd_bwd']:.2f} x | {r['loop_over_optim']:.2f} x | {r['loop_over_infl']:.0f} x | "
              f"{r['rel_error']:.1e} |")
    print("\nPPO round = rollout + optimisation of standard PPO (evaluation excluded); medians over rounds 1.., "
          f"{cli.rounds} rounds of 2048 records; torch threads: 1; iif.py's scoring (policy terms of l_i, "
          "advantages normalised over the buffer).")
