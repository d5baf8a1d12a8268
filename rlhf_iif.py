r"""RLHF with PPO and Iterative Influence-based Filtering (IIF), in one file (paper, Sec. 5.3).

The TRL "detoxifying a language model" setup: a causal LM continues toxic prompts, a hate-speech
classifier scores each continuation, and PPO with a per-token KL penalty to the initial model raises
the score. A record is one (prompt, continuation) episode. Each round k scores every episode of the
buffer by its influence on a sequence-level target f_seq, drops the harmful ones and runs PPO on the
rest (Alg. 1). TRL no longer ships a PPO trainer (its classic PPOTrainer.step ended with TRL 0.11),
so the PPO step for language models is written out below, following TRL 0.11's.

The paper's run (gpt-neo-2.7B, hub models and data sets, a GPU):

    python rlhf_iif.py --filter-method influence

Offline on a CPU, the toy task of results/rlhf_toy.sh (built once, 98 s on a 2-core CPU):

    python benchmarks/rlhf_toy_task.py --out results/rlhf_toy_task
    T=results/rlhf_toy_task
    python rlhf_iif.py --model-name $T/policy --reward-model $T/reward --dataset $T/prompts.jsonl \
        --eval-dataset $T/wiki_toxic.jsonl --eval-reward-model $T/eval_reward --eval-samples 200 \
        --batch-size 64 --learning-rate 3e-4 --init-kl-coef 0.2 --rounds 30 --threads 1 \
        --filter-method influence --runs-dir results/runs --run-name rlhf-toy__influence__1
"""
import contextlib
import copy
import csv
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Literal, Optional

import numpy as np
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn as nn
import tyro
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel

@dataclass
class Args:
    model_name: str = "EleutherAI/gpt-neo-2.7B"
    """policy: a causal LM, hub name or local folder; the frozen reference is its initial state"""
    reward_model: str = "facebook/roberta-hate-speech-dynabench-r4-target"
    """classifier whose --reward-label logit on the continuation (without the prompt) is the
    reward"""
    reward_label: str = "nothate"
    """label of --reward-model whose raw logit is the reward"""
    dataset: str = "allenai/real-toxicity-prompts"
    """prompts: a hub dataset or a local .json/.jsonl file with real-toxicity-prompts' fields
    (prompt.text, prompt.toxicity, continuation.text)"""
    seed: int = 1
    """seed of torch (generation, value head), the prompt split and order, and the random filter"""
    run_name: Optional[str] = None
    """results go to <runs-dir>/<run-name>/ (default: rlhf__method__seed__time)"""
    runs_dir: str = "runs"
    """parent folder of the run folders"""
    device: Optional[str] = None
    """torch device (default: cuda when available, else cpu)"""
    dtype: Optional[Literal["bfloat16", "float32"]] = None
    """bfloat16: the frozen weights in bfloat16 and the forward passes under torch.autocast, as the
    released code loads the policy in bfloat16; what trains (LoRA, the value head; the whole model
    with --no-lora) stays float32, and log-probabilities, losses and influence are float32
    (default: bfloat16 on a GPU that supports it, float32 elsewhere)"""
    threads: Optional[int] = None
    """torch CPU threads (default: torch's choice)"""
    resume: bool = False
    """continue <runs-dir>/<run-name> after its last checkpointed round, with the flags it was
    started with"""
    save_every: int = 1
    """write checkpoint.pt (trained weights, optimizer, KL coefficient, prompt order, random states)
    after every N-th round and the last, for --resume (0: never)"""

    # data (App. B.3)
    min_prompt_toxicity: float = 0.3
    """keep prompts whose toxicity score is above this"""
    prompt_min_tokens: int = 10
    """a prompt is the first L tokens of prompt + continuation text, L uniform in [min, max]"""
    prompt_max_tokens: int = 15
    """see --prompt-min-tokens"""
    gen_tokens: int = 30
    """tokens sampled per continuation, fewer if EOS comes first (top_k 0, top_p 1, temperature 1:
    the policy's own distribution)"""
    held_out_fraction: float = 0.2
    """prompts held out of training (TRL's example split), for --target-data validation"""

    # PPO for language models (TRL 0.11's defaults and the paper's batch settings; the KL settings
    # are the released code's: TRL's defaults, which App. B.3 implies, are --init-kl-coef 0.2
    # --kl-target 6)
    batch_size: int = 256
    """episodes a round: the rollout buffer B(k)"""
    mini_batch_size: int = 1
    """episodes per optimizer step"""
    ppo_epochs: int = 4
    """passes over the (kept) buffer per round"""
    learning_rate: float = 1e-5
    """Adam learning rate"""
    rounds: Optional[int] = None
    """training rounds (default: one pass over the training prompts, 109 in the paper)"""
    gamma: float = 1.0
    """discount over the tokens of a continuation"""
    lam: float = 0.95
    """GAE lambda"""
    cliprange: float = 0.2
    """PPO clipping epsilon of the policy ratio"""
    cliprange_value: float = 0.2
    """clipping range of the value prediction around its old value"""
    vf_coef: float = 0.1
    """value loss coefficient"""
    init_kl_coef: float = 0.04
    """initial coefficient beta of the per-token KL penalty"""
    adaptive_kl: bool = True
    """adapt beta toward --kl-target (Ziegler et al. 2019); off: beta stays --init-kl-coef"""
    kl_target: float = 0.1
    """target KL (summed over a continuation's tokens, averaged over episodes)"""
    kl_horizon: int = 10_000
    """horizon of the adaptive KL controller, in episodes"""
    lora: bool = True
    """train LoRA adapters (and the value head) instead of the whole model; the reference is the
    model with its adapters disabled"""
    lora_r: int = 16
    """LoRA rank"""
    lora_alpha: int = 32
    """LoRA alpha"""
    lora_target_modules: Optional[str] = None
    """comma-separated module names for LoRA (default: peft's choice for the architecture,
    q_proj,v_proj for GPT-Neo as in the released code)"""
    forward_batch_size: Optional[int] = None
    """episodes per batched no-grad forward, target-gradient and influence pass (default: 64 on a
    GPU, where batching pays, 16 on the CPU)"""
    generation_batch_size: int = 64
    """prompts per generate() call"""

    # influence and filtering (Sec. 3.1, 5.1, 5.3)
    filter_method: Literal["influence", "random", "none"] = "influence"
    """influence: IIF; random: drop as many episodes uniformly at random; none: standard PPO"""
    filter_p: Optional[float] = None
    """fraction in (0, 1] of the negative-influence episodes to drop, most negative first (default:
    drop every episode with influence <= 0, as the released code does)"""
    target: Literal["f_seq", "f_return"] = "f_seq"
    """target function: f_seq (Sec. 5.3: log pi(y|x) times the advantage at the last token) or the
    token-level f_return (Sec. 3.1, App. C.8)"""
    target_data: Literal["buffer", "validation"] = "buffer"
    """episodes f is measured on: the round's own buffer, or fresh generations on --validation-size
    held-out prompts (as the released code and I-PPO do)"""
    validation_size: int = 1024
    """held-out prompts generated on each round for --target-data validation"""

    # evaluation (App. B.3)
    eval_every: int = 1
    """measure test toxicity after every N-th round (0: never)"""
    eval_dataset: str = "OxAISH-AL-LLM/wiki_toxic"
    """test prompts: toxic comments (label 1) of this dataset, a hub name or a local .json/.jsonl"""
    eval_split: str = "test"
    """split of --eval-dataset"""
    eval_samples: int = 400
    """test prompts"""
    eval_max_prompt_tokens: int = 256
    """a test prompt is the whole comment, cut to its last N tokens"""
    eval_reward_model: str = "DaNLP/da-electra-hatespeech-detection"
    """a second toxicity classifier; test toxicity is its mean --eval-toxic-label probability"""
    eval_toxic_label: str = "offensive"
    """label of --eval-reward-model that means toxic"""


# ---- The policy, generation and the reward (App. B.3) ----
class Policy(nn.Module):
    """The causal LM with a value head on its last hidden state (TRL's
    AutoModelForCausalLMWithValueHead)."""

    def __init__(self, lm, bf16=False):
        super().__init__()
        self.lm = lm
        self.v_head = nn.Linear(lm.config.hidden_size, 1)
        self.bf16 = bf16  # --dtype bfloat16: the LM's passes under autocast

    def forward(self, ids, attn, T):
        """log pi(y_t | x, y_<t) and V(x, y_<t) of the last T tokens (the continuation) of the
        left-padded rows ids: (batch, prompt + continuation) -> (batch, T), (batch, T)"""
        pos = (attn.cumsum(1) - 1).clamp(min=0)  # positions count real tokens only
        with autocast(self, ids.device):
            out = self.lm(input_ids=ids, attention_mask=attn, position_ids=pos,
                          output_hidden_states=True, logits_to_keep=T + 1)
        # logits of the last T + 1 positions, (batch, T + 1, vocab); each predicts the next token,
        # so the first T predict the continuation: (batch, T, vocab), in float32 at least
        logits = up(out.logits[:, :-1])
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, -T:, None]).squeeze(-1)  # (batch, T)
        # (batch, prompt + continuation, hidden) -> (batch, T, hidden): the same T positions
        hidden = up(out.hidden_states[-1][:, -T - 1:-1])
        return logp, self.v_head(hidden).squeeze(-1)


def autocast(policy, device):
    """bfloat16 compute for --dtype bfloat16 (torch.autocast); float32 runs unchanged"""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=policy.bf16)


def up(x):
    """x in float32 at least (bfloat16 activations under --dtype bfloat16)"""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def make_policy(args, device):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokenizer = load("--model-name", args.model_name, AutoTokenizer.from_pretrained)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    bf16 = args.dtype == "bfloat16"
    # frozen weights in bfloat16 under --dtype bfloat16 (peft keeps its adapters in float32);
    # weights that train stay float32
    lm = load("--model-name", args.model_name, AutoModelForCausalLM.from_pretrained,
              dtype=torch.bfloat16 if bf16 and args.lora else torch.float32)
    ref = None
    if args.lora:
        from peft import LoraConfig, get_peft_model
        targets = args.lora_target_modules.split(",") if args.lora_target_modules else None
        try:
            config = LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha, target_modules=targets,
                                lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
            lm = get_peft_model(lm, config)
        except ValueError as e:
            fail(f"--lora-target-modules: {e}")
    policy = Policy(lm, bf16).to(device)
    policy.eval()  # no dropout: generation, update and influence all see one policy pi_theta
    if not args.lora:
        ref = copy.deepcopy(policy).requires_grad_(False)
        if bf16:
            ref.lm.to(torch.bfloat16)
    return policy, ref, tokenizer


def ref_logprobs(policy, ref, ids, attn, T):
    """log pi_ref: with LoRA, the policy with its adapters disabled"""
    with policy.lm.disable_adapter() if ref is None else contextlib.nullcontext():
        return (policy if ref is None else ref)(ids, attn, T)[0]


def batches(n, size):
    return [torch.arange(i, min(i + size, n)) for i in range(0, n, size)]


@torch.no_grad()
def generate(policy, queries, tokenizer, args, device):
    """Sample continuations of the queries; rows are [left padding, prompt, continuation, right
    padding]. Returns ids, attention mask and the response mask (the continuation up to and with
    its first EOS)."""
    P = max(map(len, queries))
    T = args.gen_tokens
    pad = tokenizer.pad_token_id
    eos = tokenizer.eos_token_id
    ids = torch.full((len(queries), P + T), pad, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, q in enumerate(queries):
        ids[i, P - len(q):P] = torch.tensor(q)
        attn[i, P - len(q):P] = 1
    for idx in batches(len(queries), args.generation_batch_size):
        # sample from pi_theta itself: every knob a model's generation_config may set is neutralised
        with autocast(policy, device):
            out = policy.lm.generate(
                input_ids=ids[idx, :P].to(device), attention_mask=attn[idx, :P].to(device),
                do_sample=True, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0,
                repetition_penalty=1.0, no_repeat_ngram_size=0, max_new_tokens=T,
                min_new_tokens=0, pad_token_id=pad, eos_token_id=eos)
        ids[idx, P:out.shape[1]] = out[:, P:].cpu()
    is_eos = ids[:, P:] == eos  # a call that stops early does so because every row has reached EOS
    mask = ((is_eos.cumsum(1) - is_eos.long()) == 0).float()  # no EOS before this position
    attn[:, P:] = mask.long()
    return ids.to(device), attn.to(device), mask.to(device)


@torch.no_grad()
def classify(model, tok, texts, device, bs=64):
    logits = []
    for i in range(0, len(texts), bs):
        inputs = tok(texts[i:i + bs], padding=True, truncation=True, return_tensors="pt")
        logits.append(model(**inputs.to(device)).logits.float())
    return torch.cat(logits)


def continuations(tokenizer, b):
    T = b["mask"].shape[1]
    rows = zip(b["ids"][:, -T:], b["mask"])
    return [tokenizer.decode(row[:int(m.sum())], skip_special_tokens=True) for row, m in rows]


# ---- Stage I of Alg. 1: the buffer B(k), KL-shaped rewards and GAE (Sec. 2.1, TRL 0.11's PPO) ----
def rollout(policy, ref, queries, kl_coef, rm, tokenizer, args, device):
    """Stage I of Alg. 1 for language models: generate, score, and compute log pi, V, the
    KL-shaped per-token rewards and GAE advantages at theta(k). Returns the buffer and
    (t_generate, t_forward)."""
    t0 = timer(device)
    ids, attn, mask = generate(policy, queries, tokenizer, args, device)
    b = dict(ids=ids, attn=attn, mask=mask)
    rm_model, rm_tok, rm_label = rm
    b["texts"] = continuations(tokenizer, b)
    b["scores"] = classify(rm_model, rm_tok, b["texts"], device)[:, rm_label]
    t1 = timer(device)
    T = mask.shape[1]
    out = []
    with torch.no_grad():
        for i in batches(len(ids), args.forward_batch_size):
            logp, v = policy(ids[i], attn[i], T)
            out.append((logp, v, ref_logprobs(policy, ref, ids[i], attn[i], T)))
    b["logprobs"], b["values"], b["ref_logprobs"] = (torch.cat(x) for x in zip(*out))
    # TRL's compute_rewards: r_t = -beta (log pi - log pi_ref)(y_t), plus the classifier's score
    # at the last token
    kl = (b["logprobs"] - b["ref_logprobs"]) * mask
    b["kl"] = kl.sum(1)
    rewards = -kl_coef * kl
    b["last"] = mask.sum(1).long() - 1
    rewards[torch.arange(len(ids)), b["last"]] += b["scores"]
    adv, b["returns"] = compute_gae(rewards, b["values"], mask, args.gamma, args.lam)
    # whitened once over the buffer: scoring and training see the same A_hat
    b["advantages"] = whiten(adv, mask)
    return b, (t1 - t0, timer(device) - t1)


def compute_gae(rewards, values, mask, gamma, lam):
    """GAE over the tokens of each continuation (Sec. 2.1); values and rewards past its end count
    as 0"""
    values = values * mask
    rewards = rewards * mask
    adv = torch.zeros_like(rewards)
    lastgaelam = 0.0
    T = rewards.shape[1]
    for t in reversed(range(T)):
        next_values = values[:, t + 1] if t < T - 1 else 0.0
        delta = rewards[:, t] + gamma * next_values - values[:, t]
        adv[:, t] = lastgaelam = delta + gamma * lam * lastgaelam
    return adv, adv + values


def whiten(x, mask):
    """TRL's masked whitening: zero mean, unit (unbiased) variance over the real tokens of the
    buffer"""
    mean = (x * mask).sum() / mask.sum()
    var = ((x - mean) ** 2 * mask).sum() / (mask.sum() - 1).clamp(min=1)
    return (x - mean) * torch.rsqrt(var + 1e-8)


def update_kl_coef(kl_coef, kl, n_episodes, args):
    """Adaptive KL controller (Ziegler et al. 2019), as TRL's AdaptiveKLController"""
    if not args.adaptive_kl:
        return kl_coef
    error = float(np.clip(kl / args.kl_target - 1, -0.2, 0.2))
    return kl_coef * (1 + error * n_episodes / args.kl_horizon)


# ---- Stage II of Alg. 1: the target f_seq, the influence of every episode, the filter ----
def ppo_losses(policy, b, idx, args, params=None, out=None):
    """Per-episode PPO loss l_i (Sec. 2.1, TRL's loss for LMs): token means of the clipped
    surrogate and of vf_coef x 0.5 x the clipped squared value error. A minibatch's loss is the
    mean over its episodes. out: the policy's (log pi, V) of these episodes, if already computed."""
    ids, attn, m = b["ids"][idx], b["attn"][idx], b["mask"][idx]
    T = m.shape[1]
    if out is None:
        out = policy(ids, attn, T) if params is None else functional_call(policy, params,
                                                                            (ids, attn, T))
    logp, v = out
    adv, old_v, ret = b["advantages"][idx], b["values"][idx], b["returns"][idx]
    ratio = torch.exp(logp - b["logprobs"][idx])
    pg = torch.max(-adv * ratio, -adv * ratio.clamp(1 - args.cliprange, 1 + args.cliprange))
    v_clipped = old_v + (v - old_v).clamp(-args.cliprange_value, args.cliprange_value)
    vf = 0.5 * torch.max((v - ret) ** 2, (v_clipped - ret) ** 2)
    return ((pg + args.vf_coef * vf) * m).sum(1) / m.sum(1)


def target_weights(t, target):
    """Both targets read f(theta) = sum_it w_it log pi_theta(y_t | x_i, y_<t) over the target
    episodes t"""
    m = t["mask"]
    if target == "f_seq":  # Sec. 5.3: mean over episodes of log pi(y|x) A_hat(last token)
        return t["advantages"].gather(1, t["last"][:, None]) * m / len(m)
    return t["advantages"] * m / m.sum()  # f_return (Sec. 3.1): every token is a (state, action)


def influence(policy, b, t, args):
    """I_i = <grad f(theta), -grad l_i(theta)> of every episode i of b at theta(k) (Sec. 3.1, 5.1),
    exactly, from activations. A LoRA matrix W (y = W x) gets from episode i the gradient
    sum_s dy_s x_s^T over its tokens s, so <G, grad_W l_i> = sum_s dy_s^T G x_s, with G = grad_W f.
    Target on the buffer: one forward pass of each batch and two backward passes, one for the
    losses (row i of dy is the gradient of l_i alone) and one for f, give G and every episode's
    LoRA gradient, kept until G is complete. Otherwise (validation target, or gradients too large
    to keep): a pass over t for G, then one over b. The value head takes no part (f does not reach
    it); the value loss still counts through the LoRA layers it shares with the policy. Without
    LoRA: influence_forward_mode."""
    layers = lora_layers(policy)
    if layers is None:
        return influence_forward_mode(policy, b, t, args)
    w = target_weights(t, args.target)
    T = w.shape[1]
    n_bytes = 4 * len(b["ids"]) * sum(m.weight.numel() for m in layers)
    one_pass = t is b and n_bytes <= memory_for_grads(b["ids"].device)
    G = [0.0] * len(layers)

    def add_to_G(G, io, dys):  # G += sum over the batch's tokens of dy x^T, in float32
        return [g + torch.einsum("...o,...i->oi", up(dy), up(x))
                for g, (x, _), dy in zip(G, io, dys)]
    if not one_pass:
        for idx in batches(len(w), args.forward_batch_size):
            logp, io = with_linear_io(layers, lambda: policy(t["ids"][idx], t["attn"][idx], T)[0])
            G = add_to_G(G, io, grad((w[idx] * logp).sum(), io))
    scores, grads = [], []
    for idx in batches(len(b["ids"]), args.forward_batch_size):
        out, io = with_linear_io(layers, lambda: policy(b["ids"][idx], b["attn"][idx], T))
        dys = grad(ppo_losses(policy, b, idx, args, out=out).sum(), io, retain=one_pass)
        if one_pass:  # episode i's LoRA gradients, and f's share of G
            grads.append([torch.einsum("b...o,b...i->boi", up(dy), up(x))
                          for (x, _), dy in zip(io, dys)])
            G = add_to_G(G, io, grad((w[idx] * out[0]).sum(), io))
        else:
            scores.append(-sum(((up(dy) @ g) * up(x)).flatten(1).sum(1)
                               for g, (x, _), dy in zip(G, io, dys)))
    if one_pass:
        scores = [-sum((g * gi).flatten(1).sum(1) for g, gi in zip(G, gs)) for gs in grads]
    return torch.cat(scores)


def lora_layers(policy):
    """The LM's nn.Linear layers whose weight trains (LoRA's A and B), or None where other
    parameters of the LM train too (--no-lora)"""
    layers = [m for m in policy.lm.modules() if isinstance(m, nn.Linear) and m.weight.requires_grad]
    n_trained = sum(1 for p in policy.lm.parameters() if p.requires_grad)
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


def grad(y, io, retain=False):
    """d y / d (every layer's output)"""
    return torch.autograd.grad(y, [out for _, out in io], retain_graph=retain,
                               materialize_grads=True)


def memory_for_grads(device):
    """Bytes that the one-pass influence may keep in per-episode LoRA gradients: an eighth of the
    device's memory (GPT-Neo-2.7B's q/v adapters at rank 16 hold 5.2 M numbers an episode, 5.4 GB
    for 256 episodes)"""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory // 8
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 8


def influence_forward_mode(policy, b, t, args):
    """influence() for any trained parameters (--no-lora): one backward pass over the target
    episodes t gives grad f, one forward-mode pass along it gives every episode's inner product (a
    directional derivative). Parameters f does not reach (the value head) carry no tangent."""
    params = {n: p for n, p in policy.named_parameters() if p.requires_grad}
    w = target_weights(t, args.target)
    grads = dict.fromkeys(params)
    for idx in batches(len(w), args.forward_batch_size):
        logp = policy(t["ids"][idx], t["attn"][idx], w.shape[1])[0]
        g = torch.autograd.grad((w[idx] * logp).sum(), list(params.values()), allow_unused=True)
        for n, gi in zip(params, g):
            if gi is not None:
                grads[n] = gi if grads[n] is None else grads[n] + gi
    # torch.autograd.forward_ad, not torch.func.jvp as in iif.py: on these language models (CPU)
    # jvp took 10-20 % longer for the same scores. Fused attention kernels have no forward-mode
    # AD, the math one does.
    scores = []
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), fwAD.dual_level():
        duals = {n: fwAD.make_dual(params[n].detach(), g) for n, g in grads.items()
                 if g is not None}
        for idx in batches(len(b["ids"]), args.forward_batch_size):
            loss = ppo_losses(policy, b, idx, args, duals)
            scores.append(-fwAD.unpack_dual(loss).tangent)
    return torch.cat(scores)


def filter_records(scores, method, p, gen):
    """Stage II of Alg. 1: returns the kept mask, on the scores' device. 'influence' drops every
    episode with influence <= 0 (p None), or the floor(p x n_negative) most negative ones, ties
    broken by buffer order; 'random' drops as many uniformly at random."""
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


# ---- Stage III of Alg. 1: PPO on the kept episodes; and the test toxicity (App. B.3) ----
def ppo_update(policy, optimizer, b, kept_idx, args, gen):
    """Stage III of Alg. 1: ppo_epochs passes over the kept episodes, reshuffled, mini_batch_size
    at a time (a smaller last minibatch is kept); so a filtered round takes fewer optimizer
    steps."""
    losses = []
    n_updates = 0
    for epoch in range(args.ppo_epochs):
        perm = kept_idx[torch.randperm(len(kept_idx), generator=gen)]
        for start in range(0, len(perm), args.mini_batch_size):
            loss = ppo_losses(policy, b, perm[start:start + args.mini_batch_size], args).mean()
            losses.append(loss.item())  # one device sync per step, for the check and the log
            if not np.isfinite(losses[-1]):
                raise FloatingPointError(f"non-finite PPO loss at epoch {epoch}, step {n_updates}")
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            n_updates += 1
    return n_updates, float(np.mean(losses)) if losses else float("nan")


@torch.no_grad()
def evaluate(policy, queries, tokenizer, clf, args, device):
    """App. B.3: mean toxicity probability of sampled continuations of toxic test prompts (a fixed
    seed, and the training generator left untouched)"""
    model, tok, toxic = clf
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(args.seed + 10_000)
        ids, attn, mask = generate(policy, queries, tokenizer, args, device)
    texts = continuations(tokenizer, dict(ids=ids, mask=mask))
    return classify(model, tok, texts, device).softmax(-1)[:, toxic].mean().item()


# ---- The loop of Alg. 1 ----
def main(args):
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)  # minibatch order and random filtering
    device = torch.device(args.device)
    # everything is loaded before the run folder is made: a name that fails leaves nothing behind
    policy, ref, tokenizer = make_policy(args, device)
    rm = load_classifier("--reward-model", args.reward_model, "--reward-label", args.reward_label,
                         device)
    train_prompts, val_prompts = load_prompts(args, tokenizer)
    if args.eval_every:
        eval_clf = load_classifier("--eval-reward-model", args.eval_reward_model,
                                   "--eval-toxic-label", args.eval_toxic_label, device)
        eval_prompts = load_eval_prompts(args, tokenizer)
    n_rounds = args.rounds or len(train_prompts) // args.batch_size
    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(trainable, lr=args.learning_rate)
    run = Run(args, n_rounds, sum(p.numel() for p in trainable), device)
    # the first round, beta and prompt order: round 0's, or with --resume those after the last
    # checkpointed round (its weights, optimizer and random states restored too)
    start, kl_coef, order = run.restore(policy, optimizer, gen)
    try:
        for k in range(start, n_rounds):
            if len(order) < args.batch_size:  # one pass over the shuffled prompts, then another
                order = order + torch.randperm(len(train_prompts), generator=gen).tolist()
            queries = [train_prompts[i] for i in order[:args.batch_size]]
            order = order[args.batch_size:]

            # Stage I (Alg. 1): the buffer B(k) of episodes generated by the policy at theta(k)
            b, (t_generate, t_forward) = rollout(policy, ref, queries, kl_coef, rm, tokenizer, args,
                                                 device)

            # Stage II (Alg. 1): influence of every episode at theta(k) (Sec. 5.1, 5.3), then filter
            t0 = timer(device)
            scores = None
            kept = torch.ones(args.batch_size, dtype=torch.bool)
            if args.filter_method != "none":
                t = b
                if args.target_data == "validation":
                    t = rollout(policy, ref, val_prompts, kl_coef, rm, tokenizer, args, device)[0]
                scores = influence(policy, b, t, args)
                if not torch.isfinite(scores).all():
                    fail(f"round {k}: non-finite influence scores; lower --learning-rate")
                kept = filter_records(scores, args.filter_method, args.filter_p, gen)
            t_influence = timer(device) - t0

            # Stage III (Alg. 1): PPO on the kept episodes, then the adaptive KL step on all of B(k)
            t0 = timer(device)
            kept_idx = torch.nonzero(kept).squeeze(1)
            try:
                n_updates, loss = ppo_update(policy, optimizer, b, kept_idx, args, gen)
            except FloatingPointError as e:
                fail(f"round {k}: {e}; lower --learning-rate")
            t_optim = timer(device) - t0
            kl = b["kl"].mean().item()
            row = dict(round=k, episodes=(k + 1) * args.batch_size,
                       reward_mean=b["scores"].mean().item(), reward_std=b["scores"].std().item(),
                       kl=kl, kl_coef=kl_coef, n_kept=int(kept.sum()),
                       n_negative="" if scores is None else int((scores < 0).sum()),
                       loss=loss, n_updates=n_updates, eval_toxicity="",
                       t_generate=t_generate, t_forward=t_forward, t_influence=t_influence,
                       t_optim=t_optim, t_eval=0.0)
            kl_coef = update_kl_coef(kl_coef, kl, args.batch_size, args)

            if args.eval_every and (k + 1) % args.eval_every == 0:  # test toxicity (App. B.3)
                t0 = timer(device)
                row["eval_toxicity"] = evaluate(policy, eval_prompts, tokenizer, eval_clf, args,
                                                device)
                row["t_eval"] = timer(device) - t0
            run.end_round(row, b, queries, scores, kept, tokenizer)
            run.checkpoint(k, policy, optimizer, gen, kl_coef, order)
    finally:  # also on Ctrl-C (mid-round, the weights as they are then)
        run.finish(policy, tokenizer)


# =================================================================================================
# Everything Alg. 1 needs stands above. Below, what a first reading may skip: loading the models
# and data with clear errors, the flag checks, and the run folder.
# =================================================================================================


# ---- Plumbing: loading the models and data ----
def fail(msg):
    raise SystemExit(f"rlhf_iif.py: error: {msg}")


def load(flag, name, loader, *a, **kw):
    """Load a model, tokenizer or dataset; on any failure stop with the flag's name, before a file
    is written"""
    try:
        return loader(name, *a, **kw)
    except Exception as e:  # OSError, ValueError, hub and connection errors all end here
        fail(f"{flag} {name!r} could not be loaded ({type(e).__name__}: "
             f"{str(e).strip().splitlines()[0][:300]}). "
             "Without network access, download it on another machine and pass its local path.")


def load_rows(flag, name, split):
    from datasets import load_dataset
    if name.endswith((".json", ".jsonl")):
        return load(flag, name, lambda path: load_dataset("json", data_files=path, split="train"))
    return load(flag, name, load_dataset, split=split)


def load_prompts(args, tokenizer):
    """App. B.3: prompts with toxicity > 0.3, each the first 10-15 tokens of its prompt +
    continuation text (as TRL's example does); split into training and held-out prompts."""
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
            prompts.append(ids[:n])
    order = rng.permutation(len(prompts))
    n_held = int(args.held_out_fraction * len(prompts))
    train = [prompts[i] for i in order[n_held:]]
    held = [prompts[i] for i in order[:n_held]]
    if len(train) < args.batch_size:
        fail(f"--dataset {args.dataset!r} has {len(train)} training prompts with toxicity > "
             f"{args.min_prompt_toxicity} and >= {args.prompt_min_tokens} tokens, fewer than "
             f"--batch-size {args.batch_size}")
    if args.target_data == "validation" and len(held) < args.validation_size:
        fail(f"--validation-size {args.validation_size}: only {len(held)} held-out prompts "
             f"(--held-out-fraction {args.held_out_fraction})")
    return train, held[:args.validation_size]


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


def load_classifier(flag, name, label_flag, label, device):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    tok = load(flag, name, AutoTokenizer.from_pretrained)
    model = load(flag, name, AutoModelForSequenceClassification.from_pretrained).to(device).eval()
    labels = {v: int(k) for k, v in model.config.id2label.items()}
    if label not in labels:
        fail(f"{label_flag} {label!r} is not a label of {flag} {name!r}; its labels are "
             f"{sorted(labels)}")
    return model, tok, labels[label]


# ---- Plumbing: the flags, the run folder and timing ----
def resolve_args(args):
    """Check every flag before anything is loaded; fail early with the flag's name."""
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(args.device)
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as e:
        fail(f"--device {args.device!r} is not usable here ({e})")
    gpu = device.type == "cuda"
    if args.dtype is None:
        args.dtype = "bfloat16" if gpu and torch.cuda.is_bf16_supported() else "float32"
    if args.dtype == "bfloat16" and gpu and not torch.cuda.is_bf16_supported():
        fail(f"--dtype bfloat16: {torch.cuda.get_device_name(device)} has no bfloat16; use "
             "--dtype float32")
    if args.forward_batch_size is None:
        args.forward_batch_size = 64 if gpu else 16
    for key in ("batch_size", "mini_batch_size", "ppo_epochs", "gen_tokens", "prompt_min_tokens",
                "forward_batch_size", "generation_batch_size", "validation_size", "eval_samples",
                "eval_max_prompt_tokens", "lora_r", "kl_horizon"):
        if getattr(args, key) < 1:
            fail(f"--{key.replace('_', '-')} must be at least 1, got {getattr(args, key)}")
    if args.prompt_max_tokens < args.prompt_min_tokens:
        fail(f"--prompt-max-tokens ({args.prompt_max_tokens}) must be at least --prompt-min-tokens "
             f"({args.prompt_min_tokens})")
    if args.mini_batch_size > args.batch_size:
        fail(f"--mini-batch-size ({args.mini_batch_size}) must be at most --batch-size "
             f"({args.batch_size})")
    if args.rounds is not None and args.rounds < 1:
        fail(f"--rounds must be at least 1, got {args.rounds}")
    if args.eval_every < 0:
        fail(f"--eval-every must be 0 (never) or more, got {args.eval_every}")
    if args.filter_p is not None and not 0 < args.filter_p <= 1:
        fail(f"--filter-p must be in (0, 1], got {args.filter_p}")
    if not 0 <= args.held_out_fraction < 1:
        fail(f"--held-out-fraction must be in [0, 1), got {args.held_out_fraction}")
    for key in ("learning_rate", "kl_target", "cliprange", "cliprange_value"):
        if not getattr(args, key) > 0:
            fail(f"--{key.replace('_', '-')} must be positive, got {getattr(args, key)}")
    if args.init_kl_coef < 0 or args.vf_coef < 0:
        fail("--init-kl-coef and --vf-coef must be at least 0")
    if args.save_every < 0:
        fail(f"--save-every must be 0 (never) or more, got {args.save_every}")
    if args.run_name is None:
        if args.resume:
            fail("--resume needs the --run-name of the run to continue")
        args.run_name = f"rlhf__{args.filter_method}__{args.seed}__{int(time.time())}"
    run_dir = os.path.join(args.runs_dir, args.run_name)
    if os.path.exists(os.path.join(run_dir, "metrics.csv")) and not args.resume:
        fail(f"{run_dir}/metrics.csv exists: add --resume to continue it, choose another "
             "--run-name, or remove it")
    if args.resume and os.path.exists(os.path.join(run_dir, "checkpoint.pt")):
        with open(os.path.join(run_dir, "config.json")) as f:
            saved = json.load(f)
        changed = [f"--{k.replace('_', '-')} {saved.get(k)} (now {v})"
                   for k, v in vars(args).items() if k not in MAY_CHANGE and saved.get(k) != v]
        if changed:
            fail(f"--resume: {run_dir} was run with other flags: {'; '.join(changed)}")
    return args


# flags a resumed run may change
MAY_CHANGE = ("resume", "threads", "runs_dir", "save_every")


METRICS = ["round", "episodes", "reward_mean", "reward_std", "kl", "kl_coef", "n_kept",
           "n_negative", "loss", "n_updates", "eval_toxicity", "t_generate", "t_forward",
           "t_influence", "t_optim", "t_eval"]


class Run:
    """<runs-dir>/<run-name>/: config.json, metrics.csv (a row per round), episodes.jsonl (every
    episode with its reward, influence and fate), checkpoint.pt (the state after the last
    checkpointed round, for --resume), and at the end the policy and its value head."""

    def __init__(self, args, n_rounds, n_trainable, device):
        self.args, self.n_rounds, self.device = args, n_rounds, device
        self.dir = os.path.join(args.runs_dir, args.run_name)
        os.makedirs(self.dir, exist_ok=True)
        with open(os.path.join(self.dir, "config.json"), "w") as f:
            json.dump(vars(args), f, indent=1)
        print(f"{args.model_name} ({n_trainable:,} trainable parameters) on {device}, "
              f"{args.dtype}: {n_rounds} rounds of {args.batch_size} episodes, filter "
              f"{args.filter_method}, target {args.target} on {args.target_data} -> {self.dir}")

    def restore(self, policy, optimizer, gen):
        """Open metrics.csv and episodes.jsonl. Returns (first round, beta, prompt order): round
        0's, or with --resume those after the last checkpointed round, whose weights, optimizer
        and random states are restored; its files keep the rows and episodes before that
        round."""
        ckpt, path = None, os.path.join(self.dir, "checkpoint.pt")
        if self.args.resume and os.path.exists(path):
            ckpt = torch.load(path, map_location=self.device, weights_only=False)
        start = 0 if ckpt is None else ckpt["round"] + 1
        rows, episodes = [], []
        if ckpt is not None:
            with open(os.path.join(self.dir, "metrics.csv")) as f:
                rows = [r for r in csv.DictReader(f) if int(r["round"]) < start]
            with open(os.path.join(self.dir, "episodes.jsonl")) as f:
                episodes = [line for line in f if json.loads(line)["round"] < start]
        self.metrics_file = open(os.path.join(self.dir, "metrics.csv"), "w", newline="")
        self.writer = csv.DictWriter(self.metrics_file, fieldnames=METRICS)
        self.writer.writeheader()
        self.writer.writerows(rows)
        self.metrics_file.flush()
        self.episodes_file = open(os.path.join(self.dir, "episodes.jsonl"), "w")
        self.episodes_file.writelines(episodes)
        self.episodes_file.flush()
        if ckpt is None:
            return 0, self.args.init_kl_coef, []
        with torch.no_grad():
            for n, p in policy.named_parameters():
                if p.requires_grad:
                    p.copy_(ckpt["trained"][n])
        optimizer.load_state_dict(ckpt["optimizer"])
        torch.set_rng_state(ckpt["torch_rng"])
        if ckpt["cuda_rng"] is not None:
            torch.cuda.set_rng_state_all(ckpt["cuda_rng"])
        gen.set_state(ckpt["gen"])
        print(f"resumed after round {ckpt['round']}")
        return start, ckpt["kl_coef"], ckpt["order"]

    def end_round(self, row, b, queries, scores, kept, tokenizer):
        """Write the round's row and its episodes, and print its line."""
        k = row["round"]
        self.writer.writerow(row)
        self.metrics_file.flush()
        for i, text in enumerate(b["texts"]):
            episode = dict(round=k, prompt=tokenizer.decode(queries[i]), continuation=text,
                           reward=b["scores"][i].item(),
                           influence=None if scores is None else scores[i].item(),
                           kept=bool(kept[i]))
            self.episodes_file.write(json.dumps(episode) + "\n")
        self.episodes_file.flush()
        tox = ""
        if row["eval_toxicity"] != "":
            tox = f" toxicity {row['eval_toxicity']:.3f}"
        print(f"round {k} [{k + 1}/{self.n_rounds}] reward {row['reward_mean']:.3f} kl "
              f"{row['kl']:.3f} beta {row['kl_coef']:.4f} | kept {row['n_kept']}/"
              f"{self.args.batch_size}{tox} | s: generate {row['t_generate']:.1f} forward "
              f"{row['t_forward']:.1f} influence {row['t_influence']:.1f} optim "
              f"{row['t_optim']:.1f}", flush=True)

    def checkpoint(self, k, policy, optimizer, gen, kl_coef, order):
        """After every --save-every-th round and the last: what the next round starts from. Written
        to a temporary file first, so that a run killed while saving keeps the previous one."""
        every = self.args.save_every
        if not every or ((k + 1) % every and k + 1 < self.n_rounds):
            return
        path = os.path.join(self.dir, "checkpoint.pt")
        torch.save(dict(round=k, trained={n: p.detach() for n, p in policy.named_parameters()
                                          if p.requires_grad},
                        optimizer=optimizer.state_dict(), kl_coef=kl_coef, order=order,
                        torch_rng=torch.get_rng_state(), gen=gen.get_state(),
                        cuda_rng=torch.cuda.get_rng_state_all() if self.device.type == "cuda"
                        else None), path + ".tmp")
        os.replace(path + ".tmp", path)

    def finish(self, policy, tokenizer):
        policy.lm.save_pretrained(os.path.join(self.dir, "policy"))  # the adapter only, with LoRA
        tokenizer.save_pretrained(os.path.join(self.dir, "policy"))
        torch.save(policy.v_head.state_dict(), os.path.join(self.dir, "value_head.pt"))
        self.metrics_file.close()
        self.episodes_file.close()


def timer(device):
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


if __name__ == "__main__":
    args = resolve_args(tyro.cli(Args))
    try:
        main(args)
    except KeyboardInterrupt:
        run_dir = os.path.join(args.runs_dir, args.run_name)
        sys.exit(f"\ninterrupted: every finished round is in {run_dir}/metrics.csv; the same "
                 "command with --resume continues after the last checkpointed round")
