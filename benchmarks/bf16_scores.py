"""What --dtype bfloat16 does to the influence scores of rlhf_iif.py and grpo_iif.py, on the toy task of
benchmarks/rlhf_toy_task.py: the same policy scores the same buffers in float64 and in bfloat16 (frozen weights in
bfloat16, passes under autocast); printed are Spearman's rank correlation of the two sets of scores and the share
of records whose fate under the default filter (kept when the score is > 0) is the same, at the initial policy and
after --rounds rounds of float32 IIF training with the toy task's settings.

    python benchmarks/rlhf_toy_task.py --out results/rlhf_toy_task     # once, about 3 to 7 minutes
    python benchmarks/bf16_scores.py --task results/rlhf_toy_task
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np
import scipy.stats
import torch
import tyro

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(sys.path[0], "research"))  # the files beyond the paper
import grpo_iif  # noqa: E402
import rlhf_iif  # noqa: E402


def agreement(s64, s16):
    rho = scipy.stats.spearmanr(s64.double().cpu().numpy(), s16.double().cpu().numpy()).statistic
    return rho, ((s64 > 0) == (s16 > 0)).double().mean().item(), (s64 > 0).double().mean().item()


def rlhf_flags(task, *extra):  # results/rlhf_toy.sh's settings
    return ["--model-name", f"{task}/policy", "--reward-model", f"{task}/reward", "--dataset", f"{task}/prompts.jsonl",
            "--batch-size", "64", "--learning-rate", "3e-4", "--init-kl-coef", "0.2", "--device", "cpu",
            "--eval-every", "0", *extra]


def copy_trained(src, dst):
    weights = dict(src.named_parameters())
    with torch.no_grad():
        for n, p in dst.named_parameters():
            if p.requires_grad:
                p.copy_(weights[n])


def rlhf_policy(args, trained):
    torch.manual_seed(0)
    policy, ref, tok = rlhf_iif.make_policy(args, torch.device("cpu"))
    if trained:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file
        set_peft_model_state_dict(policy.lm, load_file(os.path.join(trained, "policy", "adapter_model.safetensors")))
        policy.v_head.load_state_dict(torch.load(os.path.join(trained, "value_head.pt")))
    return policy, ref, tok


def rlhf_rows(task, rounds, buffers, tmp):
    args = rlhf_iif.resolve_args(tyro.cli(rlhf_iif.Args, args=rlhf_flags(task, "--rounds", str(rounds), "--runs-dir", tmp,
                                                                         "--run-name", "rlhf")))
    rlhf_iif.main(args)  # float32 IIF training
    out = []
    for trained, state in ((None, "initial policy"), (os.path.join(tmp, "rlhf"), f"after {rounds} rounds")):
        args64 = rlhf_iif.resolve_args(tyro.cli(rlhf_iif.Args, args=rlhf_flags(task)))
        args16 = rlhf_iif.resolve_args(tyro.cli(rlhf_iif.Args, args=rlhf_flags(task, "--dtype", "bfloat16")))
        p64, ref, tok = rlhf_policy(args64, trained)
        p16 = rlhf_policy(args16, None)[0]
        copy_trained(p64, p16)  # one policy (LoRA's initial draw depends on the dtype loaded)
        p64.to(torch.float64)
        cpu = torch.device("cpu")
        rm = rlhf_iif.make_reward_fn(*rlhf_iif.load_classifier("--reward-model", args64.reward_model, "--reward-label",
                                                               "nothate", cpu), cpu)
        prompts = rlhf_iif.load_prompts(args64, tok)[0]
        for i in range(buffers):
            torch.manual_seed(100 + i)
            b = rlhf_iif.episodes(p64, ref, prompts[64 * i:64 * (i + 1)], 0.2, rm, tok, args64, torch.device("cpu"))
            out.append(("rlhf_iif.py", state, 64, *agreement(rlhf_iif.influence(p64, b, b, args64),
                                                            rlhf_iif.influence(p16, b, b, args16))))
    return out


def grpo_flags(task, *extra):  # results/grpo_toy.sh's settings
    return ["--model-name", f"{task}/policy", "--reward-model", f"{task}/reward", "--dataset", f"{task}/prompts.jsonl",
            "--num-generations", "8", "--batch-size", "64", "--mini-batch-size", "16", "--learning-rate", "3e-4",
            "--beta", "0.2", "--use-cpu", "--logging-steps", "1000", *extra]


def grpo_rows(task, rounds, buffers, tmp):
    out = []
    flags = grpo_flags(task, "--runs-dir", tmp, "--filter-method", "influence")
    trained = grpo_iif.main(grpo_iif.resolve_args(tyro.cli(grpo_iif.Args, args=[
        *flags, "--run-name", "grpo", "--max-steps", str(4 * rounds)])))  # float32 IIF training
    weights = {n: p.detach().clone() for n, p in trained.accelerator.unwrap_model(trained.model).named_parameters()
               if p.requires_grad}
    for state in ("initial policy", f"after {rounds} rounds"):
        trainers = {}
        for dtype in (torch.float64, "bfloat16"):
            args = grpo_iif.resolve_args(tyro.cli(grpo_iif.Args, args=[
                *grpo_flags(task, "--runs-dir", tmp, "--filter-method", "none"),
                *(["--dtype", "bfloat16"] if dtype == "bfloat16" else [])]))
            tr = grpo_iif.make_trainer(args, dtype=torch.float64 if dtype == torch.float64 else None)
            tr.model.train()
            tr.current_gradient_accumulation_steps = 1
            trainers[dtype] = (tr, args)
        (t64, a64), (t16, a16) = trainers[torch.float64], trainers["bfloat16"]
        m64, m16 = (t.accelerator.unwrap_model(t.model) for t in (t64, t16))
        if state == "initial policy":
            copy_trained(m64, m16)  # one policy (LoRA's initial draw depends on the dtype loaded)
        else:
            with torch.no_grad():
                for m in (m64, m16):
                    for n, p in m.named_parameters():
                        if p.requires_grad:
                            p.copy_(weights[n])
        for i in range(buffers):
            torch.manual_seed(100 + i)
            b = t64._generate_and_score_completions([{"prompt": p} for p in t64.train_dataset["prompt"][8 * i:8 * i + 8]
                                                     for _ in range(8)])
            out.append(("grpo_iif.py", state, 64, *agreement(
                grpo_iif.influence(m64, b, b, a64), grpo_iif.influence(m16, b, b, a16))))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="results/rlhf_toy_task")
    ap.add_argument("--rounds", type=int, default=10, help="float32 IIF rounds (generation batches) before the second state")
    ap.add_argument("--buffers", type=int, default=4, help="buffers scored at each state")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    t_start = time.perf_counter()
    torch.set_num_threads(a.threads)
    tmp = tempfile.mkdtemp(prefix="bf16_scores_")
    rows = rlhf_rows(a.task, a.rounds, a.buffers, tmp) + grpo_rows(a.task, a.rounds, a.buffers, tmp)
    print(f"bfloat16 against float64 influence scores on the toy task ({a.task}), one policy, the same buffers; "
          f"{a.buffers} buffers of 64 records at each state; mean [lowest] over the buffers\n")
    print("| script | policy | Spearman | same fate | kept (float64) |\n|---|---|---|---|---|")
    for script in ("rlhf_iif.py", "grpo_iif.py"):
        for state in ("initial policy", f"after {a.rounds} rounds"):
            r = [row[3:] for row in rows if row[0] == script and row[1] == state]
            rho, same, kept = (np.array(x) for x in zip(*r))
            print(f"| {script} | {state} | {rho.mean():.4f} [{rho.min():.4f}] | {same.mean():.1%} [{same.min():.1%}] | "
                  f"{kept.mean():.0%} |")
    print(f"\n{time.perf_counter() - t_start:.0f} s in all (wall clock, this command)")


if __name__ == "__main__":
    main()
