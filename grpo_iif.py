r"""GRPO with Iterative Influence-based Filtering (IIF), on TRL's GRPOTrainer, in one file.

The detoxification setup of rlhf_iif.py, trained with GRPO instead of PPO: a causal LM continues
toxic prompts, a hate-speech classifier's label logit on the continuation is the reward, and each
prompt gets --num-generations completions whose advantages are their rewards normalised within the
group. A record is one completion; the buffer is one generation batch. For every generation batch,
IIFGRPOTrainer scores each completion by its influence on a target f at the current parameters,
drops the harmful ones, and hands the rest to TRL's ordinary GRPO update (Alg. 1 of the paper, GRPO
as the learner). Test toxicity is measured as in rlhf_iif.py. The same hook runs the cheap filters
that GRPO users apply instead (--filter-method zero-variance: DAPO; max-variance: PODS;
abs-advantage: CPPO), and --reward-fn exact-answer swaps the classifier for an exact checker on a
verifiable task (GSM8K's fields; the test metric is then the accuracy on held-out questions).

The paper's setup (gpt-neo-2.7B, hub models and data sets, GPUs):

    python grpo_iif.py --filter-method influence
    accelerate launch grpo_iif.py --filter-method influence   # several GPUs or nodes, unchanged

Offline on a CPU, the toy task of results/grpo_toy.sh (built once, about 3 minutes):

    python benchmarks/rlhf_toy_task.py --out results/rlhf_toy_task
    T=results/rlhf_toy_task
    python grpo_iif.py --model-name $T/policy --reward-model $T/reward --dataset $T/prompts.jsonl \
        --eval-dataset $T/wiki_toxic.jsonl --eval-reward-model $T/eval_reward --eval-samples 200 \
        --num-generations 8 --batch-size 64 --mini-batch-size 16 --learning-rate 3e-4 --beta 0.2 \
        --max-steps 240 --validation-size 8 --use-cpu --threads 1 --logging-steps 100 \
        --filter-method influence --runs-dir results/runs --run-name grpo-toy__influence__1

Several processes (accelerate launch: DDP, FSDP2 with configs/fsdp2.yaml, DeepSpeed) each generate
and score their share of the generation batch. With LoRA the scores come from the adapted layers'
inputs and output gradients, never from the parameters, so they are exact when FSDP or ZeRO-3
shards those; the processes add up the target gradient (one all-reduce, LoRA-sized) and gather the
scores, so the filter ranks the whole generation batch at once, as on one process:

    accelerate launch --config_file configs/fsdp2.yaml grpo_iif.py --filter-method influence

The dropped completions are taken out of the tensors of the update, which therefore costs about
the kept fraction of its time; TRL's optimizer steps per generation batch and loss normaliser are
unchanged. TRL's trackers (--report-to) and checkpoints (--save-steps, --resume-from-checkpoint)
work as in any TRL run.
"""
import copy
import csv
import json
import os
import re
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Literal, Optional

import numpy as np
import torch
import torch.autograd.forward_ad as fwAD
import tyro
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel

@dataclass
class Args:
    model_name: str = "EleutherAI/gpt-neo-2.7B"
    """policy: a causal LM on the hub or a local folder (the KL reference is its initial state)"""
    reward_model: str = "facebook/roberta-hate-speech-dynabench-r4-target"
    """classifier whose --reward-label logit on the completion alone is the reward"""
    reward_label: str = "nothate"
    """label of --reward-model whose raw logit is the reward"""
    reward_fn: Literal["classifier", "exact-answer"] = "classifier"
    """classifier: the detoxification task (--reward-model's label logit; test toxicity);
    exact-answer: a verifiable task (reward 1 when the completion's last number is the answer, else
    0; test accuracy): --dataset and --eval-dataset have GSM8K's question and answer fields"""
    dataset: str = "allenai/real-toxicity-prompts"
    """prompts: a hub dataset or a local .json/.jsonl file with real-toxicity-prompts' fields
    (prompt.text, prompt.toxicity, continuation.text), or with --reward-fn exact-answer GSM8K's
    (question; answer, the reference after its last '####' if it has one)"""
    dataset_config: Optional[str] = None
    """the hub configuration of --dataset and --eval-dataset (openai/gsm8k: main)"""
    chat: bool = False
    """with --reward-fn exact-answer: each question is a user message in the tokenizer's chat
    template (instruct models)"""
    seed: int = 1
    """seed of TRL (sampling, prompt order), the prompt split and the random filter"""
    run_name: Optional[str] = None
    """results go to <runs-dir>/<run-name>/ (default: grpo__method__seed__time)"""
    runs_dir: str = "runs"
    """parent folder of the run folders"""
    use_cpu: bool = False
    """train on the CPU even where a GPU is visible"""
    dtype: Optional[Literal["bfloat16", "float32"]] = None
    """bfloat16: TRL's bf16 mixed precision (autocast), the frozen weights in bfloat16 with LoRA
    (what trains stays float32), and the influence's passes under autocast too, its scores in
    float32; float32: no autocast (default: bfloat16 on a GPU that supports it, as TRL's
    GRPOConfig; float32 on the CPU)"""
    threads: Optional[int] = None
    """torch CPU threads (default: torch's choice)"""
    report_to: str = "none"
    """TRL's report_to: where its logs also go (tensorboard, trackio, wandb, ...; comma-separated;
    all; none)"""
    output_dir: Optional[str] = None
    """TRL's output_dir: checkpoints and the trackers' files (default: the run folder)"""
    save_steps: int = 0
    """save a checkpoint (adapter or model, optimizer, random states) every N optimizer steps, a
    multiple of the optimizer steps per generation batch (0: never)"""
    resume_from_checkpoint: Optional[str] = None
    """continue a run from a checkpoint folder, or from the newest one under --output-dir ("last");
    the other flags as in the run that made it. metrics.csv keeps its rows up to the checkpoint"""

    # data (App. B.3, as rlhf_iif.py)
    min_prompt_toxicity: float = 0.3
    """keep prompts whose toxicity score is above this"""
    prompt_min_tokens: int = 10
    """a prompt is the first L tokens of prompt + continuation text, L uniform in [min, max]"""
    prompt_max_tokens: int = 15
    """see --prompt-min-tokens"""
    gen_tokens: int = 30
    """tokens sampled per completion, fewer if EOS comes first (temperature 1, no top-k/top-p)"""
    held_out_fraction: float = 0.2
    """prompts held out of training; --target-data validation draws from them"""

    # GRPO (TRL's GRPOConfig; its "dapo" loss, whose token normaliser spans the generation batch)
    num_generations: int = 8
    """completions per prompt: one group, whose rewards are normalised together"""
    batch_size: int = 256
    """completions per generation batch over all processes: the buffer B(k)"""
    mini_batch_size: int = 16
    """completions per forward/backward pass on each process (TRL's per_device_train_batch_size)"""
    gradient_accumulation_steps: int = 1
    """mini-batches per optimizer step"""
    num_iterations: int = 1
    """passes over each (filtered) generation batch (TRL's num_iterations, GRPO's mu)"""
    max_steps: Optional[int] = None
    """optimizer steps (default: one pass over the training prompts)"""
    learning_rate: float = 1e-5
    """AdamW learning rate (constant)"""
    beta: float = 0.04
    """coefficient of the KL penalty to the reference (TRL's default is 0: no reference)"""
    epsilon: float = 0.2
    """clipping epsilon of the policy ratio"""
    lora: bool = True
    """train LoRA adapters instead of the whole model; the reference is the model with its adapters
    disabled"""
    lora_r: int = 16
    """LoRA rank"""
    lora_alpha: int = 32
    """LoRA alpha"""
    lora_target_modules: Optional[str] = None
    """comma-separated module names for LoRA (default: peft's choice for the architecture)"""
    logging_steps: int = 1
    """TRL logs every N optimizer steps"""

    # influence and filtering (Sec. 3.1, 5.1, 5.3)
    filter_method: Literal["influence", "random", "zero-variance", "max-variance", "abs-advantage",
                           "none"] = "influence"
    """influence: IIF; random: drop as many completions as IIF would, uniformly at random;
    zero-variance: drop the groups whose rewards are all equal (DAPO's dynamic sampling, without
    its regeneration: the batch shrinks); max-variance: keep the --keep-fraction of each group with
    the largest reward variance (PODS); abs-advantage: keep the --keep-fraction of each group with
    the largest |advantage| (CPPO); none: plain GRPO"""
    filter_p: Optional[float] = None
    """fraction in (0, 1] of the negative-influence completions to drop, most negative first
    (default: drop every completion with influence <= 0, as the released code does)"""
    keep_fraction: Optional[float] = None
    """max-variance and abs-advantage: the fraction of each group to keep, round(fraction x
    --num-generations) completions"""
    target: Literal["f_seq", "f_loss"] = "f_seq"
    """target function: f_seq (Sec. 5.3: mean of log pi(y|x) times the completion's advantage) or
    f_loss (minus the GRPO loss, KL penalty included: the objective the update itself follows)"""
    target_data: Literal["buffer", "validation"] = "buffer"
    """completions f is measured on: the generation batch itself, or fresh completions of
    --validation-size held-out prompts (I-PPO, "Learning from the Right Rollouts", 2026)"""
    validation_size: int = 32
    """held-out prompts (each with --num-generations completions) for --target-data validation"""
    forward_batch_size: Optional[int] = None
    """completions per target-gradient and influence pass (default: 64 on a GPU, where batching
    pays, 16 on the CPU)"""

    # evaluation (App. B.3, as rlhf_iif.py)
    eval_every: int = 1
    """measure test toxicity (or accuracy) after the update of every N-th generation batch, and of
    the last (0: never)"""
    eval_dataset: str = "OxAISH-AL-LLM/wiki_toxic"
    """test prompts: toxic comments (label 1) of this dataset, a hub name or a local .json/.jsonl;
    with --reward-fn exact-answer, its first --eval-samples questions (GSM8K's fields)"""
    eval_split: str = "test"
    """split of --eval-dataset"""
    eval_samples: int = 400
    """test prompts"""
    eval_max_prompt_tokens: int = 256
    """a test prompt is the whole comment, cut to its last N tokens"""
    eval_reward_model: str = "DaNLP/da-electra-hatespeech-detection"
    """a second toxicity classifier; the test toxicity is its mean --eval-toxic-label probability"""
    eval_toxic_label: str = "offensive"
    """label of --eval-reward-model that means toxic"""


# ---- The reward, and a completion's log-probabilities and GRPO loss (TRL's) ----
def make_reward_fn(rm):
    """The reward of a completion: the classifier's label logit on the completion alone"""
    model, tok, label = rm

    def label_logit(prompts, completions, **kwargs):  # TRL logs it as rewards/label_logit/mean
        return classify(model, tok, completions)[:, label].tolist()
    return label_logit


def last_number(text):
    """The last number in text, thousands commas dropped, or None"""
    numbers = re.findall(r"-?\d+(?:\.\d+)?", text.replace(",", ""))
    return float(numbers[-1]) if numbers else None


def is_right(completion, answer):
    """The exact checker: the completion's last number equals the reference answer (the number after
    the last '####' of GSM8K's answer field, or the field's number)"""
    got = last_number(completion)
    return got is not None and got == last_number(answer.split("####")[-1])


def exact_answer(prompts, completions, answer, **kwargs):  # TRL logs it as rewards/exact_answer/mean
    """The reward of --reward-fn exact-answer: 1.0 for a right answer, 0.0 otherwise"""
    return [float(is_right(c if isinstance(c, str) else c[-1]["content"], a))
            for c, a in zip(completions, answer)]


@torch.no_grad()
def classify(model, tok, texts, bs=64):
    device = next(model.parameters()).device
    return torch.cat([model(**tok(texts[i:i + bs], padding=True, truncation=True,
                                  return_tensors="pt").to(device)).logits.float()
                      for i in range(0, len(texts), bs)])


def batches(n, size):
    return [torch.arange(i, min(i + size, n)) for i in range(0, n, size)]


def completion_logprobs(model, b, idx, params=None, bf16=False):
    """log pi_theta(y_t | x, y_<t) of every completion token of rows idx, as TRL's forward computes
    them (left-padded prompt, right-padded completion, no position ids; temperature 1); with bf16,
    the model's pass under autocast, as TRL's own under --dtype bfloat16; float32 at least"""
    m = b["completion_mask"][idx]
    ids = torch.cat([b["prompt_ids"][idx], b["completion_ids"][idx]], 1)
    kw = dict(input_ids=ids, attention_mask=torch.cat([b["prompt_mask"][idx], m], 1),
              logits_to_keep=m.shape[1] + 1)
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = (model(**kw) if params is None else functional_call(model, params, (), kw)).logits
    logits = up(logits[:, :-1])
    return torch.log_softmax(logits, -1).gather(-1, ids[:, -m.shape[1]:, None]).squeeze(-1)


def completion_losses(model, b, idx, args, params=None, logp=None):
    """Per-completion GRPO loss l_i (TRL's "dapo" loss): the token sum of the clipped surrogate and
    of beta x the k3 estimate of KL(pi || pi_ref) times the ratio (TRL's importance-sampling
    correction), over the generation batch's token count. Their sum over a generation batch is the
    loss of one step on all of it. logp: these completions' log-probs, if already computed."""
    if logp is None:
        logp = completion_logprobs(model, b, idx, params, args.dtype == "bfloat16")
    m = b["completion_mask"][idx]
    old = b["old_per_token_logps"][idx] if "old_per_token_logps" in b else logp.detach()
    ratio, adv = torch.exp(logp - old), b["advantages"][idx, None]
    loss = -torch.min(ratio * adv, ratio.clamp(1 - args.epsilon, 1 + args.epsilon) * adv)
    if args.beta != 0.0:
        d = b["ref_per_token_logps"][idx] - logp
        loss = loss + args.beta * (torch.exp(d) - d - 1) * ratio
    return (loss * m).sum(1) / b["num_items_in_batch"].clamp(min=1)


# ---- Stage II of Alg. 1: the target, the influence of every completion, the filter ----
def target(model, t, idx, args, world=1, logp=None):
    """f restricted to target completions idx of this process; summed over every batch of t, and
    over the world processes' shares, it is f(theta) on the whole target set. logp: these
    completions' log-probs, if already computed."""
    if logp is None:
        logp = completion_logprobs(model, t, idx, bf16=args.dtype == "bfloat16")
    if args.target == "f_seq":  # Sec. 5.3: mean over completions of log pi(y|x) A_hat
        return ((t["advantages"][idx, None] * logp * t["completion_mask"][idx]).sum()
                / (len(t["advantages"]) * world))
    return -completion_losses(model, t, idx, args, logp=logp).sum()  # f_loss: minus the GRPO loss


def influence(model, b, t, args, world=1, all_sum=lambda g: g):
    """I_i = <grad f(theta), -grad l_i(theta)> of every completion i of b at theta(k) (Sec. 3.1,
    5.1), exactly: one backward pass over the target completions t gives grad f (all_sum adds the
    processes' shares), one forward-mode pass along it gives every completion's inner product.
    For any trained parameters; needs whole ones on every process (one process, or DDP)."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    grads = [torch.zeros_like(p) for p in params.values()]
    for idx in batches(len(t["advantages"]), args.forward_batch_size):
        g = torch.autograd.grad(target(model, t, idx, args, world), list(params.values()),
                                allow_unused=True)
        grads = [a if gi is None else a + gi for a, gi in zip(grads, g)]
    flat = all_sum(torch.cat([g.flatten() for g in grads]))
    grads = flat.split([p.numel() for p in params.values()])
    # torch.autograd.forward_ad, not torch.func.jvp as in iif.py: on these language models (LoRA,
    # CPU) jvp took 10-20 % longer for the same scores. Fused attention kernels have no
    # forward-mode AD, the math one does.
    scores = []
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), fwAD.dual_level():
        duals = {n: fwAD.make_dual(p.detach(), g.view_as(p))
                 for (n, p), g in zip(params.items(), grads)}
        for idx in batches(len(b["advantages"]), args.forward_batch_size):
            scores.append(-fwAD.unpack_dual(completion_losses(model, b, idx, args, duals)).tangent)
    return torch.cat(scores)


def trained_linears(model):
    """The nn.Linear layers whose weight is trained (LoRA's A and B matrices), or None where other
    parameters are trained too (a bias, embeddings, norms: the whole model)"""
    layers = [m for m in model.modules()
              if isinstance(m, torch.nn.Linear) and m.weight.requires_grad]
    n_trained = sum(1 for p in model.parameters() if p.requires_grad)
    return layers if layers and n_trained == len(layers) else None


def with_linear_io(layers, fn):
    """fn()'s value, and every layer's (input, output) in the forward pass that fn makes"""
    io = [None] * len(layers)

    def hook(i):
        def record(module, inputs, output):
            if io[i] is not None:
                raise RuntimeError(f"{module} ran twice in one forward pass")
            io[i] = (inputs[0].detach(), output)
        return record
    handles = [m.register_forward_hook(hook(i)) for i, m in enumerate(layers)]
    try:
        value = fn()
    finally:
        for h in handles:
            h.remove()
    return value, io


def up(x):
    """x in float32 at least (bfloat16 activations under mixed precision)"""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def influence_activations(model, b, t, args, world=1, all_sum=lambda g: g):
    """The scores of influence(), computed from activations. A linear layer y = W x gets, from one
    completion, the gradient sum_t dy_t x_t^T (x its inputs, dy the gradients at its outputs, over
    the completion's tokens), so <G, grad_W l_i> = sum_t dy_t^T G x_t. No parameter or parameter
    gradient is read, so sharded parameters (FSDP, DeepSpeed ZeRO-3) give the same scores as whole
    ones; the processes exchange only G = grad f (LoRA-sized). Needs every trained parameter to be
    the weight of an nn.Linear (LoRA), and completions that do not interact in the forward pass.
    Target on the generation batch: one forward pass and one backward pass of the losses (row i of
    dy is the gradient of l_i alone) give every completion's LoRA gradient g_i, kept until G is
    complete. With beta = 0 (TRL's default), or the target f_loss, G is a sum of multiples of the
    g_i at theta(k), where the ratio is 1 (to rounding, where TRL recomputes the old log-probs): no
    other pass. Otherwise a second backward pass, for f, gives G. With a validation target, or
    gradients too large to keep: a pass over t for G, then one over b."""
    layers = trained_linears(model)
    bf16 = args.dtype == "bfloat16"
    n_bytes = 4 * len(b["advantages"]) * sum(m.weight.numel() for m in layers)
    one_pass = t is b and n_bytes <= memory_for_grads(b["advantages"].device)
    proportional = one_pass and (args.beta == 0.0 or args.target == "f_loss")
    G = [0.0] * len(layers)

    def add_to_G(G, io, dys):  # G += sum over the batch's tokens of dy x^T, in float32
        return [g + torch.einsum("...o,...i->oi", up(dy), up(x))
                for g, (x, _), dy in zip(G, io, dys)]

    def reduce(G):  # every process's share added up
        flat = all_sum(torch.cat([g.flatten() for g in G]))
        return [g.view_as(h) for g, h in zip(flat.split([h.numel() for h in G]), G)]
    if not one_pass:
        for idx in batches(len(t["advantages"]), args.forward_batch_size):
            f, io = with_linear_io(layers, lambda: target(model, t, idx, args, world))
            G = add_to_G(G, io, grad(f, io))
        G = reduce(G)
    scores, grads = [], []
    for idx in batches(len(b["advantages"]), args.forward_batch_size):
        logp, io = with_linear_io(layers, lambda: completion_logprobs(model, b, idx, bf16=bf16))
        losses = completion_losses(model, b, idx, args, logp=logp)
        dys = grad(losses.sum(), io, retain=one_pass and not proportional)
        if not one_pass:
            scores.append(-sum(((up(dy) @ g) * up(x)).flatten(1).sum(1)
                               for g, (x, _), dy in zip(G, io, dys)))
            continue
        grads.append([torch.einsum("b...o,b...i->boi", up(dy), up(x))
                      for (x, _), dy in zip(io, dys)])
        if not proportional:  # f's share of G, from the same forward pass
            G = add_to_G(G, io, grad(target(model, b, idx, args, world, logp=logp), io))
    if one_pass:
        if proportional:
            # at theta(k): grad f_seq_i = -(tokens of the generation batch / (n x processes))
            # grad l_i when beta = 0, and f_loss = -sum_i l_i
            c = -1.0 if args.target == "f_loss" else -float(b["num_items_in_batch"]) / (
                len(b["advantages"]) * world)
            G = [c * sum(gs[j].sum(0) for gs in grads) for j in range(len(layers))]
        G = reduce(G)
        scores = [-sum((g * gi).flatten(1).sum(1) for g, gi in zip(G, gs)) for gs in grads]
    return torch.cat(scores)


def grad(y, io, retain=False):
    """d y / d (every layer's output)"""
    return torch.autograd.grad(y, [out for _, out in io], retain_graph=retain,
                               materialize_grads=True)


def memory_for_grads(device):
    """Bytes that the one-pass influence may keep in per-completion LoRA gradients: an eighth of
    the device's memory (Qwen2.5-0.5B's q/v adapters at rank 16 hold 1.1 M numbers a completion,
    0.55 GB for 128 completions)"""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory // 8
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 8


def filter_records(scores, method, p, gen):
    """Stage II of Alg. 1: returns the kept mask, on the scores' device. 'influence' drops every
    completion with influence <= 0 (p None), or the floor(p x n_negative) most negative ones,
    ties broken by buffer order; 'random' drops as many uniformly at random."""
    kept = torch.ones(len(scores), dtype=torch.bool, device=scores.device)
    if p is None:
        n_drop = int((scores <= 0).sum())
    else:
        n_drop = int(p * int((scores < 0).sum()) + 1e-9)
    if method == "influence":
        order = torch.argsort(scores, stable=True)
    else:
        order = torch.randperm(len(scores), generator=gen).to(scores.device)
    kept[order[:n_drop]] = False
    return kept


# The cheap filters GRPO users apply, on rewards and advantages alone (groups of G consecutive
# completions, as TRL orders them). Like IIF they only drop: the kept completions keep the
# advantages TRL computed over their whole group.
def zero_variance(rewards, G):
    """DAPO's dynamic sampling (Yu et al. 2025; verl's algorithm.filter_groups): drop every group
    whose rewards are all equal. DAPO then generates more groups to refill the batch; here the batch
    shrinks instead."""
    groups = rewards.view(-1, G)
    return (groups != groups[:, :1]).any(1).repeat_interleave(G)


def max_variance(rewards, G, m):
    """PODS's max-variance down-sampling (Xu et al. 2025): keep the m completions of each group whose
    rewards have the largest variance. For rewards in ascending order that subset is the i largest
    and the m - i smallest for some i (their Lemma), so the m + 1 candidates are compared exactly;
    ties go to the smallest i."""
    kept = torch.zeros(len(rewards), dtype=torch.bool, device=rewards.device)
    for g, r in enumerate(rewards.double().view(-1, G)):
        up_order = torch.argsort(r, stable=True)
        candidates = [torch.cat([up_order[:m - i], up_order[G - i:]]) for i in range(m + 1)]
        kept[g * G + max(candidates, key=lambda c: r[c].var(unbiased=False))] = True
    return kept


def abs_advantage(advantages, G, m):
    """CPPO's completion pruning (Lin et al. 2025): keep the m completions of each group with the
    largest |advantage|, dropping those with the smallest; ties go to the earlier completion."""
    top = torch.argsort(advantages.abs().view(-1, G), dim=1, descending=True, stable=True)[:, :m]
    return torch.zeros(len(top), G, dtype=torch.bool, device=top.device).scatter_(1, top,
                                                                                   True).flatten()


def kept_per_group(args):
    """m of max-variance and abs-advantage: round(--keep-fraction x --num-generations), at least 1"""
    return max(1, round(args.keep_fraction * args.num_generations))


def score_and_filter(trainer, b):
    """Stage II of Alg. 1 on one generation batch: every process scores its share at theta(k), the
    scores of the whole batch are gathered (in process order) and filtered. Returns the kept mask
    and the gathered scores (None without influence: --filter-method none keeps every completion,
    the cheap filters decide from the gathered rewards or advantages)."""
    args, acc = trainer.iif_args, trainer.accelerator
    G = args.num_generations
    if args.filter_method == "none":
        return torch.ones(len(trainer.rewards), dtype=torch.bool), None
    if args.filter_method == "zero-variance":
        return zero_variance(trainer.rewards[:, 0].cpu(), G), None
    if args.filter_method == "max-variance":
        return max_variance(trainer.rewards[:, 0].cpu(), G, kept_per_group(args)), None
    if args.filter_method == "abs-advantage":
        return abs_advantage(acc.gather(b["advantages"]).cpu(), G, kept_per_group(args)), None
    t = b if args.target_data == "buffer" else trainer.validation_batch()
    model = acc.unwrap_model(trainer.model)
    score = influence_activations if trained_linears(model) else influence
    scores = score(model, b, t, args, world=acc.num_processes,
                   all_sum=lambda g: acc.reduce(g, reduction="sum"))
    all_scores = acc.gather(scores).cpu()
    if not torch.isfinite(all_scores).all():
        fail(f"generation batch {trainer.n_rounds}: non-finite influence; lower --learning-rate")
    kept = filter_records(all_scores, args.filter_method, args.filter_p, trainer.iif_gen)
    return kept, all_scores


def keep_only(trainer, b, kept):
    """This process's share of the generation batch with the dropped completions taken out, so that
    TRL's update passes do not compute them. TRL still splits it into its steps_per_generation
    micro-batches, so the optimizer steps per generation batch are unchanged, and its loss
    normaliser counts the kept tokens of every process. Every process keeps as many rows as the one
    with most kept completions, rounded up to whole micro-batches, so all make the same passes
    together (DDP, FSDP); the rows added to reach that count are dropped completions with their mask
    zeroed, which leaves the loss, as TRL's mask_truncated_completions does."""
    acc = trainer.accelerator
    per_process = kept.view(acc.num_processes, -1)  # the same on every process
    mine = per_process[acc.process_index]
    k = trainer.args.steps_per_generation
    n_rows = max(1, -(-int(per_process.sum(1).max()) // k)) * k
    rows = torch.argsort((~mine).int(), stable=True)[:n_rows]  # the kept ones first
    b = take_rows(b, rows.to(b["advantages"].device))
    b["completion_mask"] = b["completion_mask"] * mine[rows, None].to(b["completion_mask"])
    b["num_items_in_batch"] = acc.gather(b["completion_mask"].sum()).sum()
    return b


# ---- Alg. 1 on TRL's GRPOTrainer: Stage I (generation) and III (the update) are TRL's ----
def make_trainer_class():
    from accelerate.utils import DistributedType
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
    from trl import GRPOTrainer

    class IIFGRPOTrainer(GRPOTrainer):
        """GRPOTrainer that filters every generation batch before its update. TRL calls
        _generate_and_score_completions once per generation batch, before the num_iterations passes
        over it; the kept completions are what every pass trains on."""

        def __init__(self, *a, iif_args, validation_rows=(), evaluation=None, **kw):
            super().__init__(*a, **kw)
            self.iif_args = iif_args
            self.validation_rows = list(validation_rows)  # {"prompt": ...} (and "answer")
            # (the test classifier or None, the test prompts, their answers or None), or None
            self.evaluation = evaluation
            self.writer = None  # (csv.DictWriter, its file) on the main process, set by main
            self.iif_gen = torch.Generator().manual_seed(iif_args.seed)  # same on every process
            # FSDP and DeepSpeed may shard the parameters
            self.sharded = self.accelerator.distributed_type in (DistributedType.FSDP,
                                                                 DistributedType.DEEPSPEED)
            self.t_gen = 0.0  # generation and reward time of the current generation batch
            self.rewards = None  # its rewards, every process's
            self.row = None  # its metrics.csv row, written once its update is over
            self.t_stage2_end = 0.0  # when Stage II ended: the update's time runs from there
            self.n_rounds = 0

        def _generate(self, prompts):
            t0 = timer()
            out = super()._generate(prompts)
            self.t_gen += timer() - t0
            return out

        def _calculate_rewards(self, *a, **kw):
            t0 = timer()
            self.rewards = super()._calculate_rewards(*a, **kw)  # every process's, gathered
            self.t_gen += timer() - t0
            return self.rewards

        def _generate_and_score_completions(self, inputs):
            if not self.model.training:
                return super()._generate_and_score_completions(inputs)
            write_row(self)  # the previous generation batch's update is over

            # Stage I (Alg. 1): generation batch B(k) at theta(k): completions, rewards, advantages
            t0 = timer()
            self.t_gen = 0.0
            b = super()._generate_and_score_completions(inputs)
            t_generate = self.t_gen
            t_forward = timer() - t0 - self.t_gen
            rewards = self.rewards[:, 0]

            # Stage II (Alg. 1): score completions at theta(k) (Sec. 5.1, 5.3), drop harmful ones
            t0 = timer()
            kept, scores = score_and_filter(self, b)
            if self.iif_args.filter_method != "none":
                b = keep_only(self, b, kept)
            n_kept = int(kept.sum())
            self._metrics["train"]["iif/kept_fraction"].append(n_kept / len(kept))
            self.row = dict(round=self.n_rounds, step=self.state.global_step,
                            completions=len(rewards), reward_mean=rewards.nanmean().item(),
                            reward_std=rewards.std().item(), n_kept=n_kept,
                            n_negative="" if scores is None else int((scores < 0).sum()),
                            t_generate=t_generate, t_forward=t_forward, t_influence=timer() - t0)
            self.n_rounds += 1
            self.t_stage2_end = timer()
            # Stage III (Alg. 1) follows in TRL's training steps, on the kept completions of b
            return b

        def validation_batch(self):
            """Fresh completions (with rewards, advantages, reference log-probs) of the held-out
            prompts, this process's share; kept out of TRL's logs"""
            G = self.num_generations
            acc = self.accelerator
            rows = [row for row in self.validation_rows for _ in range(G)]
            n = len(rows) // acc.num_processes
            saved = (self._metrics["train"], self._logs, self.state.num_input_tokens_seen,
                     self.rewards)
            # scratch logs, dropped afterwards
            self._metrics["train"] = defaultdict(list)
            self._logs = copy.deepcopy(self._logs)
            try:
                return super()._generate_and_score_completions(rows[acc.process_index * n:][:n])
            finally:
                (self._metrics["train"], self._logs, self.state.num_input_tokens_seen,
                 self.rewards) = saved

        def _save_checkpoint(self, model, trial):
            """TRL's checkpoint (at the end of a generation batch's update, see --save-steps), after
            that batch's metrics.csv row, with the random filter's generator"""
            write_row(self, last=self.state.global_step >= self.state.max_steps)
            super()._save_checkpoint(model, trial)
            folder = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            if self.args.should_save:
                torch.save({"iif_gen": self.iif_gen.get_state(), "n_rounds": self.n_rounds},
                           os.path.join(self._get_output_dir(trial=trial), folder, "iif_state.pt"))

    return IIFGRPOTrainer


# ---- The test toxicity (App. B.3), or the test accuracy of a verifiable task ----
@torch.no_grad()
def sample_continuations(model, queries, tokenizer, args, bs=64, synced=False):
    """Continuations of the token-id queries, sampled from pi_theta itself as in training, bs
    prompts per generate() call; each is its text up to its first EOS. synced: every process keeps
    stepping until all have finished (sharded parameters are gathered at every step)"""
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id
    eos = tokenizer.eos_token_id
    texts = []
    for i in range(0, len(queries), bs):
        q = queries[i:i + bs]
        P = max(map(len, q))
        ids = torch.full((len(q), P), pad, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for j, x in enumerate(q):
            ids[j, P - len(x):] = torch.tensor(x)
            attn[j, P - len(x):] = 1
        # every knob a model's generation_config may set is neutralised here
        out = model.generate(input_ids=ids.to(device), attention_mask=attn.to(device),
                             do_sample=True, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                             typical_p=1.0, repetition_penalty=1.0, no_repeat_ngram_size=0,
                             max_new_tokens=args.gen_tokens, min_new_tokens=0, pad_token_id=pad,
                             eos_token_id=eos, synced_gpus=synced)[:, P:].cpu()
        is_eos = out == eos
        ends = torch.where(is_eos.any(1), is_eos.int().argmax(1), out.shape[1])
        texts += [tokenizer.decode(row[:n], skip_special_tokens=True)
                  for row, n in zip(out, ends.tolist())]
    return texts


def evaluate(model, queries, tokenizer, clf, args, rank=0, synced=False, answers=None):
    """App. B.3: the toxicity probability of a sampled continuation of each toxic test prompt; with
    answers (--reward-fn exact-answer) instead, 1.0 where the sampled answer is right and 0.0
    otherwise (a fixed seed for each process, and the training generator left untouched)"""
    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(args.seed + 10_000 + rank)
        texts = sample_continuations(model, queries, tokenizer, args, synced=synced)
    if answers is not None:
        return torch.tensor([float(is_right(t, a)) for t, a in zip(texts, answers)])
    clf_model, tok, toxic = clf
    return classify(clf_model, tok, texts).softmax(-1)[:, toxic]


def test_metric(trainer):
    """App. B.3's test toxicity, or with --reward-fn exact-answer the test accuracy (temperature 1
    samples, as in training). Every process samples an equal share of the test prompts (the last
    one repeated to even the shares out, and left out of the mean), with its own seed; the values
    are gathered."""
    acc = trainer.accelerator
    clf, queries, answers = trainer.evaluation
    n = -(-len(queries) // acc.num_processes)
    mine = (queries + queries[-1:] * n)[acc.process_index * n:][:n]
    if answers is not None:
        answers = (answers + answers[-1:] * n)[acc.process_index * n:][:n]
    p = evaluate(acc.unwrap_model(trainer.model), mine, trainer.processing_class, clf,
                 trainer.iif_args, rank=acc.process_index, synced=trainer.sharded, answers=answers)
    return acc.gather(p.to(acc.device))[:len(queries)].mean().item()


# ---- main: TRL's training loop, Alg. 1 in every generation batch ----
def main(args, dtype=None):
    if args.threads:
        torch.set_num_threads(args.threads)
    trainer = make_trainer(args, dtype)
    acc = trainer.accelerator
    run_dir = os.path.join(args.runs_dir, args.run_name)
    if args.resume_from_checkpoint:  # the generation batches done, the random filter's state
        state = torch.load(os.path.join(args.resume_from_checkpoint, "iif_state.pt"))
        trainer.n_rounds = state["n_rounds"]
        trainer.iif_gen.set_state(state["iif_gen"])
    acc.wait_for_everyone()  # every process has checked the run folder before it is written
    if acc.is_main_process:
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, "config.json"), "w") as f:
            json.dump(vars(args), f, indent=1)
        trainer.writer = open_metrics(run_dir, trainer.n_rounds)
    n_trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    if acc.is_main_process:
        resumed = f", after {trainer.n_rounds} generation batches" if trainer.n_rounds else ""
        print(f"{args.model_name} ({n_trainable:,} trainable parameters) on {acc.device} x "
              f"{acc.num_processes} ({acc.distributed_type.value}): generation batches of "
              f"{args.batch_size} completions ({args.num_generations} per prompt), filter "
              f"{args.filter_method}, target {args.target} on {args.target_data} -> "
              f"{run_dir}{resumed}", flush=True)
    try:
        # Stage III (Alg. 1) runs inside: TRL's GRPO steps, num_iterations passes per filtered batch
        trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
        write_row(trainer, last=True)
        trainer.save_model(os.path.join(run_dir, "policy"))  # the adapter only, with LoRA
    finally:  # also on Ctrl-C: every finished generation batch is in metrics.csv
        if trainer.writer is not None:
            trainer.writer[1].close()
    return trainer


# =================================================================================================
# Everything Alg. 1 needs stands above. Below, what a first reading may skip: loading the models
# and data with clear errors, the flag checks, TRL's config, and the run folder.
# =================================================================================================


# ---- Plumbing: loading the models and data ----
def fail(msg):
    raise SystemExit(f"grpo_iif.py: error: {msg}")


def load(flag, name, loader, *a, **kw):
    """Load a model, tokenizer or dataset; on any failure stop with the flag's name, before a file
    is written"""
    try:
        return loader(name, *a, **kw)
    except Exception as e:  # OSError, ValueError, hub and connection errors all end here
        fail(f"{flag} {name!r} could not be loaded ({type(e).__name__}: "
             f"{str(e).strip().splitlines()[0][:300]}). "
             "Without network access, download it on another machine and pass its local path.")


def load_rows(flag, name, split, config=None):
    from datasets import load_dataset
    if name.endswith((".json", ".jsonl")):
        return load(flag, name, lambda path: load_dataset("json", data_files=path, split="train"))
    return load(flag, name, load_dataset, *[config] if config else [], split=split)


def load_prompts(args, tokenizer):
    """App. B.3: prompts with toxicity > 0.3, each the first 10-15 tokens of its prompt +
    continuation text; split into training and held-out prompts. Returns TRL's rows, {"prompt": the
    prompt as text}."""
    rows = load_rows("--dataset", args.dataset, "train")
    if "prompt" not in rows.column_names:
        fail(f"--dataset {args.dataset!r} has no 'prompt' column (columns: {rows.column_names})")
    rng = np.random.default_rng(args.seed)
    prompts = []
    for row in rows:
        p = row["prompt"]
        c = row.get("continuation") or {}
        if p.get("toxicity") is None or p["toxicity"] <= args.min_prompt_toxicity:
            continue
        ids = tokenizer(p["text"] + (c.get("text") or ""))["input_ids"]
        n = int(rng.integers(args.prompt_min_tokens, args.prompt_max_tokens + 1))
        if len(ids) >= n:
            prompts.append({"prompt": tokenizer.decode(ids[:n])})
    return split_rows(args, prompts, rng, f"training prompts with toxicity > "
                      f"{args.min_prompt_toxicity} and >= {args.prompt_min_tokens} tokens")


def split_rows(args, rows, rng, what):
    """Training rows and --validation-size held-out ones (--held-out-fraction of the rows held out)"""
    order = rng.permutation(len(rows))
    n_held = int(args.held_out_fraction * len(rows))
    train = [rows[i] for i in order[n_held:]]
    held = [rows[i] for i in order[:n_held]]
    n_batch = args.batch_size // args.num_generations
    if len(train) < n_batch:
        fail(f"--dataset {args.dataset!r} has {len(train)} {what}, fewer than the {n_batch} of a "
             "generation batch (--batch-size / --num-generations)")
    if args.target_data == "validation" and len(held) < args.validation_size:
        fail(f"--validation-size {args.validation_size}: only {len(held)} held-out prompts "
             f"(--held-out-fraction {args.held_out_fraction})")
    return train, held[:args.validation_size]


def question_prompt(args, question):
    """TRL's prompt for a question: its text, or with --chat a user message (chat template)"""
    return [{"role": "user", "content": question}] if args.chat else question


def load_question_rows(flag, name, split, args):
    """--reward-fn exact-answer: a data set with GSM8K's question and answer columns"""
    rows = load_rows(flag, name, split, args.dataset_config)
    if not {"question", "answer"} <= set(rows.column_names):
        fail(f"{flag} {name!r} needs 'question' and 'answer' columns with --reward-fn exact-answer "
             f"(has {rows.column_names})")
    return rows


def load_questions(args):
    """--reward-fn exact-answer: GSM8K-style rows (question, answer) as TRL's rows {"prompt",
    "answer"} (TRL hands the answer column to the reward function); training and held-out rows"""
    rows = load_question_rows("--dataset", args.dataset, "train", args)
    rows = [{"prompt": question_prompt(args, r["question"]), "answer": r["answer"]} for r in rows]
    return split_rows(args, rows, np.random.default_rng(args.seed), "questions")


def load_eval_questions(args, tokenizer):
    """--reward-fn exact-answer: the first --eval-samples questions of --eval-dataset, tokenized as
    TRL tokenizes prompts (the chat template with --chat; the last --eval-max-prompt-tokens
    tokens), and their answers"""
    rows = load_question_rows("--eval-dataset", args.eval_dataset, args.eval_split, args)
    rows = rows.select(range(min(args.eval_samples, len(rows))))
    texts = [tokenizer.apply_chat_template(question_prompt(args, q), tokenize=False,
                                           add_generation_prompt=True) if args.chat else q
             for q in rows["question"]]
    queries = [tokenizer(t, add_special_tokens=False)["input_ids"][-args.eval_max_prompt_tokens:]
               for t in texts]
    return queries, list(rows["answer"])


def load_eval_prompts(args, tokenizer):
    rows = load_rows("--eval-dataset", args.eval_dataset, args.eval_split)
    if not {"comment_text", "label"} <= set(rows.column_names):
        fail(f"--eval-dataset {args.eval_dataset!r} needs 'comment_text' and 'label' columns "
             f"(has {rows.column_names})")
    texts = [r["comment_text"] for r in rows if r["label"] == 1][:args.eval_samples]
    if not texts:
        fail(f"--eval-dataset {args.eval_dataset!r} has no toxic (label 1) rows in split "
             f"{args.eval_split!r}")
    return [tokenizer(t)["input_ids"][-args.eval_max_prompt_tokens:] for t in texts]


def load_classifier(flag, name, label_flag, label):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    tok = load(flag, name, AutoTokenizer.from_pretrained)
    model = load(flag, name, AutoModelForSequenceClassification.from_pretrained).eval()
    labels = {v: int(k) for k, v in model.config.id2label.items()}
    if label not in labels:
        fail(f"{label_flag} {label!r} is not a label of {flag} {name!r}; its labels are "
             f"{sorted(labels)}")
    return model, tok, labels[label]


# ---- Plumbing: the flags, TRL's config and trainer, the run folder ----
def world_size():
    return int(os.environ.get("WORLD_SIZE", "1"))


def resolve_args(args):
    """Check every flag before anything is loaded; fail early with the flag's name."""
    gpu = torch.cuda.is_available() and not args.use_cpu
    if args.dtype is None:
        args.dtype = "bfloat16" if gpu and torch.cuda.is_bf16_supported() else "float32"
    if args.dtype == "bfloat16" and gpu and not torch.cuda.is_bf16_supported():
        fail(f"--dtype bfloat16: {torch.cuda.get_device_name()} has no bfloat16; use --dtype "
             "float32")
    if args.forward_batch_size is None:
        args.forward_batch_size = 64 if gpu else 16
    for key in ("batch_size", "mini_batch_size", "gradient_accumulation_steps",
                "num_iterations", "gen_tokens", "prompt_min_tokens", "validation_size",
                "forward_batch_size", "lora_r", "logging_steps", "eval_samples",
                "eval_max_prompt_tokens"):
        if getattr(args, key) < 1:
            fail(f"--{key.replace('_', '-')} must be at least 1, got {getattr(args, key)}")
    if args.num_generations < 2:
        fail(f"--num-generations must be at least 2 (GRPO normalises rewards within a group), "
             f"got {args.num_generations}")
    if args.batch_size % args.num_generations:
        fail(f"--batch-size ({args.batch_size}) must be a multiple of --num-generations "
             f"({args.num_generations})")
    if args.batch_size % (args.mini_batch_size * world_size()):
        fail(f"--batch-size ({args.batch_size}) must be a multiple of --mini-batch-size "
             f"({args.mini_batch_size}) x {world_size()} processes")
    n_validation = args.validation_size * args.num_generations
    if args.target_data == "validation" and n_validation % world_size():
        fail(f"--validation-size ({args.validation_size}) x --num-generations must be a multiple "
             f"of the {world_size()} processes")
    if args.prompt_max_tokens < args.prompt_min_tokens:
        fail(f"--prompt-max-tokens ({args.prompt_max_tokens}) must be at least --prompt-min-tokens "
             f"({args.prompt_min_tokens})")
    if args.max_steps is not None and args.max_steps < 1:
        fail(f"--max-steps must be at least 1, got {args.max_steps}")
    if args.eval_every < 0:
        fail(f"--eval-every must be 0 (never) or more, got {args.eval_every}")
    if args.filter_p is not None and not 0 < args.filter_p <= 1:
        fail(f"--filter-p must be in (0, 1], got {args.filter_p}")
    if args.filter_p is not None and args.filter_method not in ("influence", "random"):
        fail(f"--filter-p sets IIF's count of dropped completions; --filter-method "
             f"{args.filter_method} does not use it")
    needs_fraction = args.filter_method in ("max-variance", "abs-advantage")
    if needs_fraction and args.keep_fraction is None:
        fail(f"--filter-method {args.filter_method} keeps --keep-fraction of each group: set it "
             "(e.g. to IIF's mean kept fraction on the task, to compare them at matched fractions)")
    if args.keep_fraction is not None and not needs_fraction:
        fail(f"--keep-fraction is for --filter-method max-variance or abs-advantage, not "
             f"{args.filter_method}")
    if args.keep_fraction is not None and not 0 < args.keep_fraction <= 1:
        fail(f"--keep-fraction must be in (0, 1], got {args.keep_fraction}")
    if args.chat and args.reward_fn != "exact-answer":
        fail("--chat is for --reward-fn exact-answer (questions as chat messages)")
    if not 0 <= args.held_out_fraction < 1:
        fail(f"--held-out-fraction must be in [0, 1), got {args.held_out_fraction}")
    for key in ("learning_rate", "epsilon"):
        if not getattr(args, key) > 0:
            fail(f"--{key.replace('_', '-')} must be positive, got {getattr(args, key)}")
    if args.beta < 0:
        fail(f"--beta must be at least 0, got {args.beta}")
    # optimizer steps per generation batch, TRL's steps_per_generation x num_iterations
    micro_batches = args.batch_size // (args.mini_batch_size * world_size()) * args.num_iterations
    if args.save_steps < 0 or args.save_steps * args.gradient_accumulation_steps % micro_batches:
        fail(f"--save-steps ({args.save_steps}) must be 0 or a multiple of the optimizer steps per "
             f"generation batch (--batch-size / (--mini-batch-size x {world_size()} processes x "
             "--gradient-accumulation-steps) x --num-iterations), so that a checkpoint falls "
             "between generation batches")
    if args.report_to not in ("none", "all"):
        from transformers.integrations import get_available_reporting_integrations
        installed = get_available_reporting_integrations()
        missing = sorted(set(args.report_to.split(",")) - set(installed))
        if missing:
            fail(f"--report-to {args.report_to}: {', '.join(missing)} is not installed or not a "
                 f"tracker that transformers knows (installed: {', '.join(installed) or 'none'})")
    if args.run_name is None:
        args.run_name = f"grpo__{args.filter_method}__{args.seed}__{int(time.time())}"
    run_dir = os.path.join(args.runs_dir, args.run_name)
    if os.path.exists(os.path.join(run_dir, "metrics.csv")) and not args.resume_from_checkpoint:
        fail(f"{run_dir}/metrics.csv exists: choose another --run-name, remove it, or continue "
             "the run with --resume-from-checkpoint")
    args.output_dir = args.output_dir or run_dir
    if args.resume_from_checkpoint == "last":
        from transformers.trainer_utils import get_last_checkpoint
        last = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
        if last is None:
            fail(f"--resume-from-checkpoint last: no checkpoint-* folder in {args.output_dir}")
        args.resume_from_checkpoint = last
    if args.resume_from_checkpoint and not os.path.isfile(
            os.path.join(args.resume_from_checkpoint, "trainer_state.json")):
        fail(f"--resume-from-checkpoint {args.resume_from_checkpoint!r} is not a checkpoint folder")
    return args


def make_config(args):
    from trl import GRPOConfig
    save = dict(save_strategy="steps", save_steps=args.save_steps) if args.save_steps else dict(
        save_strategy="no")
    # GRPOConfig's own defaults differ from TrainingArguments' (bf16, activation (gradient)
    # checkpointing, lr 1e-6): every one that matters is set here
    return GRPOConfig(
        output_dir=args.output_dir, seed=args.seed, use_cpu=args.use_cpu,
        bf16=args.dtype == "bfloat16", fp16=False,
        activation_checkpointing=False, logging_steps=args.logging_steps,
        report_to=args.report_to.split(","), run_name=args.run_name, **save,
        disable_dropout=True,  # generation, the update and the influence all see one policy
        learning_rate=args.learning_rate, lr_scheduler_type="constant",
        max_steps=args.max_steps or -1, num_train_epochs=1,
        per_device_train_batch_size=args.mini_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        generation_batch_size=args.batch_size, num_generations=args.num_generations,
        num_iterations=args.num_iterations, max_completion_length=args.gen_tokens,
        # sample pi_theta itself
        temperature=1.0, top_p=1.0, top_k=0, min_p=None, repetition_penalty=1.0,
        beta=args.beta, epsilon=args.epsilon, loss_type="dapo", scale_rewards="group",
        use_bias_correction_kl=True, mask_truncated_completions=False, use_vllm=False,
        log_completions=False)


def make_trainer(args, dtype=None):
    """Load the models and prompts and build the trainer; a name that fails stops here, before the
    run folder is made. dtype: the policy's weights (default: bfloat16 under --dtype bfloat16 with
    LoRA, where they are frozen; float32 otherwise, master weights of TRL's mixed precision)"""
    if dtype is None:
        dtype = torch.bfloat16 if args.dtype == "bfloat16" and args.lora else torch.float32
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokenizer = load("--model-name", args.model_name, AutoTokenizer.from_pretrained)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    lm = load("--model-name", args.model_name, AutoModelForCausalLM.from_pretrained, dtype=dtype)
    evaluation = None
    if args.reward_fn == "exact-answer":
        rm = None
        reward_fn = exact_answer
        train_rows, val_rows = load_questions(args)
        if args.eval_every:
            evaluation = (None, *load_eval_questions(args, tokenizer))
    else:
        rm = load_classifier("--reward-model", args.reward_model, "--reward-label",
                             args.reward_label)
        reward_fn = make_reward_fn(rm)
        train_rows, val_rows = load_prompts(args, tokenizer)
        if args.eval_every:
            evaluation = (load_classifier("--eval-reward-model", args.eval_reward_model,
                                          "--eval-toxic-label", args.eval_toxic_label),
                          load_eval_prompts(args, tokenizer), None)
    peft_config = None
    if args.lora:
        from peft import LoraConfig
        targets = args.lora_target_modules.split(",") if args.lora_target_modules else None
        peft_config = LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha, target_modules=targets,
                                 lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
    try:
        config = make_config(args)
    except ValueError as e:
        fail(f"--batch-size, --mini-batch-size, --num-generations: {e}")
    try:
        trainer = make_trainer_class()(
            model=lm, reward_funcs=reward_fn, args=config, processing_class=tokenizer,
            train_dataset=Dataset.from_list(train_rows), peft_config=peft_config,
            iif_args=args, validation_rows=val_rows, evaluation=evaluation)
    except ValueError as e:  # peft's answer to --lora-target-modules that the model does not have
        fail(f"--lora-target-modules: {e}" if args.lora_target_modules else str(e))
    acc = trainer.accelerator
    if (trainer.sharded and args.filter_method in ("influence", "random")
            and trained_linears(trainer.model) is None):
        fail(f"--filter-method {args.filter_method} under {acc.distributed_type.value} scores "
             "from the inputs and output gradients of the trained linear layers (LoRA's), as "
             "parameters may be sharded; here other parameters train too (--no-lora, or LoRA on "
             "embeddings or biases). Use LoRA on linear layers, DDP, or --filter-method none")
    for clf in (rm, evaluation and evaluation[0]):
        if clf:
            clf[0].to(acc.device)
    return trainer


def take_rows(b, rows):
    """The generation batch b restricted to rows, every per-completion field of it (the fields
    that TRL's shuffle_sequence_dict permutes)"""
    def take(v):
        if v is None or isinstance(v, torch.Tensor) and v.ndim == 0:
            return v
        return v[rows] if isinstance(v, torch.Tensor) else [v[i] for i in rows.tolist()]
    return {k: take(v) for k, v in b.items()}


def timer():
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


METRICS = ["round", "step", "completions", "reward_mean", "reward_std", "n_kept", "n_negative",
           "eval_toxicity", "eval_accuracy", "t_generate", "t_forward", "t_influence", "t_optim",
           "t_eval"]


def open_metrics(run_dir, n_rounds):
    """metrics.csv, new, or (resuming) cut back to its first n_rounds generation batches"""
    path = os.path.join(run_dir, "metrics.csv")
    rows = []
    if n_rounds:
        with open(path) as f:
            rows = [r for r in csv.DictReader(f) if int(r["round"]) < n_rounds]
    f = open(path, "w", newline="")
    writer = csv.DictWriter(f, fieldnames=METRICS)
    writer.writeheader()
    writer.writerows(rows)
    f.flush()
    return writer, f


def write_row(trainer, last=False):
    """One metrics.csv row per generation batch, once its update (Stage III) is over; the test
    toxicity (or accuracy) after every --eval-every-th update and after the last, measured by every
    process"""
    if trainer.row is None:
        return
    r = trainer.row
    args = trainer.iif_args
    r["t_optim"] = timer() - trainer.t_stage2_end
    r["eval_toxicity"] = r["eval_accuracy"] = ""
    r["t_eval"] = 0.0
    key = "eval_accuracy" if args.reward_fn == "exact-answer" else "eval_toxicity"
    if trainer.evaluation and ((r["round"] + 1) % args.eval_every == 0 or last):
        t0 = timer()
        r[key] = test_metric(trainer)
        r["t_eval"] = timer() - t0
    if trainer.writer is not None:
        trainer.writer[0].writerow(r)
        trainer.writer[1].flush()
        test = f" test {key[5:]} {r[key]:.3f}" if r[key] != "" else ""
        print(f"generation batch {r['round']} reward {r['reward_mean']:.3f} | kept "
              f"{r['n_kept']}/{r['completions']}{test} | s: generate {r['t_generate']:.1f} "
              f"forward {r['t_forward']:.1f} influence {r['t_influence']:.1f} "
              f"optim {r['t_optim']:.1f}", flush=True)
    trainer.row = None


if __name__ == "__main__":
    args = resolve_args(tyro.cli(Args))
    try:
        main(args)
    except KeyboardInterrupt:
        sys.exit(f"\ninterrupted: every finished generation batch is in "
                 f"{os.path.join(args.runs_dir, args.run_name)}/metrics.csv")
    if torch.distributed.is_initialized():  # accelerate launch, torchrun
        torch.distributed.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # torch 2.13's gloo aborted at interpreter exit in about 1 run of 5 otherwise
