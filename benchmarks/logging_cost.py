"""What iif.py's CleanRL logging costs: today's iif.py against an older commit's, whole processes side by side.

Both train IIF on Acrobot for 40,960 steps (20 rounds, 1000 test episodes a round) on one backend for both stages
(envpool by default, so that the comparison leaves the backend's default out), imports included, one torch thread.
The older commit defaults to cd04c34, the last before TensorBoard, wandb, videos and the saved model; its tree is
taken out with `git archive`. The two alternate, and the ratio is the median over the pairs.

    python benchmarks/logging_cost.py [--commit cd04c34] [--repeats 3] > results/benchmarks/logging_cost.md
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(cmd, cwd):
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{' '.join(cmd[:2])} failed:\n{proc.stderr[-2000:]}")
    return time.perf_counter() - t0, proc.stdout.splitlines()[-1]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--commit", default="cd04c34")
    parser.add_argument("--repeats", type=int, default=3, help="pairs of runs")
    parser.add_argument("--backend", default="envpool", choices=["envpool", "gymnasium"])
    cli = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old = os.path.join(tmp, "old")
        os.makedirs(old)
        archive = subprocess.run(["git", "archive", cli.commit], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", old], input=archive, check=True)
        flags = ["--env-id", "Acrobot-v1", "--env-backend", cli.backend, "--total-timesteps", "40960"]
        rows, times = [], {"today": [], cli.commit: []}
        for rep in range(cli.repeats):
            for name, tree in (("today", ROOT), (cli.commit, old)):
                t, last = timed([sys.executable, os.path.join(tree, "iif.py"), *flags, "--runs-dir",
                                 os.path.join(tmp, "runs"), "--run-name", f"{name}_{rep}"], tmp)
                times[name].append(t)
                print(f"{name} pair {rep + 1}: {t:.1f} s ({last[:60]}...)", file=sys.stderr, flush=True)
            rows.append(f"| {rep + 1} | {times['today'][-1]:.1f} | {times[cli.commit][-1]:.1f} | "
                        f"{times['today'][-1] / times[cli.commit][-1]:.3f} |")
    print(f"`python benchmarks/logging_cost.py --commit {cli.commit} --repeats {cli.repeats} --backend {cli.backend}`:"
          f" iif.py --env-id Acrobot-v1 --env-backend {cli.backend} --total-timesteps 40960, whole processes\n")
    print(f"| pair | today (s) | {cli.commit} (s) | ratio |")
    print("|---|---|---|---|")
    print("\n".join(rows))
    ratios = [a / b for a, b in zip(times["today"], times[cli.commit])]
    print(f"\nmedian: today {statistics.median(times['today']):.1f} s, {cli.commit} "
          f"{statistics.median(times[cli.commit]):.1f} s, ratio {statistics.median(ratios):.3f} "
          f"(over {cli.repeats} alternating pairs)")
