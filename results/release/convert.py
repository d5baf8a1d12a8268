"""Turns the logs of run_release.sh (the authors' released code run with its own scripts) into
<out>/<env-id>__<none|influence>__<seed>/metrics.csv and config.json, as analysis.py reads them:

    python results/release/convert.py [--work /work/release-work] [--out results/release]
    python analysis.py efficiency --runs results/release --env MiniGrid-Empty-8x8-v0

Row k is round k: the test of the policy after k + 1 rounds of updates, the released code's
checkpoint policy_grad_{320 (k + 1)}; its checkpoint 0 (the initial policy) is config.json's
initial_test_return. An empty cell is a value the release does not print (n_negative).

Times (seconds, from timed.py) are taken inside the processes, without their start-up: t_rollout
the rollout (IIF: in the process that also runs the update it throws away, t_update_discarded);
t_influence the influence process after loading its policy; t_optim the PPO update (standard:
PPO.train; IIF: the update on the kept records, after loading its policy); t_select the whole
process that writes the kept records' minibatch files; t_eval the test after loading its policy.
t_wall is the round's wall time over all its processes, start-up included (standard: the training
process's wall time shared evenly over its rounds, plus the test)."""
import argparse
import csv
import glob
import json
import os
import re
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
ENVS = {  # the release's folder: env id, standard's result file, rounds, recipe, scripts
    "minigrid": (
        "MiniGrid-Empty-8x8-v0", "result_minigrid_88_sgd_lr-5e-3_feat-64_step-80k", 20,
        "CNN extractor (conv 16, conv 32, linear 64) with 64-64 heads, SGD 5e-3; standard PPO "
        "trains 81,920 steps (40 rounds), checkpoints 0-20 tested; IIF runs 20 rounds",
        ["run_train_minigrid_sgd.sh SEED", "run_eval_baseline.sh SEED CPUS"],
        ["run_iif_minigrid.sh SEED 12.5 CPUS"]),
    "lunarlander": (
        "LunarLander-v2", "result_lunarlander_adam_lr-1e-3_step-310k", 100,
        "64-64 MLPs, Adam 1e-3 (the release's headline LunarLander scripts); standard PPO trains "
        "307,200 steps (150 rounds), checkpoints 0-100 tested; IIF runs 100 rounds",
        ["run_lunarlander_adam_training.sh SEED", "run_lunarlander_adam_test.sh SEED 0 100"],
        ["run_iif_lunarlander_adam.sh SEED 12.5 CPUS"]),
}
TEST_SCRIPT = {"minigrid": "run_test_minigrid_policy_act7.sh", "lunarlander": "run_test_lunarlander_policy.sh"}
COMMON = ("PPO in the release's patched stable-baselines3 (gymnasium 0.29.1): 2048 steps a round, "
          "1 env, minibatch 64, 10 epochs. IIF (p = 12.5 %) starts from the standard run's "
          "initial policy and runs each round as a chain of processes from the previous round's "
          "checkpoint, the env reseeded with the seed every round.")
CHANGES = [
    "WANDB_MODE=disabled (wandb.init would ask for a login)",
    "PYTHONPATH=<release>/traditional-rl (the patched stable-baselines3 is a bare folder)",
    "mkdir results_minigrid, results_lunarlander (never created)",
    "tests on test_episodes episodes instead of 1000 (--num_episodes)",
    "LunarLander: a checkpoint every 320 updates (once a round, as the MiniGrid scripts save), "
    "not after every update (disk); only those are read",
    "run_iif_*.sh and run_eval_baseline.sh take the rounds to run from the environment "
    "(resuming; defaults as written)",
    "CPUS, the taskset list their scripts take: 0-1, with one thread (OMP_NUM_THREADS=1)",
]
COLUMNS = ["round", "global_step", "test_return_mean", "test_return_std", "n_records", "n_kept",
           "n_dropped", "n_negative", "n_updates", "t_rollout", "t_update_discarded",
           "t_influence", "t_select", "t_optim", "t_eval", "t_wall"]


def tests(path):
    """[(checkpoint step, mean, std, episodes)] of the tests a result file holds, in order"""
    out, step, episodes = [], None, None
    with open(path) as f:
        for line in f:
            m = re.match(r"(loaded model with initial policy|Loaded policy from:) "
                         r".*policy_grad_(\d+)\.zip", line)
            if m:
                step = int(m[2])
            elif re.match(r"Generated \d+ fixed initial states", line):  # MiniGrid
                episodes = int(line.split()[1])
            elif line.startswith("Average return"):
                m = re.search(r"over (\d+) episodes", line)  # LunarLander
                mean = float(line.rsplit(":", 1)[1])
                out.append([step, mean, None, int(m[1]) if m else episodes])
            elif re.match(r"Std return|Return standard deviation", line):
                out[-1][2] = float(line.rsplit(":", 1)[1])
    return out


def last(text, pattern):
    found = re.findall(pattern, text)
    return int(found[-1]) if found else None


def timing(path):
    """{script: [records]} of a timing log, in order"""
    by_script = defaultdict(list)
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                rec = json.loads(line)
                by_script[rec["script"]].append(rec)
    return by_script


def round_of(args):
    """The IIF round a process of the released code belongs to, from its arguments"""
    m = re.search(r"--(rollout_begin_idx|k) (\d+)", args)
    if m:
        return int(m[2])
    m = re.search(r"--(begin_step|batch_begin_idx) (\d+)", args)
    if m:
        return int(m[2]) // 320
    return int(re.search(r"policy_grad_(\d+)\.zip", args)[1]) // 320 - 1  # tests: k + 1


def standard_rows(paths, times):
    found = [t for path in paths if os.path.exists(path) for t in tests(path)]
    train = [r for s, recs in times.items() if s.endswith("_with_callbacks.py") for r in recs]
    train = train[-1] if train else {"train": [], "collect_rollouts": []}
    per_round = train["wall"] / len(train["train"]) if train["train"] else None
    evals = {int(re.search(r"policy_grad_(\d+)", r["args"])[1]): r
             for s, recs in times.items() if s.startswith("test_") for r in recs}
    rows, initial = [], None
    for step, mean, std, episodes in found:
        k = step // 320 - 1
        if k < 0:
            initial = mean
            continue
        ev = evals.get(step, {})
        rows.append(dict(
            round=k, test_return_mean=mean, test_return_std=std, n_records=2048, n_kept=2048,
            n_dropped=0, n_updates=320, t_influence=0.0,
            t_rollout=(train["collect_rollouts"][k:] or [None])[0],
            t_optim=(train["train"][k:] or [None])[0], t_eval=ev.get("after_load"),
            t_wall=per_round + ev["wall"] if per_round and ev else None, episodes=episodes))
    return rows, initial


def iif_rows(results, seed, times):
    by_round = defaultdict(dict)  # the last run of each process of each round
    for script, recs in times.items():
        for r in recs:
            by_round[round_of(r["args"])][script] = r
    rows = []
    for k in range(10_000):
        pattern = rf"_rol-0-{k}-{k + 1}_neg-bottom-12\.5_.*_seed-{seed}\.txt$"
        paths = [os.path.join(results, p) for p in os.listdir(results) if re.search(pattern, p)]
        found = tests(paths[0]) if paths else []
        if not found:
            break  # the round has not finished
        with open(paths[0]) as f:
            text = f.read()
        n_records = last(text, r"rollout sample size = (\d+)")
        n_kept = last(text, r"len remaining records (\d+)")
        t_none = last(text, r"encounter\w* None batch at t=(\d+)")  # the kept minibatches end
        procs = by_round.get(k, {})

        def proc(part):  # the round's process whose script name holds part
            return next((r for s, r in procs.items() if part in s), {})
        rollout = proc("given_states")
        rows.append(dict(
            round=k, test_return_mean=found[-1][1], test_return_std=found[-1][2],
            n_records=n_records, n_kept=n_kept,
            n_dropped=n_records - n_kept if None not in (n_records, n_kept) else None,
            n_updates=t_none - 320 * k if t_none is not None else 320,
            t_rollout=(rollout.get("collect_rollouts") or [None])[0],
            t_update_discarded=(rollout.get("train") or [None])[0],
            t_influence=proc("compute_TracIn").get("after_load"),
            t_select=proc("produce_").get("wall"), t_optim=proc("given_batches").get("after_load"),
            t_eval=proc("_return.py").get("after_load"),
            t_wall=sum(r["wall"] for r in procs.values()) if procs else None,
            episodes=found[-1][3]))
    return rows


def write(run, rows, config):
    os.makedirs(run, exist_ok=True)
    with open(os.path.join(run, "metrics.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            r = {**r, "global_step": 2048 * (r["round"] + 1)}
            w.writerow({c: "" if r.get(c) is None else r[c] for c in COLUMNS})
    with open(os.path.join(run, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    print(f"{run}: {len(rows)} rounds")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", default="/work/release-work", help="run_release.sh's WORK")
    p.add_argument("--out", default=HERE)
    p.add_argument("--rounds", type=int, help="rounds the queue was started for, if not the "
                   "rounds as written (20 MiniGrid, 100 LunarLander)")
    args = p.parse_args()
    commit_file = os.path.join(args.work, "release_commit")
    commit = open(commit_file).read().strip() if os.path.exists(commit_file) else "unknown"
    for env, (env_id, std_name, rounds, recipe, std_scripts, iif_scripts) in ENVS.items():
        results = os.path.join(args.work, "traditional-rl", env, f"results_{env}")
        if not os.path.isdir(results):
            continue
        seeds = sorted({int(m[1]) for p in os.listdir(results)
                        for m in [re.search(r"_seed-(\d+)\.txt$", p)] if m})
        for seed in seeds:
            initial = None
            for label, scripts in (("none", std_scripts), ("influence", iif_scripts)):
                times = timing(os.path.join(args.work, "timing", f"{env}__{label}__{seed}.jsonl"))
                std_file = os.path.join(results, f"{std_name}_seed-{seed}.txt")
                if label == "none":
                    rows, initial = standard_rows([std_file], times)
                else:
                    rows = iif_rows(results, seed, times)
                if not rows:
                    continue
                config = dict(
                    source="github.com/LDAORL/LDA-ORL", release_commit=commit, env_id=env_id,
                    filter_method=label, filter_p=0.125 if label == "influence" else None,
                    seed=seed, scripts=scripts, recipe=f"{recipe}. {COMMON}",
                    num_rounds=args.rounds or rounds, rounds_done=len(rows),
                    test_episodes=sorted({r["episodes"] for r in rows} - {None}),
                    test_policy="sampled actions (the release's test scripts)",
                    initial_test_return=initial, changes=CHANGES,
                    columns=" ".join(__doc__.split("\n\n")[2:]).replace("\n", " "),
                    measured_on="a 2-core CPU shared with other work, one thread a process")
                write(os.path.join(args.out, f"{env_id}__{label}__{seed}"), rows, config)
                # A standard run whose later checkpoints were tested too, with the release's test script
                # (result_<run>_rounds-21-40.txt: checkpoints 21-40), is also written with every test, as
                # <env-id>__none-all__<seed>.
                more = sorted(glob.glob(f"{std_file[:-4]}_rounds-*.txt")) if label == "none" else []
                if more:
                    ranges = [re.search(r"rounds-(\d+)-(\d+)", path) for path in more]
                    for m in ranges:
                        extra = timing(os.path.join(args.work, "timing", f"{env}__none__{seed}_{m[0]}.jsonl"))
                        for script, recs in extra.items():
                            times[script] += recs
                    all_rows, _ = standard_rows([std_file, *more], times)
                    write(os.path.join(args.out, f"{env_id}__none-all__{seed}"), all_rows, {
                        **config, "num_rounds": len(all_rows), "rounds_done": len(all_rows),
                        "scripts": [*scripts, *(f"{TEST_SCRIPT[env]} <run> {m[1]} {m[2]}" for m in ranges)],
                        "tested": "every checkpoint of the standard run: the scripts' own tests, then "
                                  "the later checkpoints with the same test script"})

if __name__ == "__main__":
    main()
