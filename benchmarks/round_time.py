"""The paper's Table 4 for rlhf_iif.py and grpo_iif.py: seconds of one round (a generation batch for GRPO) by
component, standard training against IIF, for a policy of a named shape built here with random weights (no hub:
timings only) and the byte-level tokenizer of benchmarks/rlhf_toy_task.py. Prints medians over rounds (the first
of each run warms up) and the ratios the paper's cost claims rest on.

    python benchmarks/round_time.py --shape gpt-neo-2.7B --device cuda    # Table 4's setting, on a GPU
    python benchmarks/round_time.py --shape gpt-neo-2.7B --device cuda --compile   # rlhf_compile.py
    python benchmarks/round_time.py --script grpo --shape qwen2.5-0.5B --device cuda --batch-size 128 \
        --gen-tokens 128 --mini-batch-size 16 --num-generations 8
    python benchmarks/round_time.py --shape gpt-neo-125M --batch-size 32 --threads 1    # a CPU

rlhf: --batch-size episodes a round, mini-batch 1, 4 epochs, LoRA r 16 on q/v (the paper's and the released
code's), rlhf_compile.py's loop with --compile; grpo: --batch-size completions a generation batch, --num-generations per prompt, --mini-batch-size a
micro-batch, LoRA. Both at the scripts' default --dtype and --forward-batch-size for the device unless given.
"""
import argparse
import contextlib
import csv
import os
import random
import sys
import tempfile

import numpy as np
import torch
import tyro

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(sys.path[0], "research"))  # the files beyond the paper
from benchmarks.rlhf_toy_task import byte_tokenizer, tiny_classifier, write_data  # noqa: E402

COLS = ["t_generate", "t_forward", "t_influence", "t_optim"]
# the paper's Table 4 (one A100-80GB, gpt-neo-2.7B, 256 episodes; bfloat16 as the released code loads it): IIF,
# standard
PAPER = {"t_generate": (1.71, 1.59), "t_forward": (1.03, 0.99), "t_influence": (2.2, None),
         "t_optim": (40.39, 85.56), "round": (45.28, 88.15)}


def policy_of(shape, vocab, eos, layers=None):
    """A causal LM of the named shape (or W x L: a GPT-Neo of width W and L layers), random weights; layers: fewer
    (or more) layers of the shape's width"""
    from transformers import GPTNeoConfig, GPTNeoForCausalLM, Qwen2Config, Qwen2ForCausalLM
    ids = dict(vocab_size=vocab, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    if shape == "qwen2.5-0.5B":
        return Qwen2ForCausalLM(Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=layers or 24,
                                            num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True,
                                            max_position_embeddings=2048, rope_theta=1e6, **ids))
    width, depth, heads = {"gpt-neo-2.7B": (2560, 32, 20), "gpt-neo-125M": (768, 12, 12)}.get(shape, (0, 0, 0))
    if not width:
        width, depth = map(int, shape.split("x"))
        heads = max(2, width // 64)
    layers = layers or depth
    return GPTNeoForCausalLM(GPTNeoConfig(hidden_size=width, num_layers=layers, num_heads=heads,
                                          attention_types=[[["global", "local"], layers // 2]], window_size=256,
                                          intermediate_size=4 * width, max_position_embeddings=2048, **ids))


def build(root, shape, device, n_prompts, dtype=torch.float32, layers=None):
    """The task in root: policy/ (the shape, random weights, saved in dtype), reward/ (a tiny
    untrained classifier) and prompts.jsonl; returns the policy's parameter count. A root that holds
    a task already is used as it is."""
    if os.path.exists(os.path.join(root, "policy", "n_params.txt")):
        return int(open(os.path.join(root, "policy", "n_params.txt")).read())
    os.makedirs(root, exist_ok=True)
    torch.manual_seed(0)
    tok = byte_tokenizer()
    write_data(root, random.Random(0), n_prompts=n_prompts)
    with torch.device(device):
        lm = policy_of(shape, len(tok), tok.eos_token_id, layers)
    lm.to(dtype).save_pretrained(os.path.join(root, "policy"))
    n_params = sum(p.numel() for p in lm.parameters())
    del lm
    tiny_classifier(tok, ["nothate", "hate"]).save_pretrained(os.path.join(root, "reward"))
    for name in ("policy", "reward"):
        tok.save_pretrained(os.path.join(root, name))
    with open(os.path.join(root, "policy", "n_params.txt"), "w") as f:
        f.write(str(n_params))
    return n_params


def libraries():
    """The versions of what the scripts load (a library that fails to import is named, not raised:
    a finished table is never lost to its last line)"""
    out = [f"torch {torch.__version__}" + (f" (CUDA {torch.version.cuda})" if torch.version.cuda else "")]
    for name in ("transformers", "trl", "peft"):
        try:
            out.append(f"{name} {__import__(name).__version__}")
        except Exception as e:  # noqa: BLE001
            out.append(f"{name} not importable ({type(e).__name__})")
    return ", ".join(out)


def run(script, root, runs, method, rep, a):
    """One run of the script; its progress lines go to stderr, its rows to <runs>/<method>_<rep>/metrics.csv"""
    common = ["--model-name", os.path.join(root, "policy"), "--reward-model", os.path.join(root, "reward"),
              "--dataset", os.path.join(root, "prompts.jsonl"), "--filter-method", method,
              "--batch-size", str(a.batch_size), "--gen-tokens", str(a.gen_tokens), "--runs-dir", runs,
              "--run-name", f"{method}_{rep}",
              *(["--threads", str(a.threads)] if a.threads else []), *(["--dtype", a.dtype] if a.dtype else []),
              *(["--forward-batch-size", str(a.forward_batch_size)] if a.forward_batch_size else [])]
    if script.__name__ in ("rlhf_iif", "rlhf_compile"):
        flags = [*common, "--mini-batch-size", "1", "--ppo-epochs", "4", "--rounds", str(a.rounds),
                 "--device", a.device, "--eval-every", "0"]
    else:
        steps = a.batch_size // a.mini_batch_size
        flags = [*common, "--mini-batch-size", str(a.mini_batch_size), "--num-generations", str(a.num_generations),
                 "--max-steps", str(a.rounds * steps), "--beta", str(a.beta), "--logging-steps", str(10 ** 6),
                 *(["--use-cpu"] if a.device == "cpu" else [])]
    args = script.resolve_args(tyro.cli(script.Args, args=flags))
    with contextlib.redirect_stdout(sys.stderr):
        script.main(args)
    with open(os.path.join(runs, f"{method}_{rep}", "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    return rows[1:], rows[0], args  # round 0 warms up (and compiles)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--script", choices=["rlhf", "grpo"], default="rlhf")
    ap.add_argument("--shape", default="gpt-neo-2.7B", help="gpt-neo-2.7B, gpt-neo-125M, qwen2.5-0.5B, or WxL")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], help="default: the scripts' for the device")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--gen-tokens", type=int, default=30)
    ap.add_argument("--forward-batch-size", type=int, help="default: the scripts' for the device")
    ap.add_argument("--mini-batch-size", type=int, default=16, help="grpo only")
    ap.add_argument("--num-generations", type=int, default=8, help="grpo only")
    ap.add_argument("--beta", type=float, default=0.04, help="grpo only: its KL coefficient")
    ap.add_argument("--rounds", type=int, default=3, help="rounds (generation batches) a run; the first warms up")
    ap.add_argument("--reps", type=int, default=2, help="alternating runs of each method")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--compile", action="store_true", help="rlhf only: rlhf_compile.py's loop")
    ap.add_argument("--task", help="the task's folder: built there unless it holds one (default: a temporary one)")
    ap.add_argument("--save-dtype", choices=["bfloat16", "float32"], default="float32",
                    help="the dtype a task's policy is saved in when built")
    ap.add_argument("--build-only", action="store_true", help="build the task in --task and stop")
    ap.add_argument("--runs-dir", help="where the runs' folders go (default: in the task's folder)")
    a = ap.parse_args()
    if a.compile and a.script != "rlhf":
        ap.error("--compile runs rlhf_compile.py (--script rlhf)")
    if a.build_only and not a.task:
        ap.error("--build-only needs --task")
    if a.threads:
        torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory(prefix="round_time_") as tmp:
        measure(a, a.task or tmp)


def measure(a, root):
    n_params = build(root, a.shape, a.device, n_prompts=max(2048, 2 * a.batch_size * (a.rounds + 1)),
                     dtype=getattr(torch, a.save_dtype))
    if a.build_only:
        print(f"{a.shape} ({n_params / 1e9:.2f} B parameters, saved in {a.save_dtype}) -> {root}", file=sys.stderr)
        return
    if a.script == "rlhf" and a.compile:
        import rlhf_compile as script
    elif a.script == "rlhf":
        import rlhf_iif as script
    else:
        import grpo_iif as script
    runs = a.runs_dir or os.path.join(root, "runs")
    device = torch.cuda.get_device_name(a.device) if a.device.startswith("cuda") else f"CPU, {torch.get_num_threads()} threads"
    what = (f"{a.batch_size} episodes a round, mini-batch 1, 4 epochs" if a.script == "rlhf" else
            f"{a.batch_size} completions a generation batch ({a.num_generations} per prompt), micro-batches of "
            f"{a.mini_batch_size}, beta {a.beta:g}")
    print(f"{a.script}_iif.py, {a.shape} shape ({n_params / 1e9:.2f} B parameters, random weights, byte vocabulary), "
          f"{device}: {what}, LoRA r 16, {a.gen_tokens}-token continuations{', --compile' if a.compile else ''}; "
          f"seconds, medians over {a.reps} x {a.rounds - 1} rounds (the first round of a run warms up); "
          f"{libraries()}\n", flush=True)
    # a row per run as it ends, so that a run stopped by a time limit keeps the runs before it
    print("| run | rounds after the first | " + " | ".join(COLS) + " | optimizer steps | first round, s |")
    print("|---|---|" + "---|" * len(COLS) + "---|---|", flush=True)
    rows, first = {"none": [], "influence": []}, {"none": [], "influence": []}
    for rep in range(a.reps):
        for method in rows:
            r, r0, args = run(script, root, runs, method, rep, a)
            rows[method] += r
            first[method].append(r0)
            med = [float(np.median([float(x[c]) for x in r])) if r else float("nan") for c in COLS]
            print(f"| {method}_{rep} | {len(r)} | " + " | ".join(f"{m:.2f}" for m in med)
                  + f" | {sum(int(x['n_updates']) for x in r) if a.script == 'rlhf' else '-'} | "
                  f"{sum(float(r0[c]) for c in COLS):.1f} |", flush=True)
    med = {m: {c: float(np.median([float(r[c]) for r in rs])) for c in COLS + ["n_kept"]} for m, rs in rows.items()}
    for m, rs in rows.items():
        med[m]["round"] = sum(med[m][c] for c in COLS)
        if a.script == "rlhf":  # ms an optimizer step; the first round's extra seconds (warm-up, compile)
            med[m]["step_ms"] = float(np.median([1e3 * float(r["t_optim"]) / int(r["n_updates"]) for r in rs]))
            med[m]["first"] = float(np.median([sum(float(r[c]) for c in COLS) for r in first[m]])) - med[m]["round"]
    print(f"\n{args.dtype}, forward batch {args.forward_batch_size}\n")
    paper = a.script == "rlhf" and a.shape == "gpt-neo-2.7B"
    print("| component | standard | IIF |" + (" paper, standard | paper, IIF |" if paper else ""))
    print("|---|---|---|" + ("---|---|" if paper else ""))
    names = {"t_generate": "generation and reward", "t_forward": "forward", "t_influence": "influence",
             "t_optim": "optimisation", "round": "round"}
    for c, name in names.items():
        std = "-" if c == "t_influence" else f"{med['none'][c]:.2f}"
        line = f"| {name} | {std} | {med['influence'][c]:.2f} |"
        if paper:
            line += f" {PAPER[c][1] if PAPER[c][1] is not None else '-'} | {PAPER[c][0]} |"
        print(line)
    if a.script == "rlhf":
        print(f"| optimiser step, ms | {med['none']['step_ms']:.1f} | {med['influence']['step_ms']:.1f} |"
              + (" 84 (85.56 s / 1,024) | - |" if paper else ""))
        print(f"| first round, extra s (warm-up{', compile' if a.compile else ''}) | {med['none']['first']:.1f} | "
              f"{med['influence']['first']:.1f} |" + (" - | - |" if paper else ""))
    std, iif = med["none"], med["influence"]
    ratio = iif["t_influence"] / std["t_optim"]
    cost = (f"influence / standard's optimisation {ratio:.1%} (paper 2.2 / 85.56 = 2.6 %)" if a.script == "rlhf"
            else f"influence / standard's update (one forward and backward pass of the batch) {ratio:.2f}")
    print(f"\nkept {iif['n_kept'] / a.batch_size:.0%}; {cost}; IIF's optimisation / standard's "
          f"{iif['t_optim'] / std['t_optim']:.2f}; round / standard's {iif['round'] / std['round']:.2f}")
    if a.script == "rlhf" and a.batch_size < 256:
        project(med, a.batch_size, paper)


def project(med, batch, paper):
    """A 256-episode round from a smaller one: every optimizer step trains one episode whatever the batch, so
    optimisation is the step's time x 4 epochs x the episodes kept; generation, forward and influence scale at
    most with the episodes (one generate() call decodes a batch of 256 in as many steps as a batch of 32)"""
    print(f"\nProjected to 256 episodes: optimisation = ms a step x 4 x 256 x the fraction kept; generation, forward "
          f"and influence x 256 / {batch} (an upper bound)\n")
    print("| component | standard | IIF |" + (" paper, standard | paper, IIF |" if paper else ""))
    print("|---|---|---|" + ("---|---|" if paper else ""))
    scale = 256 / batch
    out = {}
    for m in ("none", "influence"):
        kept = med[m]["n_kept"] / batch
        out[m] = dict(t_generate=med[m]["t_generate"] * scale, t_forward=med[m]["t_forward"] * scale,
                      t_influence=med[m]["t_influence"] * scale, t_optim=med[m]["step_ms"] * 1e-3 * 4 * 256 * kept)
        out[m]["round"] = sum(out[m].values())
    for c, name in [("t_generate", "generation and reward"), ("t_forward", "forward"),
                    ("t_influence", "influence"), ("t_optim", "optimisation"), ("round", "round")]:
        std = "-" if c == "t_influence" else f"{out['none'][c]:.2f}"
        print(f"| {name} | {std} | {out['influence'][c]:.2f} |"
              + (f" {PAPER[c][1] if PAPER[c][1] is not None else '-'} | {PAPER[c][0]} |" if paper else ""))


if __name__ == "__main__":
    main()
