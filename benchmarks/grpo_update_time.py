"""Seconds of grpo_iif.py's update (TRL's forward and backward passes over one generation batch) against the
fraction of completions kept: dropped completions taken out of the tensors (grpo_iif.py) or only masked (as
TRL's mask_truncated_completions does). On the toy task of results/grpo_toy.sh with its settings (64
completions, 4 micro-batches of 16), offline, CPU. What scoring costs: benchmarks/scoring_cost.py.

    python benchmarks/grpo_update_time.py --task results/rlhf_toy_task
"""
import argparse
import os
import statistics
import sys
import time

import torch
import tyro
from trl.trainer.utils import shuffle_sequence_dict, split_tensor_dict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(sys.path[0], "research"))  # the files beyond the paper
import grpo_iif  # noqa: E402


def seconds(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def update(trainer, b):
    """TRL's passes over a generation batch: shuffled, split into its micro-batches, forward and backward"""
    model = trainer.model
    for mb in split_tensor_dict(shuffle_sequence_dict(b), trainer.args.steps_per_generation):
        trainer._compute_loss(model, mb).backward()
    model.zero_grad()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="results/rlhf_toy_task", help="benchmarks/rlhf_toy_task.py's folder")
    ap.add_argument("--reps", type=int, default=7, help="repetitions; the median is printed")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    t = a.task
    flags = ["--model-name", f"{t}/policy", "--reward-model", f"{t}/reward", "--dataset", f"{t}/prompts.jsonl",
             "--num-generations", "8", "--batch-size", "64", "--mini-batch-size", "16", "--beta", "0.2",
             "--use-cpu", "--runs-dir", "/nonexistent", "--filter-method", "none"]
    args = grpo_iif.resolve_args(tyro.cli(grpo_iif.Args, args=flags))
    trainer = grpo_iif.make_trainer(args)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    torch.manual_seed(0)
    prompts = [{"prompt": p} for p in trainer.train_dataset["prompt"][:8] for _ in range(8)]
    b = trainer._generate_and_score_completions(prompts)
    print(f"{args.model_name}: one generation batch of 64 completions, "
          f"{trainer.args.steps_per_generation} micro-batches; median of {a.reps} repetitions\n")
    t_update = seconds(lambda: update(trainer, b), a.reps)
    print(f"update on all 64 completions: {t_update:.3f} s")
    print("\n| kept | update, masked (s) | update, taken out (s) | taken out / masked |\n|---|---|---|---|")
    gen = torch.Generator().manual_seed(0)
    for frac in (1.0, 0.75, 0.55, 0.25):
        kept = torch.zeros(64, dtype=torch.bool)
        kept[torch.randperm(64, generator=gen)[:round(64 * frac)]] = True
        masked = dict(b, completion_mask=b["completion_mask"] * kept[:, None])
        masked["num_items_in_batch"] = masked["completion_mask"].sum()
        t_mask = seconds(lambda: update(trainer, masked), a.reps)
        t_out = seconds(lambda: update(trainer, grpo_iif.keep_only(trainer, b, kept)), a.reps)
        print(f"| {kept.float().mean():.2f} | {t_mask:.3f} | {t_out:.3f} | {t_out / t_mask:.2f} |")


if __name__ == "__main__":
    main()
