"""The one-round test of "IIF's records do worse than random ones at an equal step" (docs/results.md, "One round at
an equal step"). A 150-round curve compounds every round's difference, and with the critic, mid-training states and
the test protocol; this reads one update at a time. From the states the held-critic runs keep (results/held_step.py,
--save-states: theta(k), the optimizer and the generators at the start of every N-th round), it collects one buffer
B(k) at theta(k) and runs one round each of held IIF and held random dropping from theta(k) on that B(k), both held
to standard PPO's KL from theta(k) (iif_variants.held_update), the critic on every record. Each update is read on data
it did not see:
    gain  the first-order surrogate gain of theta(k+1) over theta(k) on a fresh buffer collected at theta(k),
          mean((pi_theta(k+1)(a|s) / pi_theta(k)(a|s) - 1) A_hat) / std(A_hat), A_hat its GAE at theta(k);
          2 fresh buffers a state, their mean
    test  the test return of theta(k+1) minus theta(k)'s on the preset's test episodes (the same episodes and
          action noise for all three)

    python results/one_round.py runs        # every state of every held-critic run -> <run>/one_round.csv
    python results/one_round.py table > results/held-step/one_round.md

A state already in its run's one_round.csv is skipped; --envs and --seeds narrow the stage.
"""
import argparse
import copy
import csv
import dataclasses
import glob
import json
import os
import sys

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "research"))
sys.path.insert(0, os.path.join(ROOT, "results"))
import iif_variants as variants  # noqa: E402
import verdicts  # noqa: E402
from held_step import ENVS  # noqa: E402

RUNS = os.path.join(ROOT, "results", "held-step", "runs")
ARM = "held-critic"  # the trajectories the states come from: held IIF with the critic on every record
COLUMNS = ["round", "kl_ref", "n_dropped", "kl_iif", "kl_random", "lr_scale_iif", "lr_scale_random",
           "gain_iif", "gain_random", "test_k", "test_iif", "test_random"]
STAGES = ("early", "middle", "late")


def load_args(run_dir):
    with open(os.path.join(run_dir, "config.json")) as f:
        saved = {**variants.ADDED_FLAGS, **json.load(f)}
    names = {f.name for f in dataclasses.fields(variants.Args)}
    args = variants.Args(**{k: v for k, v in saved.items() if k in names})
    args.backends = tuple(saved.get("backends") or (saved["env_backend"],) * 2)  # runs made before backends: one
    return args


def surrogate_gain(agent, fresh):
    """mean((pi_new / pi_theta(k) - 1) A_hat) / std(A_hat) on a buffer collected at theta(k)"""
    with torch.no_grad():
        logp = agent(fresh["obs"], fresh["actions"], critic=False)[0]
    a = fresh["advantages"]
    return float(((logp - fresh["logprobs"]).exp() - 1).mul(a).mean() / a.std())


def one_state(args, path, envs, eval_envs):
    """One state's row: B(k) at theta(k), held IIF's and held random's round from it, both read on fresh data"""
    state = torch.load(path, weights_only=False)
    k = state["round"] + 1
    agent = variants.Agent(envs.single_observation_space, envs.single_action_space)
    optimizer = variants.held_optimizer(agent, args)
    agent.load_state_dict(state["agent"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    rng, gen = np.random.default_rng(), torch.Generator()
    rng.bit_generator.state = state["numpy_rng"]
    gen.set_state(state["filter_rng"])
    ep = np.zeros((2, args.num_envs))
    obs, _ = envs.reset(seed=args.seed + 100_000 * k)  # new episodes, as a resumed run starts
    b = variants.collect_rollout(agent, envs, obs, ep, args)[0]
    every = torch.arange(args.batch_size)
    scores = variants.influence(agent, b, every, variants.make_target(agent, b, args), args,
                                variants.scoring_advantages(b, args))
    kept = {m: variants.filter_records(scores, m, args.filter_p, gen, args.filter_ties)[0]
            for m in ("influence", "random")}  # as many dropped at random as influence drops
    start = [copy.deepcopy(x.state_dict()) for x in (agent, optimizer)] + [copy.deepcopy(rng.bit_generator.state)]
    row, theta = dict(round=k, n_dropped=int((~kept["influence"]).sum())), {}
    for m, name in (("influence", "iif"), ("random", "random")):  # each from theta(k)'s own state
        agent.load_state_dict(start[0])
        optimizer.load_state_dict(copy.deepcopy(start[1]))
        rng.bit_generator.state = copy.deepcopy(start[2])
        _, held = variants.held_update(agent, optimizer, b, kept[m], every >= 0, args, rng, state["hold_scale"])
        row.update({"kl_ref": held["kl_ref"], f"kl_{name}": variants.approx_kl(agent, b),
                    f"lr_scale_{name}": held["lr_scale"]})
        theta[name] = copy.deepcopy(agent.state_dict())
    theta["k"] = start[0]
    gains = {name: [] for name in ("iif", "random")}
    for i in range(2):  # fresh buffers at theta(k): other episodes, other action noise
        agent.load_state_dict(theta["k"])
        torch.manual_seed(args.seed * 1_000_003 + 10 * k + i)
        obs, _ = envs.reset(seed=args.seed + 100_000 * k + 50_000 + i)
        fresh = variants.collect_rollout(agent, envs, obs, np.zeros((2, args.num_envs)), args)[0]
        for name in gains:
            agent.load_state_dict(theta[name])
            gains[name].append(surrogate_gain(agent, fresh))
    for name in ("k", "iif", "random"):  # one set of test episodes and action noise for the three
        agent.load_state_dict(theta[name])
        torch.manual_seed(args.seed * 1_000_003 + 10 * k + 7)
        row[f"test_{name}"] = variants.evaluate(agent, eval_envs, args.eval_episodes, args.seed + 10_000)[0]
    row.update(gain_iif=float(np.mean(gains["iif"])), gain_random=float(np.mean(gains["random"])))
    return row


def stage_runs(envs, seeds):
    torch.set_num_threads(1)
    for env_id in envs:
        for seed in seeds:
            run_dir = os.path.join(RUNS, f"{env_id}__{ARM}__{seed}")
            states = sorted(glob.glob(os.path.join(run_dir, "states", "round_*.pt")))
            if not os.path.exists(os.path.join(run_dir, "agent.pt")) or not states:
                continue  # unfinished: its later states are still to come
            out = os.path.join(run_dir, "one_round.csv")
            done = set()
            if os.path.exists(out):
                with open(out) as f:
                    done = {int(r["round"]) for r in csv.DictReader(f)}
            args = load_args(run_dir)
            envs_ = variants.make_vec(args, 1, args.backends[0])
            eval_envs = variants.make_vec(args, min(args.eval_envs, args.eval_episodes), args.backends[1])
            for path in states:
                k = int(os.path.basename(path)[6:10])
                if k in done:
                    continue
                row = one_state(args, path, envs_, eval_envs)
                new = not os.path.exists(out)
                with open(out, "a", newline="") as f:
                    w = csv.DictWriter(f, fieldnames=COLUMNS)
                    if new:
                        w.writeheader()
                    w.writerow(row)
                print(f"{env_id} seed {seed} round {k}: gain IIF {row['gain_iif']:+.4f} random "
                      f"{row['gain_random']:+.4f}; test {row['test_k']:.2f} -> IIF {row['test_iif']:.2f}, random "
                      f"{row['test_random']:.2f}", file=sys.stderr, flush=True)
            envs_.close()
            eval_envs.close()


def stage_of(k, n):
    return STAGES[min(2, 3 * k // n)]


def per_seed(env_id):
    """{stage or "all": {outcome: [per-seed mean of IIF - random over that seed's states]}}"""
    n = ENVS[env_id][1]
    out = {s: dict(gain=[], test=[]) for s in (*STAGES, "all")}
    for path in sorted(glob.glob(os.path.join(RUNS, f"{env_id}__{ARM}__*", "one_round.csv"))):
        with open(path) as f:
            rows = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]
        for s in out:
            mine = [r for r in rows if s == "all" or stage_of(int(r["round"]), n) == s]
            if mine:
                out[s]["gain"].append(np.mean([r["gain_iif"] - r["gain_random"] for r in mine]))
                out[s]["test"].append(np.mean([r["test_iif"] - r["test_random"] for r in mine]))
    return out


def n_states(env_id):
    return sum(sum(1 for _ in open(p)) - 1 for p in glob.glob(os.path.join(RUNS, f"{env_id}__{ARM}__*", "one_round.csv")))


def stage_table(envs):
    data = {e: per_seed(e) for e in envs}
    print("One round at an equal step (results/one_round.py): from states along held IIF's runs with the critic on "
          "every record (results/held_step.py's held-critic arm, a state at the start of every N-th round), one round "
          "each of held IIF and held random dropping from theta(k) on the same B(k), held to standard PPO's KL. Each "
          "cell: IIF - random, the mean over seeds of each seed's mean over its states in that stage (early, middle, "
          "late: the thirds of the compared rounds) [95 % t-interval over seeds], the Holm-adjusted p over the "
          "environments of the column, and the verdict (ahead or behind where that p < 0.05). gain: the first-order "
          "surrogate gain on 2 fresh buffers at theta(k), in units of their A_hat's std; test: the test return of "
          "theta(k+1) on the preset's test episodes.\n")
    for outcome, fmt in (("gain", ".2g"), ("test", ".3g")):
        print(f"\n{outcome}, IIF - random\n")
        print("| env | states | " + " | ".join((*STAGES, "all")) + " |")
        print("|---|---|" + "---|" * 4)
        columns = {s: verdicts.family({e: data[e][s][outcome] for e in envs if len(data[e][s][outcome])}, fmt)
                   for s in (*STAGES, "all")}
        for e in envs:
            states = n_states(e)
            cells = []
            for s in (*STAGES, "all"):
                c = columns[s].get(e)
                cells.append("-" if c is None else f"{c['text']} ({c['n']}) p_Holm {verdicts.p_text(c['p_holm'])} "
                             f"{c['verdict'].replace(' over ' + str(c['n']) + ' seeds', '')}")
            print(f"| {e} | {states} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("stage", choices=["runs", "table"])
    parser.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3, 4, 5])
    a = parser.parse_args()
    stage_runs(a.envs, a.seeds) if a.stage == "runs" else stage_table(a.envs)
