r"""RLHF with PPO and Iterative Influence-based Filtering (IIF), in one file (paper, Sec. 5.3).

The TRL "detoxifying a language model" setup: a causal LM continues toxic prompts, a hate-speech
classifier scores each continuation, and PPO with a per-token KL penalty to the initial model raises
the score. A record is one (prompt, continuation) episode. Each round k scores every episode of the
buffer by its influence on a sequence-level target f_seq, drops the harmful ones and runs PPO on the
rest (Alg. 1). TRL no longer ships a PPO trainer (its classic PPOTrainer.step ended with TRL 0.11),
so the PPO step for language models is written out below, following TRL 0.11's.

    python rlhf_iif.py --filter-method influence             # the paper's run: hub models, a GPU
    RUNS=runs bash results/rlhf_toy.sh "1" "influence"       # offline on a CPU, a toy task

Read top to bottom: flags, policy and generation, Stages I-III, the test, main (the loop).
"""
import contextlib
import copy
import csv
import importlib.util
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Annotated, Literal, Optional

import numpy as np
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn as nn
import tyro
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel


def default(text):  # --help's default of a flag left None, said in words
    return tyro.conf.arg(help_behavior_hint=f"(default: {text})")


@dataclass
class Args:
    # influence and filtering (Sec. 3.1, 5.1, 5.3)
    filter_method: Literal["influence", "random", "none"] = "influence"
    """influence: IIF; random: drop as many episodes uniformly at random; none: standard PPO"""
    filter_p: Annotated[Optional[float], default("every one <= 0, as released")] = None
    """fraction in (0, 1] of the negative episodes to drop"""
    target: Literal["f_seq", "f_return"] = "f_seq"
    """target function: f_seq (Sec. 5.3) or the token-level f_return (Sec. 3.1, App. C.8)"""
    target_data: Literal["buffer", "validation"] = "buffer"
    """f on the round's buffer, or on fresh episodes of held-out prompts (the released code's)"""
    validation_size: int = 1024
    """held-out prompts generated on each round for --target-data validation"""

    # the task (App. B.3)
    model_name: str = "EleutherAI/gpt-neo-2.7B"
    """policy: a causal LM, hub name or local folder; the frozen reference is its initial state"""
    reward_model: str = "facebook/roberta-hate-speech-dynabench-r4-target"
    """classifier whose --reward-label logit on the continuation (not the prompt) is the reward"""
    reward_label: str = "nothate"
    """label of --reward-model whose raw logit is the reward"""
    dataset: str = "allenai/real-toxicity-prompts"
    """prompts: a hub dataset or a local .json/.jsonl with its fields (prompt.text, .toxicity, ...)"""

    # the run
    seed: int = 1
    """seed of torch (generation, value head), the prompt split and order, and the random filter"""
    run_name: Annotated[Optional[str], default("rlhf__method__seed__time")] = None
    """results go to <runs-dir>/<run-name>/"""
    runs_dir: str = "runs"
    """parent folder of the run folders; TensorBoard's too (tensorboard --logdir runs)"""
    track: bool = False
    """also log to Weights & Biases, syncing the TensorBoard scalars (pip install wandb)"""
    wandb_project_name: str = "iif-rlhf"
    """the wandb project"""
    wandb_entity: Annotated[Optional[str], default("yours")] = None
    """the wandb entity (team)"""
    device: Annotated[Optional[str], default("cuda when available, else cpu")] = None
    """torch device"""
    dtype: Annotated[Optional[Literal["bfloat16", "float32"]],
                     default("bfloat16 on a GPU that supports it, else float32")] = None
    """bfloat16: frozen weights in bfloat16, passes under autocast (as released); what trains, losses
    and influence stay float32"""
    threads: Annotated[Optional[int], default("torch's choice")] = None
    """torch CPU threads"""

    # data (App. B.3)
    min_prompt_toxicity: float = 0.3
    """keep prompts whose toxicity score is above this"""
    prompt_min_tokens: int = 10
    """a prompt is the first L tokens of prompt + continuation text, L uniform in [min, max]"""
    prompt_max_tokens: int = 15
    """see --prompt-min-tokens"""
    gen_tokens: int = 30
    """tokens sampled per continuation (fewer if EOS comes first) from the policy's distribution"""
    held_out_fraction: float = 0.2
    """prompts held out of training (TRL's example split), for --target-data validation"""

    # PPO for language models (TRL 0.11's defaults, the paper's batch settings; the KL settings are
    # the released code's: TRL's, which App. B.3 implies, are --init-kl-coef 0.2 --kl-target 6)
    batch_size: int = 256
    """episodes a round: the rollout buffer B(k)"""
    mini_batch_size: int = 1
    """episodes per optimizer step"""
    ppo_epochs: int = 4
    """passes over the (kept) buffer per round"""
    learning_rate: float = 1e-5
    """Adam learning rate"""
    rounds: Annotated[Optional[int],
                      default("one pass over the training prompts, 109 in the paper")] = None
    """training rounds"""
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
    """train LoRA adapters and the value head, not the whole model; the reference: adapters off"""
    lora_r: int = 16
    """LoRA rank"""
    lora_alpha: int = 32
    """LoRA alpha"""
    lora_target_modules: Annotated[Optional[str],
                                   default("peft's; q_proj,v_proj for GPT-Neo, as released")] = None
    """comma-separated modules for LoRA"""
    forward_batch_size: Annotated[Optional[int], default("64 on a GPU, 16 on the CPU")] = None
    """episodes per batched forward and influence pass"""
    generation_batch_size: Annotated[Optional[int],
                                     default("all, or as many as half the free GPU memory holds")] = None
    """prompts per generate() call"""

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
def up(x):
    """x in float32 at least (bfloat16 activations under mixed precision)"""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def batches(n, size):
    return [torch.arange(i, min(i + size, n)) for i in range(0, n, size)]


class Policy(nn.Module):
    """The causal LM with a value head on its last hidden state (TRL's ...WithValueHead)"""

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
            out = self.lm(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False,
                          output_hidden_states=True, logits_to_keep=T + 1)
        # logits of the last T + 1 positions, (batch, T + 1, vocab); each predicts the next token,
        # so the first T predict the continuation: (batch, T, vocab), in float32 at least
        logits = up(out.logits[:, :-1])
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, -T:, None]).squeeze(-1)  # (batch, T)
        # (batch, prompt + continuation, hidden) -> (batch, T, hidden): the same T positions
        hidden = up(out.hidden_states[-1][:, -T - 1:-1])
        return logp, self.v_head(hidden).squeeze(-1)


def autocast(policy, device):
    """bfloat16 compute for --dtype bfloat16 (torch.autocast without its cast cache); float32 runs
    unchanged"""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=policy.bf16,
                          cache_enabled=False)


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


@torch.no_grad()
def generate(policy, queries, tokenizer, args, device, width=None, **more):
    """Sample continuations of the queries: the episodes {ids, attn, mask, texts}. Rows are [left
    padding, prompt, continuation, right padding], the prompt part as wide as the longest query (or
    width); mask: the continuation up to and with its first EOS. more: more arguments of the LM's
    generate()."""
    P = max(width or 0, *map(len, queries))
    T, pad, eos = args.gen_tokens, tokenizer.pad_token_id, tokenizer.eos_token_id
    ids = torch.full((len(queries), P + T), pad, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, q in enumerate(queries):
        ids[i, P - len(q):P] = torch.tensor(q)
        attn[i, P - len(q):P] = 1
    rows = args.generation_batch_size or generation_rows(policy.lm, len(queries), P + T, device)
    for idx in batches(len(queries), rows):
        # sample from pi_theta itself: every knob a model's generation_config may set is neutralised
        with autocast(policy, device):
            out = policy.lm.generate(
                input_ids=ids[idx, :P].to(device), attention_mask=attn[idx, :P].to(device),
                do_sample=True, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0,
                repetition_penalty=1.0, no_repeat_ngram_size=0, max_new_tokens=T,
                min_new_tokens=0, pad_token_id=pad, eos_token_id=eos,
                **more)
        ids[idx, P:out.shape[1]] = out[:, P:].cpu()
    is_eos = ids[:, P:] == eos  # a call that stops early does so because every row has reached EOS
    mask = ((is_eos.cumsum(1) - is_eos.long()) == 0).float()  # no EOS before this position
    attn[:, P:] = mask.long()
    b = dict(ids=ids.to(device), attn=attn.to(device), mask=mask.to(device))
    b["texts"] = continuations(tokenizer, b)
    return b


@torch.no_grad()
def classify(model, tok, texts, device, bs=64):
    logits = []
    for i in range(0, len(texts), bs):
        inputs = tok(texts[i:i + bs], padding=True, truncation=True, return_tensors="pt")
        logits.append(model(**inputs.to(device)).logits.float())
    return torch.cat(logits)


def make_reward_fn(model, tok, label, device):
    """The reward (App. B.3): the classifier's raw label logit on each continuation alone"""
    return lambda texts, queries: classify(model, tok, texts, device)[:, label]


def continuations(tokenizer, b):
    T = b["mask"].shape[1]
    rows = zip(b["ids"][:, -T:], b["mask"])
    return [tokenizer.decode(row[:int(m.sum())], skip_special_tokens=True) for row, m in rows]


# ---- Stage I of Alg. 1: the buffer B(k), KL-shaped rewards and GAE (Sec. 2.1, TRL 0.11's PPO) ----
def rollout(policy, ref, b, kl_coef, args):
    """Stage I of Alg. 1 for language models, on generated and rewarded episodes b: log pi, V, the
    KL-shaped per-token rewards and GAE advantages at theta(k), added to b"""
    ids, attn, mask = b["ids"], b["attn"], b["mask"]
    T = mask.shape[1]
    out = []
    with torch.no_grad():
        for i in batches(len(ids), args.forward_batch_size):
            logp, v = policy(ids[i], attn[i], T)
            out.append((logp, v, ref_logprobs(policy, ref, ids[i], attn[i], T)))
    b["logprobs"], b["values"], b["ref_logprobs"] = (torch.cat(x) for x in zip(*out))
    # TRL's compute_rewards: r_t = -beta (log pi - log pi_ref)(y_t), plus r(x, y) at the last token
    kl = (b["logprobs"] - b["ref_logprobs"]) * mask
    b["kl"] = kl.sum(1)
    token_rewards = -kl_coef * kl
    b["last"] = mask.sum(1).long() - 1
    token_rewards[torch.arange(len(ids)), b["last"]] += b["rewards"]
    adv, b["returns"] = compute_gae(token_rewards, b["values"], mask, args.gamma, args.lam)
    # whitened once over the buffer, as TRL trains: scoring and training see one A_hat (iif.py's
    # f_return weights raw A_hat, as the paper's release, whose SB3 normalises per minibatch to train)
    b["advantages"] = whiten(adv, mask)
    return b


def episodes(policy, ref, prompts, kl_coef, reward_fn, tokenizer, args, device):
    """Stage I on prompts (main does the same on B(k), timing each part)"""
    b = generate(policy, prompts, tokenizer, args, device)
    b["rewards"] = reward_fn(b["texts"], prompts)
    return rollout(policy, ref, b, kl_coef, args)


def compute_gae(rewards, values, mask, gamma, lam):
    """GAE over the tokens of each continuation (Sec. 2.1); past its end, values and rewards are 0"""
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
    """TRL's masked whitening: zero mean, unit (unbiased) variance over the buffer's real tokens"""
    mean = (x * mask).sum() / mask.sum()
    var = ((x - mean) ** 2 * mask).sum() / (mask.sum() - 1).clamp(min=1)
    return (x - mean) * torch.rsqrt(var + 1e-8)


def update_kl_coef(kl_coef, kl, n_episodes, args):
    """Adaptive KL controller (Ziegler et al. 2019), as TRL's AdaptiveKLController"""
    if not args.adaptive_kl:
        return kl_coef
    error = float(np.clip(kl / args.kl_target - 1, -0.2, 0.2))
    return kl_coef * (1 + error * n_episodes / args.kl_horizon)


# ---- Stage II of Alg. 1: the target function, the influence of every episode, the filter ----
# PPO's per-update diagnostics (TRL 0.11 logs them as policy/approxkl, policy/clipfrac, val/clipfrac)
DIAGNOSTICS = ("pg_loss", "vf_loss", "approx_kl", "clip_frac", "vf_clip_frac")


def ppo_losses(policy, b, idx, args, params=None, out=None, parts=None):
    """Per-episode PPO loss l_i (Sec. 2.1, TRL's loss for LMs): token means of the clipped
    surrogate and of vf_coef x 0.5 x the clipped squared value error; a minibatch's loss is their
    mean. out: these episodes' (log pi, V), if computed; parts: gets their DIAGNOSTICS."""
    ids, attn, m = b["ids"][idx], b["attn"][idx], b["mask"][idx]
    T = m.shape[1]
    if out is None:
        out = policy(ids, attn, T) if params is None else functional_call(policy, params,
                                                                            (ids, attn, T))
    logp, v = out
    adv, old_v, ret = b["advantages"][idx], b["values"][idx], b["returns"][idx]
    ratio = torch.exp(logp - b["logprobs"][idx])
    pg1, pg2 = -adv * ratio, -adv * ratio.clamp(1 - args.cliprange, 1 + args.cliprange)
    pg = torch.max(pg1, pg2)
    v_clipped = old_v + (v - old_v).clamp(-args.cliprange_value, args.cliprange_value)
    vf1, vf2 = (v - ret) ** 2, (v_clipped - ret) ** 2
    vf = 0.5 * torch.max(vf1, vf2)
    if parts is not None:
        logr = (logp - b["logprobs"][idx]).detach()
        parts.update({k: ((x.detach() * m).sum(1) / m.sum(1)) for k, x in zip(DIAGNOSTICS, (
            pg, vf, torch.exp(logr) - 1 - logr, (pg2 > pg1).float(), (vf2 > vf1).float()))})
    return ((pg + args.vf_coef * vf) * m).sum(1) / m.sum(1)


def f_seq(logp, tb, idx):  # Sec. 5.3: the mean over episodes of log pi(y|x) x A_hat(last token)
    """f on target episodes idx of tb, with their log pi (summed over tb's batches: f(theta))"""
    w = tb["advantages"][idx].gather(1, tb["last"][idx, None]) * tb["mask"][idx] / len(tb["mask"])
    return (w * logp).sum()


def f_return(logp, tb, idx):  # Sec. 3.1: the mean over tokens, each an (s, a), of log pi x A_hat
    w = tb["advantages"][idx] * tb["mask"][idx] / tb["mask"].sum()
    return (w * logp).sum()


def target(policy, tb, idx, args):
    """--target (f_seq or f_return) on target episodes idx of tb"""
    logp = policy(tb["ids"][idx], tb["attn"][idx], tb["mask"].shape[1])[0]
    return (f_seq if args.target == "f_seq" else f_return)(logp, tb, idx)


def influence_forward_mode(policy, b, tb, args):
    """The definition, for any trained parameters (--no-lora): I_i = <grad f(theta), -grad
    l_i(theta)> of every episode i of b at theta(k) (Sec. 3.1, 5.1). One backward pass over the
    target episodes tb gives grad f, one forward-mode pass along it every episode's inner product.
    Parameters f does not reach (the value head) carry no tangent."""
    params = {n: p for n, p in policy.named_parameters() if p.requires_grad}
    grads = dict.fromkeys(params)
    for idx in batches(len(tb["ids"]), args.forward_batch_size):
        g = torch.autograd.grad(target(policy, tb, idx, args), list(params.values()),
                                allow_unused=True)
        for n, gi in zip(params, g):
            if gi is not None:
                grads[n] = gi if grads[n] is None else grads[n] + gi
    scores = []  # fused attention kernels have no forward-mode AD, the math one does
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), fwAD.dual_level():
        duals = {n: fwAD.make_dual(params[n].detach(), g) for n, g in grads.items()
                 if g is not None}
        for idx in batches(len(b["ids"]), args.forward_batch_size):
            scores.append(-fwAD.unpack_dual(ppo_losses(policy, b, idx, args, duals)).tangent)
    return torch.cat(scores)


# Sec. 5.1's ghost dot product (the same helpers in grpo_iif.py). A linear layer y = W x gets from
# one episode the gradient sum_s dy_s x_s^T over its tokens s, so <G, grad_W l_i> =
# sum_s dy_s^T G x_s: every episode's inner product with G = grad_W f comes from the layer's inputs
# and output gradients, without forming its gradient.
def trained_linears(model):
    """The nn.Linear layers whose weight trains (LoRA's A and B), or None where other parameters
    train too (a bias, embeddings, norms: the whole model)"""
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


def grad(y, io):
    """d y / d (every layer's output)"""
    return torch.autograd.grad(y, [out for _, out in io], materialize_grads=True)


def influence(policy, b, tb, args):
    """I_i = <grad f(theta(k)), -grad l_i(theta(k))> of every episode i of B(k), f measured on the
    target episodes tb (Sec. 3.1, 5.1). With LoRA, by the ghost dot product: a pass over tb gives
    G = grad_W f of every layer, a pass over B(k) every sum_s dy_s^T G x_s (row i of dy is l_i's
    alone); otherwise by the definition. The value head takes no part (f does not reach it); the
    value loss still counts through the LoRA layers it shares with the policy, so l_i keeps its value
    term (iif.py scores the policy terms only: its critic is a separate network, as in the release)."""
    layers = trained_linears(policy.lm)
    if layers is None:
        return influence_forward_mode(policy, b, tb, args)
    G = [0.0] * len(layers)
    for idx in batches(len(tb["ids"]), args.forward_batch_size):
        f, io = with_linear_io(layers, lambda: target(policy, tb, idx, args))
        G = [g + torch.einsum("...o,...i->oi", up(dy), up(x))  # sum over tokens of dy x^T
             for g, (x, _), dy in zip(G, io, grad(f, io))]
    scores = []
    for idx in batches(len(b["ids"]), args.forward_batch_size):
        out, io = with_linear_io(layers, lambda: policy(b["ids"][idx], b["attn"][idx],
                                                        b["mask"].shape[1]))
        dys = grad(ppo_losses(policy, b, idx, args, out=out).sum(), io)
        scores.append(-sum(((up(dy) @ g) * up(x)).flatten(1).sum(1)
                           for g, (x, _), dy in zip(G, io, dys)))
    return torch.cat(scores)


def filter_records(scores, method, p, gen):
    """Stage II of Alg. 1: (kept mask on the scores' device, n_negative). 'influence' drops every
    episode with influence <= 0 (p None, the released RLHF code), or the floor(p x n_negative)
    most negative; episodes tied with the first one kept stay (iif.py's rule); 'random' drops as
    many uniformly at random."""
    kept = torch.ones(len(scores), dtype=torch.bool, device=scores.device)
    n_neg = int((scores < 0).sum())
    # 1e-9: p x n_negative in floating point can fall just below a whole number (0.29 x 100)
    n_drop = int((scores <= 0).sum()) if p is None else int(p * n_neg + 1e-9)
    order = torch.argsort(scores, stable=True)
    if n_drop < len(scores):
        n_drop = int((scores < scores[order[n_drop]]).sum())
    if method == "random":
        order = torch.randperm(len(scores), generator=gen).to(scores.device)
    kept[order[:n_drop]] = False
    return kept, n_neg


# ---- Stage III of Alg. 1: PPO on the kept episodes; and the test toxicity (App. B.3) ----
def ppo_update(policy, optimizer, b, kept, args, gen, weights=None):
    """Stage III of Alg. 1: ppo_epochs passes over the kept episodes, reshuffled, mini_batch_size
    at a time (a smaller last minibatch is kept), so a filtered round takes fewer optimizer steps;
    a step's loss is the mean over its episodes of w_i x l_i. weights: each episode's loss weight
    w_i (default 1). Returns the steps taken and the means over them of the loss and the
    DIAGNOSTICS, read once the round is done (each read is a host sync)."""
    device = b["ids"].device
    kept_idx = torch.nonzero(kept.cpu()).squeeze(1)
    if len(kept_idx) == 0:  # nothing kept: no step
        return 0, dict.fromkeys(("loss", *DIAGNOSTICS), float("nan"))
    w = torch.ones(len(kept), device=device) if weights is None else weights
    stats = []
    for _ in range(args.ppo_epochs):
        perm = kept_idx[torch.randperm(len(kept_idx), generator=gen)].to(device)
        for mb in perm.split(args.mini_batch_size):
            parts = {}
            loss = (ppo_losses(policy, b, mb, args, parts=parts) * w[mb]).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            stats.append(torch.stack([loss.detach()] + [(parts[k] * w[mb]).mean() for k in DIAGNOSTICS]))
    stats = torch.stack(stats).double().cpu().numpy()
    if not np.isfinite(stats[:, 0]).all():
        raise FloatingPointError(f"non-finite PPO loss at optimizer step "
                                 f"{np.flatnonzero(~np.isfinite(stats[:, 0]))[0]} of {len(stats)}")
    return len(stats), dict(zip(("loss", *DIAGNOSTICS), stats.mean(0).tolist()))


def explained_variance(b):
    """1 - Var(R - V) / Var(R) over B(k)'s tokens at theta(k): how much of the returns the value
    head explained before the update (CleanRL's, TRL's val/var_explained)"""
    m = b["mask"] > 0
    returns, values = b["returns"][m], b["values"][m]
    return float(1 - (returns - values).var() / returns.var())


@torch.no_grad()
def test_episodes(policy, queries, tokenizer, args, device):
    """One continuation of each test prompt, sampled with a fixed seed (the training generator left
    untouched)"""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(args.seed + 10_000)
        return generate(policy, queries, tokenizer, args, device)


def toxicity(texts, clf, device):
    """App. B.3: the mean toxicity probability of continuations, by the test detector clf"""
    model, tok, toxic = clf
    return classify(model, tok, texts, device).softmax(-1)[:, toxic].mean().item()


def evaluate(policy, queries, tokenizer, clf, args, device):
    """App. B.3's test: the toxicity of sampled continuations of toxic test prompts"""
    return toxicity(test_episodes(policy, queries, tokenizer, args, device)["texts"], clf, device)


@torch.no_grad()
def final_test(policy, ref, queries, tokenizer, reward_fn, args, device):
    """The final policy where a reward-KL frontier reads it: on the test prompts, one continuation
    each (evaluate's), the KL to the reference, estimated as the kl column is (a continuation's sum
    over its tokens of log pi_theta - log pi_ref, unbiased for KL(pi_theta || pi_ref)), and the
    reward r(x, y), each a mean with its standard error. Returns (those, the test episodes)."""
    b = test_episodes(policy, queries, tokenizer, args, device)
    T = b["mask"].shape[1]
    kl = torch.cat([(up(policy(b["ids"][i], b["attn"][i], T)[0]) - up(ref_logprobs(
        policy, ref, b["ids"][i], b["attn"][i], T))).mul(b["mask"][i]).sum(1)
        for i in batches(len(queries), args.forward_batch_size)]).double()
    reward = reward_fn(b["texts"], queries).double()
    n = len(queries)
    return dict(n_test=n, final_kl=kl.mean().item(), final_kl_se=(kl.std() / n ** 0.5).item(),
                final_reward=reward.mean().item(),
                final_reward_se=(reward.std() / n ** 0.5).item()), b


# ---- The loop of Alg. 1 ----
def main(args):
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)  # minibatch order and random filtering
    device = torch.device(args.device)
    # everything is loaded before the run folder is made: a name that fails leaves nothing behind
    policy, ref, tokenizer = make_policy(args, device)
    reward_fn = make_reward_fn(*load_classifier(
        "--reward-model", args.reward_model, "--reward-label", args.reward_label, device), device)
    train_prompts, val_prompts = load_prompts(args, tokenizer)
    if args.eval_every:
        eval_clf = load_classifier("--eval-reward-model", args.eval_reward_model,
                                   "--eval-toxic-label", args.eval_toxic_label, device)
        eval_prompts = load_eval_prompts(args, tokenizer)
    n_rounds = args.rounds or len(train_prompts) // args.batch_size
    optimizer = make_optimizer(policy, args, device)
    run = Run(args, n_rounds, policy, device)
    kl_coef, order = args.init_kl_coef, []  # beta, and the prompts not yet drawn
    try:
        for k in range(n_rounds):
            if len(order) < args.batch_size:  # one pass over the shuffled prompts, then another
                order = order + torch.randperm(len(train_prompts), generator=gen).tolist()
            queries = [train_prompts[i] for i in order[:args.batch_size]]
            order = order[args.batch_size:]

            # Stage I (Alg. 1): the buffer B(k) of episodes generated by the policy at theta(k)
            t0 = timer(device)
            b = generate(policy, queries, tokenizer, args, device)
            b["rewards"] = reward_fn(b["texts"], queries)  # r(x, y), one number an episode
            t1 = timer(device)
            rollout(policy, ref, b, kl_coef, args)
            t2 = timer(device)

            # Stage II (Alg. 1): score every episode at theta(k) (Sec. 5.1, 5.3), drop harmful ones
            scores, kept, n_negative = None, torch.ones(args.batch_size, dtype=torch.bool), ""
            if args.filter_method != "none":
                tb = b  # the target episodes: B(k), or the released code's fresh held-out ones
                if args.target_data == "validation":
                    tb = episodes(policy, ref, val_prompts, kl_coef, reward_fn, tokenizer, args,
                                  device)
                scores = influence(policy, b, tb, args)
                if not torch.isfinite(scores).all():
                    fail(f"round {k}: non-finite influence scores; lower --learning-rate")
                kept, n_negative = filter_records(scores, args.filter_method, args.filter_p, gen)
            t3 = timer(device)

            # Stage III (Alg. 1): PPO on the kept episodes, then the adaptive KL step on all of B(k)
            try:
                n_updates, stats = ppo_update(policy, optimizer, b, kept, args, gen)
            except FloatingPointError as e:
                fail(f"round {k}: {e}; lower --learning-rate")
            t4 = timer(device)
            kl = b["kl"].mean().item()
            row = dict(round=k, episodes=(k + 1) * args.batch_size,
                       reward_mean=b["rewards"].mean().item(), reward_std=b["rewards"].std().item(),
                       kl=kl, kl_coef=kl_coef, n_kept=int(kept.sum()), n_negative=n_negative,
                       n_updates=n_updates, **stats, explained_var=explained_variance(b),
                       eval_toxicity="", t_generate=t1 - t0, t_forward=t2 - t1,
                       t_influence=t3 - t2, t_optim=t4 - t3, t_eval=0.0)
            kl_coef = update_kl_coef(kl_coef, kl, args.batch_size, args)

            if args.eval_every and (k + 1) % args.eval_every == 0:  # test toxicity (App. B.3)
                t0 = timer(device)
                row["eval_toxicity"] = evaluate(policy, eval_prompts, tokenizer, eval_clf, args,
                                                device)
                row["t_eval"] = timer(device) - t0
            run.end_round(row, b, queries, scores, kept, tokenizer)
        if args.eval_every:  # the final policy's KL to the reference, reward and toxicity
            final, tb = final_test(policy, ref, eval_prompts, tokenizer, reward_fn, args, device)
            run.final(final, final_toxicity=toxicity(tb["texts"], eval_clf, device))
    finally:  # also on Ctrl-C (mid-round, the weights as they are then)
        run.finish(policy, tokenizer)


# =================================================================================================
# Everything Alg. 1 needs stands above. Below, what a first reading may skip: generation in
# batches, loading the models and data with clear errors, the flag checks and the run folder.
# =================================================================================================


# ---- Plumbing: generation in batches that fit ----
def generation_rows(lm, n, length, device):
    """Prompts per generate() call by default: all n, or on a GPU as many as half its free memory
    holds (a row's KV cache and activations, bounded in float32)"""
    cfg = lm.config
    if device.type != "cuda":
        return n
    row = 4 * length * cfg.hidden_size * (2 * cfg.num_hidden_layers + 8) + 8 * cfg.vocab_size
    return int(max(1, min(n, torch.cuda.mem_get_info(device)[0] // 2 // row)))


# ---- Plumbing: loading the models and data, with errors that name the flag; the optimizer ----
def fail(msg):
    raise SystemExit(f"{os.path.basename(sys.argv[0])}: error: {msg}")


def load(flag, name, loader, *a, **kw):
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


def load_prompts(args, tokenizer, rest=False):
    """Prompts with toxicity > 0.3 (TRL's example, which App. B.3 follows), each the first 10-15 tokens
    (App. B.3) of prompt + continuation text (TRL's), training and held out (rest: with what follows)"""
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
            prompts.append((ids[:n], ids[n:]) if rest else ids[:n])
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


def make_optimizer(policy, args, device):
    """Adam on what trains; on CUDA fused (one kernel for every tensor)"""
    return torch.optim.Adam([p for p in policy.parameters() if p.requires_grad],
                            lr=args.learning_rate, fused=device.type == "cuda" or None)


# ---- Plumbing: the flags, the run folder and timing ----
def resolve_args(args, resuming=False):
    """Check every flag before anything is loaded; fail early with the flag's name. resuming: the
    run folder may hold the run (rlhf_variants.py --resume)."""
    if args.track and not importlib.util.find_spec("wandb"):
        fail("--track needs wandb: pip install wandb")
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
    args.forward_batch_size = args.forward_batch_size or (64 if gpu else 16)
    for key in ("batch_size", "mini_batch_size", "ppo_epochs", "gen_tokens", "prompt_min_tokens",
                "forward_batch_size", "generation_batch_size", "validation_size", "eval_samples",
                "eval_max_prompt_tokens", "lora_r", "kl_horizon", "rounds"):
        if getattr(args, key) is not None and getattr(args, key) < 1:
            fail(f"--{key.replace('_', '-')} must be at least 1, got {getattr(args, key)}")
    for ok, msg in [
        (args.prompt_max_tokens >= args.prompt_min_tokens, "--prompt-max-tokens must be at least "
         f"--prompt-min-tokens, got {args.prompt_max_tokens} < {args.prompt_min_tokens}"),
        (args.mini_batch_size <= args.batch_size, f"--mini-batch-size ({args.mini_batch_size}) "
         f"must be at most --batch-size ({args.batch_size})"),
        (args.eval_every >= 0, f"--eval-every must be 0 (never) or more, got {args.eval_every}"),
        (args.filter_p is None or 0 < args.filter_p <= 1,
         f"--filter-p must be in (0, 1], got {args.filter_p}"),
        (0 <= args.held_out_fraction < 1,
         f"--held-out-fraction must be in [0, 1), got {args.held_out_fraction}"),
        (args.init_kl_coef >= 0 and args.vf_coef >= 0,
         "--init-kl-coef and --vf-coef must be at least 0"),
]:
        if not ok:
            fail(msg)
    for key in ("learning_rate", "kl_target", "cliprange", "cliprange_value"):
        if not getattr(args, key) > 0:
            fail(f"--{key.replace('_', '-')} must be positive, got {getattr(args, key)}")
    args.run_name = args.run_name or f"rlhf__{args.filter_method}__{args.seed}__{int(time.time())}"
    run_dir = os.path.join(args.runs_dir, args.run_name)
    if os.path.exists(os.path.join(run_dir, "metrics.csv")) and not resuming:
        fail(f"{run_dir}/metrics.csv exists: choose another --run-name or remove it")
    return args


METRICS = ["round", "episodes", "reward_mean", "reward_std", "kl", "kl_coef", "n_kept",
           "n_negative", "loss", "n_updates", "eval_toxicity", "t_generate", "t_forward",
           "t_influence", "t_optim", "t_eval", *DIAGNOSTICS, "explained_var"]


# TensorBoard: TRL 0.11's PPOTrainer names for metrics.csv's columns, and IIF's under iif/
SCALARS = {"objective/kl": "kl", "objective/kl_coef": "kl_coef", "ppo/mean_scores": "reward_mean",
           "ppo/std_scores": "reward_std", "env/reward_mean": "reward_mean",
           "env/reward_std": "reward_std", "ppo/loss/total": "loss", "ppo/loss/policy": "pg_loss",
           "ppo/loss/value": "vf_loss", "ppo/policy/approxkl": "approx_kl",
           "ppo/policy/clipfrac": "clip_frac", "ppo/val/clipfrac": "vf_clip_frac",
           "ppo/val/var_explained": "explained_var", "iif/n_kept": "n_kept",
           "iif/n_negative": "n_negative", "iif/eval_toxicity": "eval_toxicity",
           "iif/eval_accuracy": "eval_accuracy", "iif/influence_seconds": "t_influence"}


class Run:
    """<runs-dir>/<run-name>/: config.json, metrics.csv (a row per round), episodes.jsonl (every
    episode, its reward, influence and fate; hence a class, which rlhf_variants.py reuses), flushed
    as written; at the end, the policy and its value head."""

    def __init__(self, args, n_rounds, policy, device, columns=METRICS):
        self.args, self.n_rounds = args, n_rounds
        self.dir = os.path.join(args.runs_dir, args.run_name)
        os.makedirs(self.dir, exist_ok=True)
        with open(os.path.join(self.dir, "config.json"), "w") as f:
            json.dump(vars(args), f, indent=1)
        n = sum(p.numel() for p in policy.parameters() if p.requires_grad)
        print(f"{args.model_name} ({n:,} trainable parameters) on {device}, {args.dtype}"
              f": {n_rounds} rounds of {args.batch_size} "
              f"episodes, filter {args.filter_method}, target {args.target} on {args.target_data}"
              f" -> {self.dir}")
        self.metrics_file = open(os.path.join(self.dir, "metrics.csv"), "w", newline="")
        self.writer = csv.DictWriter(self.metrics_file, fieldnames=columns)
        self.writer.writeheader()
        self.episodes_file = open(os.path.join(self.dir, "episodes.jsonl"), "w")
        if args.track:  # wandb, imported only when asked
            import wandb
            wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, name=args.run_name,
                       sync_tensorboard=True, config=vars(args))
        from torch.utils.tensorboard import SummaryWriter
        self.writer_tb = SummaryWriter(self.dir)  # TRL's PPO names, and IIF's under iif/

    def end_round(self, row, b, queries, scores, kept, tokenizer, **fields):
        """Write the round's row and episodes (fields: more per-episode lists); print its line"""
        k = row["round"]
        self.writer.writerow(row)
        self.metrics_file.flush()
        fields = dict(reward=b["rewards"].tolist(), influence=[None] * len(kept) if scores is None
                      else scores.tolist(), kept=kept.tolist(), **fields)
        for i, text in enumerate(b["texts"]):
            episode = dict(round=k, prompt=tokenizer.decode(queries[i]), continuation=text,
                           **{name: values[i] for name, values in fields.items()})
            self.episodes_file.write(json.dumps(episode) + "\n")
        self.episodes_file.flush()
        for tag, key in SCALARS.items():
            if row.get(key, "") not in ("", None):
                self.writer_tb.add_scalar(tag, row[key], k)
        if scores is not None:
            self.writer_tb.add_histogram("iif/influence", scores.float().cpu(), k)
        tox = "" if row.get("eval_toxicity", "") == "" else f" toxicity {row['eval_toxicity']:.3f}"
        print(f"round {k} [{k + 1}/{self.n_rounds}] reward {row['reward_mean']:.3f} kl "
              f"{row['kl']:.3f} beta {row['kl_coef']:.4f} | kept {row['n_kept']}/"
              f"{self.args.batch_size}{tox} | s: generate {row['t_generate']:.1f} forward "
              f"{row['t_forward']:.1f} influence {row['t_influence']:.1f} optim "
              f"{row['t_optim']:.1f}", flush=True)

    def final(self, final, **metrics):
        """final.json: final_test's row and the task's test metrics on the same samples"""
        final = {**final, **metrics}
        with open(os.path.join(self.dir, "final.json"), "w") as f:
            json.dump(final, f, indent=1)
        print(f"final policy on {final['n_test']} test prompts: KL to the reference "
              f"{final['final_kl']:.3f} +- {final['final_kl_se']:.3f} (s.e.), reward "
              f"{final['final_reward']:.3f} +- {final['final_reward_se']:.3f}, "
              + ", ".join(f"{k} {v:.3f}" for k, v in metrics.items() if v != ""), flush=True)

    def finish(self, policy, tokenizer):
        """The policy and value head, unless a non-finite loss has spoilt them"""
        if all(p.isfinite().all() for p in policy.parameters() if p.requires_grad):
            policy.lm.save_pretrained(os.path.join(self.dir, "policy"))  # LoRA: the adapter only
            tokenizer.save_pretrained(os.path.join(self.dir, "policy"))
            torch.save(policy.v_head.state_dict(), os.path.join(self.dir, "value_head.pt"))
        self.metrics_file.close()
        self.episodes_file.close()
        self.writer_tb.close()


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
        sys.exit(f"\ninterrupted: every finished round is in {run_dir}/metrics.csv "
                 "(research/rlhf_variants.py writes checkpoints and resumes)")
