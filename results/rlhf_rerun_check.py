"""rlhf_iif.py today against rlhf_iif.py at a git commit, on the flags of committed runs: both files run each
run's config.json on this machine's build of its task, and their metrics.csv must agree, every column but the
t_* timings. (The committed runs themselves are compared too, for information: a task built on another
machine or with other library versions may differ.) Without --commit, today's file reruns the committed runs
and is compared with them, as for runs made on this machine.

    python results/rlhf_rerun_check.py --commit 84269b1 results/runs/rlhf-toy__*__[123]
    python results/rlhf_rerun_check.py --commit 84269b1 results/runs/rlhf-toy__*__[123] --today generation_batch_size
    python results/rlhf_rerun_check.py --script rlhf_variants.py results/runs/ippo-cot__i-ppo__1

Flags today's file does not know are left out, flags it added take their defaults. --today FLAG: today's run
takes today's default for that flag instead of the committed value (generation_batch_size: every prompt of a
call in one generate(), so the 200 test prompts are sampled in one call instead of 64 at a time). A column that
differs is printed with its differences. Runs go two at a time, each in a fresh process.
"""
import argparse
import csv
import dataclasses
import importlib
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def rows(path):
    with open(path) as f:
        return [{k: v for k, v in r.items() if not k.startswith("t_")} for r in csv.DictReader(f)]


def flags(config, today, script):
    module = importlib.import_module(script[:-3])
    out = []
    for field in dataclasses.fields(module.Args):
        k = field.name
        if k not in config or k in today or config[k] is None or k in ("run_name", "runs_dir", "resume"):
            continue
        name = "--" + k.replace("_", "-")
        if isinstance(config[k], bool):
            out.append(name if config[k] else "--no-" + k.replace("_", "-"))
        else:
            out += [name, str(config[k])]
    return out


def compare(old, new):
    new = [{k: r.get(k) for k in old[0]} for r in new] if old else new  # columns added since: not compared
    if old == new:
        return f"IDENTICAL ({len(new)} rounds)"
    diffs = []
    for col in old[0]:
        pairs = [(a[col], b[col]) for a, b in zip(old, new) if a[col] != b[col]]
        if pairs:
            if not all(a and b for a, b in pairs):
                diffs.append(f"{col}: {len(pairs)} of {len(old)} rounds, empty against a number")
                continue
            d = [float(y[col]) - float(x[col]) for x, y in zip(old, new)]
            diffs.append(f"{col}: {len(pairs)} of {len(old)} rounds, today's minus the other: mean "
                         f"{np.mean(d):+.4f}, mean absolute {np.mean(np.abs(d)):.4f}, largest "
                         f"{max(map(abs, d)):.4f}")
    return (f"DIFFER ({len(old)} against {len(new)} rounds)" if len(old) != len(new) else "DIFFER") + \
        "".join(f"\n    {d}" for d in diffs)


def run(script, config, today, out, name):
    cmd = [sys.executable, script, *flags(config, today, os.path.basename(script)),
           "--runs-dir", out, "--run-name", name]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                          env=dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1"))
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    return rows(os.path.join(out, name, "metrics.csv"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--commit", help="the earlier file; without it, the committed runs themselves")
    ap.add_argument("--script", default="rlhf_iif.py", choices=["rlhf_iif.py", "rlhf_variants.py"])
    ap.add_argument("--today", nargs="*", default=[], help="flags (Args fields) that take today's default in "
                                                           "today's run")
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="rlhf_rerun_")
    src = os.path.join(tmp, "src")  # the commit's scripts side by side: its rlhf_variants.py imports its rlhf_iif.py
    os.makedirs(src)
    for f in ("rlhf_iif.py", "rlhf_variants.py", "rlhf_compile.py") if a.commit else ():
        for where in (f, f"research/{f}"):  # the top level before the research folder
            show = subprocess.run(["git", "show", f"{a.commit}:{where}"], cwd=ROOT, capture_output=True, text=True)
            if show.returncode == 0:
                break
        if show.returncode == 0:
            with open(os.path.join(src, f), "w") as out:
                out.write(show.stdout)
    jobs = []
    for path in a.runs:
        name = os.path.basename(path.rstrip("/"))
        config = json.load(open(os.path.join(path, "config.json")))
        jobs.append((name, "today", os.path.join(ROOT, "" if a.script == "rlhf_iif.py" else "research", a.script), config,
                     set(a.today)))
        if a.commit:
            jobs.append((name, "old", os.path.join(src, a.script), config, set()))
    with ThreadPoolExecutor(a.jobs) as pool:
        done = list(pool.map(lambda j: (j[0], j[1], run(j[2], j[3], j[4], os.path.join(tmp, j[1]), j[0])), jobs))
    got = {(name, which): r for name, which, r in done}
    other = f"{a.script} at {a.commit}" if a.commit else "the committed run"
    print(f"{other} against today's {a.script}" + (f" (today's default for {', '.join(a.today)})"
                                                  if a.today else "") + ":")
    identical = 0
    for path in a.runs:
        name = os.path.basename(path.rstrip("/"))
        committed = rows(os.path.join(path, "metrics.csv"))
        verdict = compare(got[name, "old"] if a.commit else committed, got[name, "today"])
        identical += verdict.startswith("IDENTICAL")
        print(f"{name}: {verdict}")
        if a.commit:
            print(f"    (the committed run against {a.commit}'s rerun here: "
                  f"{compare(committed, got[name, 'old']).split(chr(10))[0]})")
    print(f"{identical} of {len(a.runs)} identical")


if __name__ == "__main__":
    main()
