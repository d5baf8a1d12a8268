"""Per-round time breakdown of rlhf_iif.py (the paper's Table 4), standard PPO against IIF, on small
untrained GPT-Neo policies built here (offline, CPU). Prints medians over rounds and the ratios.

    python benchmarks/rlhf_round_time.py            # about 10 minutes on 2 cores
"""
import argparse
import csv
import os
import random
import sys
import tempfile

import numpy as np
import torch
import tyro

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import rlhf_iif  # noqa: E402
from benchmarks.rlhf_toy_task import byte_tokenizer, tiny_classifier, tiny_lm, write_data  # noqa: E402

COLS = ["t_generate", "t_forward", "t_influence", "t_optim"]


def run(root, name, model, method, a, rep):
    flags = ["--model-name", model, "--reward-model", os.path.join(root, "reward"), "--dataset",
             os.path.join(root, "prompts.jsonl"), "--eval-every", "0", "--batch-size", str(a.batch_size),
             "--mini-batch-size", "1", "--ppo-epochs", "4", "--rounds", str(a.rounds), "--filter-method", method,
             "--runs-dir", os.path.join(root, "runs"), "--run-name", f"{name}_{method}_{rep}", "--device", "cpu",
             "--threads", str(a.threads)]
    rlhf_iif.main(rlhf_iif.resolve_args(tyro.cli(rlhf_iif.Args, args=flags)))
    with open(os.path.join(root, "runs", f"{name}_{method}_{rep}", "metrics.csv")) as f:
        return list(csv.DictReader(f))[1:]  # round 0 warms up


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64x2,256x4", help="policies as width x layers")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=2, help="alternating repetitions of each method")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="rlhf_bench_")
    torch.manual_seed(0)
    tok = byte_tokenizer()
    write_data(root, random.Random(0), n_prompts=a.batch_size * (a.rounds + 1) * 2)
    tiny_classifier(tok, ["nothate", "hate"]).save_pretrained(os.path.join(root, "reward"))
    tok.save_pretrained(os.path.join(root, "reward"))
    print(f"batch {a.batch_size} episodes, mini-batch 1, 4 epochs, LoRA r16 on q/v, 30-token continuations; "
          f"medians over {a.reps} x {a.rounds - 1} rounds\n")
    print("| policy | method | kept | " + " | ".join(COLS) + " | round | influence / optim | influence / std optim |"
          " optim / std optim | round / std round |")
    print("|---" * 11 + "|")
    for size in a.sizes.split(","):
        width, layers = map(int, size.split("x"))
        model = os.path.join(root, f"policy_{size}")
        lm = tiny_lm(tok, "gpt_neo", width=width, layers=layers, heads=max(2, width // 64))
        lm.save_pretrained(model)
        tok.save_pretrained(model)
        n_params = sum(p.numel() for p in lm.parameters())
        rows = {"none": [], "influence": []}
        for rep in range(a.reps):
            for method in rows:
                rows[method] += run(root, size, model, method, a, rep)
        med = {m: {c: float(np.median([float(r[c]) for r in rs])) for c in COLS + ["n_kept"]} for m, rs in rows.items()}
        for m in med.values():
            m["round"] = sum(m[c] for c in COLS)
        std = med["none"]
        for method, m in med.items():
            ratios = (f"{m['t_influence'] / m['t_optim']:.1%} | {m['t_influence'] / std['t_optim']:.1%} | "
                      f"{m['t_optim'] / std['t_optim']:.2f} | {m['round'] / std['round']:.2f}") if method != "none" \
                else "- | - | 1 | 1"
            print(f"| GPT-Neo {width}x{layers} ({n_params / 1e6:.1f} M) | {'IIF' if method != 'none' else 'standard'} | "
                  f"{m['n_kept'] / a.batch_size:.0%} | " + " | ".join(f"{m[c]:.2f}" for c in COLS)
                  + f" | {m['round']:.2f} | {ratios} |", flush=True)


if __name__ == "__main__":
    main()
