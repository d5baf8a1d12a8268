"""IIF against standard PPO, each at its own best learning rate (docs/results.md, "Each method at its
best learning rate"). Both methods train at several multiples of the preset's learning rate: 1, 3
and 10 on every environment, plus the multiple at which standard PPO moved the policy about as far
a round as IIF (results/step-control/multiples.json: 5 on Acrobot, 20 on MiniGrid); a method whose
best rate (highest mean test return over the tested rounds) lies at the edge of its grid gets the
next rate of LADDER beyond it.

    python results/tuned.py run      # every run of the grid, then the edge rates; resumable
    python results/tuned.py status   # what is finished, under way, diverged or to do
    python research/analysis_variants.py sensitivity --runs results/tuned/runs   # the table and the figure

The Fig. 6(b) protocol of results/step_control.py (its ENVS flags, BipedalWalker 250 rounds tested
every 2nd). Runs already committed with exactly these settings are linked, not rerun: both methods
at the preset's rate (results/runs, or results/step-control/preset for the runs with a kl column)
and standard PPO at the KL-matched multiple (results/step-control/runs). Every run skips when
finished and resumes from its checkpoint.pt when not (iif_variants.py --resume); a finished run's
checkpoint is deleted. A rate at which a run stops on a non-finite loss is a result: its message
stays in <run>.err and the run is not retried. --envs and --seeds narrow the work (runners
side by side take disjoint seeds; a new edge rate starts with seed 1).
Runs: results/tuned/runs/<env>__<method>-lr<m>x__<seed>/.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import step_control as sc  # noqa: E402

RUNS = os.path.join(sc.ROOT, "results", "tuned", "runs")
METHODS = ("none", "influence")
BASE = (1, 3, 10)
LADDER = (0.1, 0.3, 1, 3, 5, 10, 20, 30, 100, 300, 1000)


def label(method, m):
    return f"{method}-lr{m:g}x"


def grid(env_id, method):
    """The multiples of a method on env_id: BASE, the KL-matched one, and the edge rates added so far
    (a run folder or .err of another multiple of the ladder)."""
    ms = set(BASE) | {sc.picked()[env_id]}
    for m in LADDER:
        name = f"{env_id}__{label(method, m)}__1"
        if os.path.exists(os.path.join(RUNS, name)) or os.path.exists(os.path.join(RUNS, name + ".err")):
            ms.add(m)
    return sorted(ms)


def seeds_of(env_id):
    return range(1, sc.ENVS[env_id][1] + 1)


def state(env_id, method, m, seed):
    """'done', 'diverged', 'partial' (rounds so far) or 'todo'"""
    path = os.path.join(RUNS, f"{env_id}__{label(method, m)}__{seed}")
    err = path + ".err"
    if os.path.exists(err) and "non-finite" in open(err).read():
        return "diverged"
    if not os.path.exists(os.path.join(path, "metrics.csv")):
        return "todo"
    with open(os.path.join(path, "metrics.csv")) as f:
        done = sum(1 for _ in f) - 1
    return "done" if done >= sc.ENVS[env_id][2] else f"partial {done}"


def link_committed(env_id):
    """Link the committed runs with this protocol's settings (those of results/step-control/runs)."""
    os.makedirs(RUNS, exist_ok=True)
    src = os.path.join(sc.OUT, "runs")
    for s in seeds_of(env_id):
        pairs = [("none", 1, "none"), ("influence", 1, "influence"),
                 ("none", sc.picked()[env_id], f"lr{sc.picked()[env_id]:g}x")]
        for method, m, old in pairs:
            target = os.path.realpath(os.path.join(src, f"{env_id}__{old}__{s}"))
            link = os.path.join(RUNS, f"{env_id}__{label(method, m)}__{s}")
            if os.path.isdir(target) and not os.path.lexists(link):
                os.symlink(os.path.relpath(target, RUNS), link)


def train(env_id, method, m, seed):
    flags = [*sc.ENVS[env_id][0], *sc.FULL.get(env_id, []), "--filter-method", method,
             "--learning-rate", f"{sc.preset_lr(env_id) * m:g}"]
    ok = sc.run(RUNS, env_id, label(method, m), seed, flags)
    ckpt = os.path.join(RUNS, f"{env_id}__{label(method, m)}__{seed}", "checkpoint.pt")
    if ok and os.path.exists(ckpt) and not os.path.islink(os.path.dirname(ckpt)):
        os.remove(ckpt)  # finished: the checkpoint only serves a resume
    return ok


def area(env_id, method, m):
    """Mean over seeds of the mean test return over the tested rounds; None unless every seed is
    done; -inf if a seed diverged."""
    import analysis
    n, areas = sc.ENVS[env_id][2], []
    for s in seeds_of(env_id):
        st = state(env_id, method, m, s)
        if st == "diverged":
            return -np.inf
        if st != "done":
            return None
        rows = analysis.read_metrics(os.path.join(RUNS, f"{env_id}__{label(method, m)}__{s}", "metrics.csv"))
        areas.append(np.nanmean([r["test_return_mean"] for r in rows[:n]]))
    return float(np.mean(areas))


def edge_rate(env_id, method):
    """The ladder's next multiple beyond the grid's edge where the method's best rate sits there,
    once every run of its grid is finished; else None."""
    ms = grid(env_id, method)
    scores = {m: area(env_id, method, m) for m in ms}
    if any(v is None for v in scores.values()):
        return None
    best = max(ms, key=lambda m: scores[m])
    if best == ms[-1] and ms[-1] < LADDER[-1]:
        return LADDER[LADDER.index(ms[-1]) + 1]
    if best == ms[0] and ms[0] > LADDER[0]:
        return LADDER[LADDER.index(ms[0]) - 1]
    return None


def stage_run(envs, seeds):
    for env_id in envs:
        link_committed(env_id)
        while True:
            for s in seeds_of(env_id):
                for m in sorted(set(grid(env_id, "none")) | set(grid(env_id, "influence"))):
                    for method in METHODS:
                        if s in seeds and m in grid(env_id, method) and state(env_id, method, m, s) != "diverged":
                            train(env_id, method, m, s)
            new = {method: edge_rate(env_id, method) for method in METHODS}
            new = {method: m for method, m in new.items() if m is not None}
            if not new:
                break
            if 1 not in seeds:  # a runner given other seeds leaves seed 1 to the one that has it
                print(f"{env_id}: a best rate at its grid's edge waits for a run with seed 1", flush=True)
                break
            for method, m in new.items():  # seed 1 first marks the rate as part of the grid
                print(f"{env_id}: {method}'s best rate is at its grid's edge; adding lr x {m:g}", flush=True)
                train(env_id, method, m, 1)


def stage_status(envs):
    import analysis
    hours, n = 0.0, 0
    for env_id in envs:
        for method in METHODS:
            for m in grid(env_id, method):
                states = [state(env_id, method, m, s) for s in seeds_of(env_id)]
                print(f"{env_id:22s} {label(method, m):20s} {', '.join(states)}")
                for s in seeds_of(env_id):  # the seconds its own runs recorded (linked ones left out)
                    run = os.path.join(RUNS, f"{env_id}__{label(method, m)}__{s}")
                    if not os.path.islink(run) and os.path.exists(os.path.join(run, "metrics.csv")):
                        rows = analysis.read_metrics(os.path.join(run, "metrics.csv"))
                        hours += sum(v for r in rows for k, v in r.items() if k.startswith("t_")) / 3600
                        n += 1
    print(f"{n} runs made here (not linked) recorded {hours:.1f} hours of rollout, influence, "
          "optimisation and test time in their metrics.csv")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("stage", choices=["run", "status"])
    parser.add_argument("--envs", nargs="+", default=list(sc.ENVS), choices=list(sc.ENVS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3, 4, 5])
    a = parser.parse_args()
    if a.stage == "run":
        stage_run(a.envs, a.seeds)
    else:
        stage_status(a.envs)
