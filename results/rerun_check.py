"""Reruns the first rounds of committed runs with today's iif_variants.py and compares their metrics.csv
(every column but the t_* timings, kl to 1e-3 relative) with the committed one: the same seed must give the
same rows.
    python results/rerun_check.py results/runs/FrozenLake-v1__influence__1 --rounds 50
"""
import argparse
import csv
import dataclasses
import math
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(sys.path[0], "research"))  # the files beyond the paper
import torch  # noqa: E402

import analysis_variants  # noqa: E402
import iif_variants as variants  # noqa: E402


def rows(path, n):
    with open(path) as f:
        return [{k: v for k, v in r.items() if not k.startswith("t_")} for r in csv.DictReader(f)][:n]


parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("runs", nargs="+")
parser.add_argument("--rounds", type=int, default=5, help="rounds to rerun from round 0")
a = parser.parse_args()
torch.distributions.Distribution.set_default_validate_args(False)
failed = 0
for run in a.runs:
    config = analysis_variants.load_config(run)
    flags = {f.name: config[f.name] for f in dataclasses.fields(variants.Args)
             if f.name in config and f.name not in variants.NOT_COMPARED}
    n = min(a.rounds, len(rows(os.path.join(run, "metrics.csv"), 10**9)))
    with tempfile.TemporaryDirectory() as tmp:
        args = variants.Args(**{**flags, "runs_dir": tmp, "run_name": "rerun"})
        args.total_timesteps = n * config["num_steps"] * config["num_envs"]
        variants.main(variants.resolve_args(args))
        old = rows(os.path.join(run, "metrics.csv"), n)
        new = rows(os.path.join(tmp, "rerun", "metrics.csv"), n)
        # columns added since are not compared; kl to 1e-3 relative (a float32 pass over the buffer, whose matrix
        # kernels round differently on other CPUs, and (r - 1) - log r loses digits near r = 1), every other
        # column exactly
        kl = [(float(r_new["kl"]), float(r_old["kl"])) for r_new, r_old in zip(new, old) if r_old.get("kl")]
        differ = sorted({k for r_new, r_old in zip(new, old) for k in r_old
                         if r_new[k] != r_old[k] and k != "kl"}
                        | ({"kl"} if any(not math.isclose(a, b, rel_tol=1e-3) for a, b in kl) else set()))
        same = not differ and len(new) == len(old)
    kl_diff = max((abs(a - b) / abs(b) for a, b in kl if b), default=0.0)
    print(f"{run}: first {n} rounds {'identical' if same else 'DIFFER in ' + ', '.join(differ)}"
          + (f" (kl: {kl_diff:.1e} relative at most)" if kl else ""), flush=True)
    failed += not same
sys.exit(failed)
