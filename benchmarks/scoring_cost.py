"""What scoring a buffer costs in rlhf_iif.py and grpo_iif.py, in forward and backward passes over it, on the toy
task of benchmarks/rlhf_toy_task.py with the settings of results/rlhf_toy.sh and results/grpo_toy.sh (64 episodes or
completions, LoRA). The unit is one batched forward and backward pass of the training loss over the whole buffer
(for GRPO, TRL's own update passes over the generation batch); each way of scoring is timed against it, alternating,
and the medians are printed.

    python benchmarks/scoring_cost.py --task results/rlhf_toy_task
"""
import argparse
import dataclasses
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
import rlhf_iif  # noqa: E402


def medians(fns, reps):
    """Median seconds of each function, run in turn reps times"""
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def rlhf_cases(task, two_passes):
    args = rlhf_iif.resolve_args(tyro.cli(rlhf_iif.Args, args=[
        "--model-name", f"{task}/policy", "--reward-model", f"{task}/reward", "--dataset", f"{task}/prompts.jsonl",
        "--batch-size", "64", "--device", "cpu", "--init-kl-coef", "0.2"]))
    torch.manual_seed(0)
    policy, ref, tok = rlhf_iif.make_policy(args, torch.device("cpu"))
    with torch.no_grad():  # a trained adapter's size: LoRA B away from 0
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.add_(0.02 * torch.randn_like(p))
    cpu = torch.device("cpu")
    rm = rlhf_iif.make_reward_fn(*rlhf_iif.load_classifier("--reward-model", args.reward_model, "--reward-label", "nothate",
                                                           cpu), cpu)
    b = rlhf_iif.episodes(policy, ref, rlhf_iif.load_prompts(args, tok)[0][:64], 0.2, rm, tok, args,
                          torch.device("cpu"))
    params = [p for p in policy.parameters() if p.requires_grad]

    def unit():
        for idx in rlhf_iif.batches(64, args.forward_batch_size):
            torch.autograd.grad(rlhf_iif.ppo_losses(policy, b, idx, args).sum(), params)
    return "rlhf_iif.py", args.forward_batch_size, unit, {
        "activations, a target pass and a pass over the buffer": lambda: rlhf_iif.influence(policy, b, b, args),
        "forward mode (--no-lora's way; here on the LoRA weights)":
            lambda: rlhf_iif.influence_forward_mode(policy, b, b, args)}


def grpo_cases(task, two_passes):
    args = grpo_iif.resolve_args(tyro.cli(grpo_iif.Args, args=[
        "--model-name", f"{task}/policy", "--reward-model", f"{task}/reward", "--dataset", f"{task}/prompts.jsonl",
        "--num-generations", "8", "--batch-size", "64", "--mini-batch-size", "16", "--beta", "0.2", "--use-cpu",
        "--runs-dir", "/nonexistent", "--filter-method", "none"]))
    trainer = grpo_iif.make_trainer(args)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    torch.manual_seed(0)
    b = trainer._generate_and_score_completions([{"prompt": p} for p in trainer.train_dataset["prompt"][:8]
                                                 for _ in range(8)])
    model = trainer.accelerator.unwrap_model(trainer.model)
    beta0 = dataclasses.replace(args, beta=0.0)

    def unit():  # TRL's passes over the generation batch: shuffled, in its micro-batches, forward and backward
        for mb in split_tensor_dict(shuffle_sequence_dict(b), trainer.args.steps_per_generation):
            trainer._compute_loss(model, mb).backward()
        model.zero_grad()
    return "grpo_iif.py", args.forward_batch_size, unit, {
        "activations, one pass, beta 0 (one backward pass)":
            lambda: grpo_iif.influence(model, b, b, beta0),
        "activations, one pass, beta 0.2 (two backward passes)":
            lambda: grpo_iif.influence(model, b, b, args),
        "activations, two passes (validation target, or gradients too large to keep)":
            lambda: two_passes(grpo_iif, lambda: grpo_iif.influence(model, b, b, args)),
        "forward mode (--no-lora's way; here on the LoRA weights)": lambda: grpo_iif.influence_forward_mode(model, b, b, args)}


def without_room_for_gradients(module, fn):
    """fn() as if the per-record gradients did not fit in memory: the two-pass form"""
    keep = module.memory_for_grads
    module.memory_for_grads = lambda device: 0
    try:
        return fn()
    finally:
        module.memory_for_grads = keep


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="results/rlhf_toy_task", help="benchmarks/rlhf_toy_task.py's folder")
    ap.add_argument("--reps", type=int, default=7, help="alternating repetitions; the median is printed")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    t_start = time.perf_counter()
    torch.set_num_threads(a.threads)
    print(f"Scoring a buffer of 64 records on the toy task ({a.task}), float32, CPU, {a.threads} thread(s): "
          f"seconds (median of {a.reps} alternating repetitions) and passes = seconds / one forward and backward "
          f"pass of the training loss over the buffer\n")
    print("| script | forward batch | scoring | seconds | passes |\n|---|---|---|---|---|")
    for cases in (rlhf_cases, grpo_cases):
        script, fb, unit, scorers = cases(a.task, without_room_for_gradients)
        t = medians({"unit": unit, **scorers}, a.reps)
        print(f"| {script} | {fb} | one forward and backward pass of the loss | {t['unit']:.3f} | 1 |")
        for name in scorers:
            print(f"| {script} | {fb} | {name} | {t[name]:.3f} | {t[name] / t['unit']:.2f} |", flush=True)
    print(f"\n{time.perf_counter() - t_start:.0f} s in all (wall clock, this command)")


if __name__ == "__main__":
    main()
