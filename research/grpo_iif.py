r"""GRPO with Iterative Influence-based Filtering (IIF), on TRL's GRPOTrainer, in one file.

The detoxification setup of rlhf_iif.py, trained with GRPO: a causal LM continues toxic prompts, a
classifier's label logit on the continuation is the reward, and each prompt gets --num-generations
completions whose advantages are their rewards normalised within the group. A record is one
completion; the buffer B(k) is one generation batch. Alg. 1 runs once per generation batch in
IIFGRPOTrainer._generate_and_score_completions: Stage I is TRL's generation, Stage II scores every
completion by its influence on a target f and drops the harmful ones, Stage III is TRL's GRPO
update on the rest. In a TRL script of your own, IIFGRPOTrainer replaces GRPOTrainer (docs/grpo.md).

    python research/grpo_iif.py --filter-method influence              # the paper's models, from the hub
    accelerate launch research/grpo_iif.py --filter-method influence   # several GPUs or nodes (DDP, FSDP2)
    T=results/rlhf_toy_task; python benchmarks/rlhf_toy_task.py --out $T   # offline, on a CPU:
    python research/grpo_iif.py --model-name $T/policy --reward-model $T/reward --dataset $T/prompts.jsonl \
        --batch-size 64 --learning-rate 3e-4 --beta 0.2 --max-steps 240 --use-cpu --threads 1
"""
import contextlib
import csv
import json
import os
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Annotated, Literal, Optional

import numpy as np
import torch
import torch.autograd.forward_ad as fwAD
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

try:  # tyro reads the flags (main); the trainer alone needs only TRL's dependencies
    from tyro.conf import arg
    STATED = arg(help_behavior_hint=lambda default: "")  # a None flag's real default is in its help
except ImportError:
    STATED = None


@dataclass
class Args:
    model_name: str = "EleutherAI/gpt-neo-2.7B"
    """policy: a causal LM, a hub name or a local folder (the KL reference is its initial state)"""
    reward_model: str = "facebook/roberta-hate-speech-dynabench-r4-target"
    """classifier whose --reward-label logit on the completion alone is the reward"""
    reward_label: str = "nothate"
    """label of --reward-model whose raw logit is the reward"""
    dataset: str = "allenai/real-toxicity-prompts"
    """prompts: a hub dataset or a .json/.jsonl file with fields prompt.text, prompt.toxicity,
    continuation.text (TRL's example, App. B.3: toxicity > 0.3, the first 10-15 tokens, a fifth held out)"""
    seed: int = 1
    """seed of TRL (sampling, prompt order), the prompt split and the random filter"""
    run_name: Annotated[Optional[str], STATED] = None
    """results go to <runs-dir>/<run-name>/ (default: grpo__method__seed__time)"""
    runs_dir: str = "runs"
    """parent folder of the run folders"""
    use_cpu: bool = False
    """train on the CPU even where a GPU is visible"""
    dtype: Annotated[Optional[Literal["bfloat16", "float32"]], STATED] = None
    """bfloat16: TRL's bf16 mixed precision, frozen weights in bfloat16 with LoRA, scores in
    float32 (default: bfloat16 on a GPU that has it, else float32)"""
    threads: Annotated[Optional[int], STATED] = None
    """torch CPU threads (default: torch's choice)"""
    report_to: str = "none"
    """TRL's trackers: tensorboard, trackio, wandb, ... (comma-separated), all, none"""
    logging_steps: int = 1
    """TRL logs every N optimizer steps"""

    # GRPO (TRL's GRPOConfig, see make_config)
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
    max_steps: Annotated[Optional[int], STATED] = None
    """optimizer steps (default: one pass over the training prompts)"""
    gen_tokens: int = 30
    """tokens sampled per completion, fewer if EOS comes first (temperature 1, no top-k/top-p)"""
    learning_rate: float = 1e-5
    """AdamW learning rate (constant)"""
    beta: float = 0.04
    """coefficient of the KL penalty to the reference (TRL's default is 0: no reference)"""
    epsilon: float = 0.2
    """clipping epsilon of the policy ratio"""
    lora: bool = True
    """train LoRA adapters (the reference: the model with them disabled), or the whole model"""
    lora_r: int = 16
    """LoRA rank"""
    lora_alpha: int = 32
    """LoRA alpha"""
    lora_target_modules: Annotated[Optional[str], STATED] = None
    """comma-separated module names for LoRA (default: peft's choice for the architecture)"""

    # influence and filtering (Sec. 3.1, 5.1, 5.3)
    filter_method: Literal["influence", "random", "none"] = "influence"
    """influence: IIF; random: drop as many completions as IIF would, at random; none: plain GRPO"""
    filter_p: Annotated[Optional[float], STATED] = None
    """fraction in (0, 1] of the negative-influence completions to drop, most negative first
    (default: drop every completion with influence <= 0, as the released code does)"""
    target: Literal["f_seq", "f_loss"] = "f_seq"
    """f_seq (Sec. 5.3: mean of A_hat log pi(y|x)) or f_loss (minus the GRPO loss, KL included)"""
    forward_batch_size: Annotated[Optional[int], STATED] = None
    """completions per scoring pass (default: 64 on a GPU, 16 on the CPU)"""


def make_config(args, **kw):
    """GRPO's settings (kw: others of GRPOConfig), where IIFGRPOTrainer reads beta, epsilon, bf16
    and the seed. GRPOConfig's own defaults differ from TrainingArguments' (bf16, activation
    checkpointing, lr 1e-6): every one that matters is here."""
    gpu = torch.cuda.is_available() and not args.use_cpu
    return GRPOConfig(
        output_dir=os.path.join(args.runs_dir, args.run_name), seed=args.seed, use_cpu=not gpu,
        bf16=args.dtype == "bfloat16", fp16=False, activation_checkpointing=False,
        disable_dropout=True,  # generation, the update and the influence all see one policy
        learning_rate=args.learning_rate, lr_scheduler_type="constant",
        max_steps=args.max_steps or -1, num_train_epochs=1,
        per_device_train_batch_size=args.mini_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        generation_batch_size=args.batch_size, num_generations=args.num_generations,
        num_iterations=args.num_iterations, max_completion_length=args.gen_tokens,
        temperature=1.0, top_p=1.0, top_k=0, min_p=None, repetition_penalty=1.0,  # pi_theta itself
        # "dapo": the token normaliser spans the generation batch, so a completion's share of the
        # loss does not depend on which micro-batch it falls into (keep_only relies on it; the
        # trainer refuses the other loss types)
        beta=args.beta, epsilon=args.epsilon, loss_type="dapo", scale_rewards="group",
        use_bias_correction_kl=True, mask_truncated_completions=False, use_vllm=False,
        logging_steps=args.logging_steps, report_to=args.report_to.split(","),
        run_name=args.run_name, log_completions=False, **{"save_strategy": "no", **kw})


# ---- The reward (App. B.3), and a completion's log-probabilities and GRPO loss (TRL's) ----
def make_reward_fn(model, tok, label):
    def label_logit(prompts, completions, **kwargs):  # the label's logit on the completion alone
        return classify(model, tok, completions)[:, label].tolist()
    return label_logit  # TRL logs its mean as rewards/label_logit/mean


def completion_logprobs(model, b, idx, params=None, bf16=False):
    """log pi_theta(y_t | x, y_<t) of every completion token of rows idx, as TRL's forward computes
    them (left-padded prompt, right-padded completion, temperature 1); float32 at least"""
    m = b["completion_mask"][idx]
    ids = torch.cat([b["prompt_ids"][idx], b["completion_ids"][idx]], 1)
    kw = dict(input_ids=ids, attention_mask=torch.cat([b["prompt_mask"][idx], m], 1),
              logits_to_keep=m.shape[1] + 1)
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=bf16):  # as TRL's bf16
        logits = (model(**kw) if params is None else functional_call(model, params, (), kw)).logits
    logits = up(logits[:, :-1])
    return torch.log_softmax(logits, -1).gather(-1, ids[:, -m.shape[1]:, None]).squeeze(-1)


def completion_losses(model, b, idx, args, params=None, logp=None):
    """Per-completion GRPO loss l_i (TRL's "dapo" loss): the token sum of the clipped surrogate and
    of beta x the k3 estimate of KL(pi || pi_ref) times the ratio (use_bias_correction_kl), over the
    generation batch's token count; summed over the batch, the loss of one step on all of it."""
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


# ---- Stage II of Alg. 1: the target function, the influence of every completion, the filter ----
def target(model, t, idx, args, world=1, logp=None):
    """f on target completions idx; summed over t's batches and the world processes' shares: f"""
    if logp is None:
        logp = completion_logprobs(model, t, idx, bf16=args.dtype == "bfloat16")
    if args.target == "f_seq":  # Sec. 5.3: mean over completions of A_hat log pi(y|x)
        return ((t["advantages"][idx, None] * logp * t["completion_mask"][idx]).sum()
                / (len(t["advantages"]) * world))
    return -completion_losses(model, t, idx, args, logp=logp).sum()  # f_loss: minus the GRPO loss


def influence_forward_mode(model, b, t, args, world=1, all_sum=lambda g: g):
    """The definition, for any trained parameters (--no-lora; whole parameters on every process):
    I_i = <grad f(theta), -grad l_i(theta)> of every completion i of b at theta(k) (Sec. 3.1, 5.1).
    One backward pass over the target completions t gives grad f (all_sum adds the processes'
    shares), one forward-mode pass along it gives every completion's inner product."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    grads = [torch.zeros_like(p) for p in params.values()]
    for idx in batches(len(t["advantages"]), args.forward_batch_size):
        g = torch.autograd.grad(target(model, t, idx, args, world), list(params.values()),
                                allow_unused=True)
        grads = [a if gi is None else a + gi for a, gi in zip(grads, g)]
    grads = all_sum(torch.cat([g.flatten() for g in grads])).split([p.numel() for p in grads])
    scores = []  # fused attention kernels have no forward-mode AD, the math one does
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), fwAD.dual_level():
        duals = {n: fwAD.make_dual(p.detach(), g.view_as(p))
                 for (n, p), g in zip(params.items(), grads)}
        for idx in batches(len(b["advantages"]), args.forward_batch_size):
            scores.append(-fwAD.unpack_dual(completion_losses(model, b, idx, args, duals)).tangent)
    return torch.cat(scores)


def influence(model, b, t, args, world=1, all_sum=lambda g: g):
    """The same scores, fast, from LoRA layers' activations (influence_forward_mode otherwise). A
    linear layer y = W x gets from one completion the gradient sum_s dy_s x_s^T over its tokens s,
    so <G, grad_W l_i> = sum_s dy_s^T G x_s, G = grad_W f. No parameter is read (sharded ones give
    the same scores); processes exchange only G. Target on the batch: one forward and backward pass
    of the losses gives every g_i (row i of dy is l_i's alone); with beta = 0 or f_loss, G is a
    multiple of their sum at theta(k), else a second backward pass, of f, gives it. Another target
    t, or gradients too large to keep: a pass over t for G, then one over b."""
    layers = trained_linears(model)
    if layers is None:
        return influence_forward_mode(model, b, t, args, world=world, all_sum=all_sum)
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
        dys = grad(completion_losses(model, b, idx, args, logp=logp).sum(), io,
                   retain=one_pass and not proportional)
        if not one_pass:
            scores.append(-sum(((up(dy) @ g) * up(x)).flatten(1).sum(1)
                               for g, (x, _), dy in zip(G, io, dys)))
            continue
        grads.append([torch.einsum("b...o,b...i->boi", up(dy), up(x))
                      for (x, _), dy in zip(io, dys)])
        if not proportional:  # f's share of G, from the same forward pass
            G = add_to_G(G, io, grad(target(model, b, idx, args, world, logp=logp), io))
    if one_pass:
        if proportional:  # at theta(k), ratio 1: grad f_seq = -(tokens / (n x processes)) x
            # sum_i grad l_i when beta = 0, and f_loss = -sum_i l_i
            c = -1.0 if args.target == "f_loss" else -float(b["num_items_in_batch"]) / (
                len(b["advantages"]) * world)
            G = [c * sum(gs[j].sum(0) for gs in grads) for j in range(len(layers))]
        G = reduce(G)
        scores = [-sum((g * gi).flatten(1).sum(1) for g, gi in zip(G, gs)) for gs in grads]
    return torch.cat(scores)


def filter_records(scores, method, p, gen):
    """Stage II of Alg. 1: (kept mask on the scores' device, n_negative). 'influence' drops every
    completion with influence <= 0 (p None, the released RLHF code), or the floor(p x n_negative)
    most negative; completions tied with the first one kept stay (iif.py's rule); 'random' drops
    as many uniformly at random."""
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


# ---- Alg. 1 on TRL's GRPOTrainer: Stage I (generation) and Stage III (the update) are TRL's ----
class IIFGRPOTrainer(GRPOTrainer):
    """GRPOTrainer that filters every generation batch before its update: GRPOTrainer's arguments and
    IIF's filter_method, filter_p, target, forward_batch_size (Args'; iif_args: the command line's).
    It overrides _generate_and_score_completions (Alg. 1) and two more of TRL's (tests pin them)."""

    def __init__(self, *a, filter_method="influence", filter_p=None, target="f_seq",
                 forward_batch_size=None, iif_args=None, **kw):
        iif_args = iif_args or checked_keywords(filter_method, filter_p, target, forward_batch_size)
        super().__init__(*a, **kw)
        self.iif_args, self.columns = settings_from_config(self, iif_args), METRICS
        self.iif_gen = torch.Generator().manual_seed(self.iif_args.seed)  # the same on every process
        self.rounds_done, self.row, self.writer = 0, None, None  # writer: on the main process
        self.t_gen, self.rewards = 0.0, None  # the generation batch's generation time and rewards
        self.step_losses, self.logged = [], {}  # its steps' losses and TRL's metrics of them
        # optimizer steps a generation batch is trained for; its metrics.csv row follows the last
        self.steps_per_batch = (self.args.steps_per_generation * self.num_iterations
                                // self.args.gradient_accumulation_steps)
        self.add_callback(WriteRow(self))

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

    def compute_loss(self, model, inputs, *a, **kw):
        """TRL's loss of a micro-batch; it and the metrics TRL logs of it (DIAGNOSTICS) are kept for
        the generation batch's row, since TRL clears its own at every log"""
        loss = super().compute_loss(model, inputs, *a, **kw)
        if model.training:
            self.step_losses.append(loss.detach())
            for key in DIAGNOSTICS.values():
                if self._metrics["train"].get(key):
                    self.logged.setdefault(key, []).append(self._metrics["train"][key][-1])
        return loss

    def _generate_and_score_completions(self, inputs):
        # Stage I (Alg. 1): generation batch B(k) at theta(k): completions, rewards, advantages
        t0, self.t_gen = timer(), 0.0
        b = super()._generate_and_score_completions(inputs)
        rewards, t_generate = self.rewards[:, 0], self.t_gen
        t_forward = timer() - t0 - t_generate  # TRL's reference (and old) log-probs

        # Stage II (Alg. 1): score every completion at theta(k) (Sec. 5.1, 5.3), drop harmful ones
        t0 = timer()
        kept, scores = self.score_and_filter(b)
        if self.iif_args.filter_method != "none":
            b = keep_only(self, b, kept)
        self.t_stage2_end = timer()
        n_negative = None if scores is None else int((scores < 0).sum())
        for key, value in [("iif/kept_fraction", float(kept.float().mean())), ("iif/n_kept", int(kept.sum())),
                           ("iif/n_negative", n_negative),
                           ("iif/influence_seconds", self.t_stage2_end - t0)]:  # to --report-to
            if value is not None:
                self._metrics["train"][key].append(value)
        self.row = dict(round=self.rounds_done, step=self.state.global_step, completions=len(rewards),
                        reward_mean=rewards.nanmean().item(), reward_std=rewards.std().item(),
                        n_kept=int(kept.sum()),
                        n_negative="" if n_negative is None else n_negative,
                        t_generate=t_generate, t_forward=t_forward,
                        t_influence=self.t_stage2_end - t0)
        self.rounds_done += 1
        # Stage III (Alg. 1) follows: TRL's GRPO steps on the kept completions of b
        return b

    def score_and_filter(self, b, t=None):
        """Every process scores its share of b against the target completions t (default: b) at
        theta(k); all scores, gathered, are filtered. Returns the kept mask and the scores."""
        args, acc = self.iif_args, self.accelerator
        if args.filter_method == "none":
            return torch.ones(len(self.rewards), dtype=torch.bool), None
        model = acc.unwrap_model(self.model)
        with dropout_off_random_state_kept(model):  # TRL's update draws what it would without IIF
            scores = influence(model, b, b if t is None else t, args, world=acc.num_processes,
                               all_sum=lambda g: acc.reduce(g, reduction="sum"))
        scores = acc.gather(scores).cpu()
        if not torch.isfinite(scores).all():
            fail(f"generation batch {self.rounds_done}: non-finite influence; lower --learning-rate")
        return filter_records(scores, args.filter_method, args.filter_p, self.iif_gen)[0], scores

    def write_row(self, r):
        """The generation batch's metrics.csv row, flushed, and its progress line"""
        if self.writer is not None:
            self.writer[0].writerow(r)
            self.writer[1].flush()
            test = "".join(f" test {k[5:]} {v:.3f}" for k, v in r.items() if k[:5] == "eval_")
            print(f"generation batch {r['round']} reward {r['reward_mean']:.3f} | kept "
                  f"{r['n_kept']}/{r['completions']}{test} | s: generate {r['t_generate']:.1f} "
                  f"influence {r['t_influence']:.1f} optim {r['t_optim']:.1f}", flush=True)


class WriteRow(TrainerCallback):
    """A generation batch's metrics.csv row, once its update (Stage III) is over"""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kw):
        t = self.trainer
        if t.row is not None and (state.global_step % t.steps_per_batch == 0
                                  or state.global_step >= state.max_steps):
            t.row["t_optim"] = timer() - t.t_stage2_end
            t.row["loss"] = torch.stack(t.step_losses).mean().item() if t.step_losses else ""
            t.row.update({col: np.mean(t.logged[key]) if key in t.logged else ""
                          for col, key in DIAGNOSTICS.items()})
            t.step_losses, t.logged = [], {}
            t.write_row(t.row)
            t.row = None


# ---- main: TRL's training loop, Alg. 1 in every generation batch ----
def main(args, trainer=None):
    if args.threads:
        torch.set_num_threads(args.threads)
    trainer = trainer or make_trainer(args)  # a name that cannot be loaded stops here
    acc = trainer.accelerator
    run_dir = os.path.join(args.runs_dir, args.run_name)
    acc.wait_for_everyone()  # every process has checked the run folder before it is written
    if acc.is_main_process:
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, "config.json"), "w") as f:
            json.dump(vars(args), f, indent=1)
        trainer.writer = open_metrics(run_dir, trainer.rounds_done, trainer.columns)
        n_trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        print(f"{args.model_name} ({n_trainable:,} trainable parameters) on {acc.device} x "
              f"{acc.num_processes} ({acc.distributed_type.value}): generation batches of "
              f"{args.batch_size}, filter {args.filter_method}, target {args.target} -> {run_dir}"
              + (f", after {trainer.rounds_done} generation batches" if trainer.rounds_done else ""),
              flush=True)
    try:  # Alg. 1 in every generation batch, inside TRL's loop
        trainer.train()
        trainer.save_model(os.path.join(run_dir, "policy"))  # the adapter only, with LoRA
    finally:  # also on Ctrl-C: every finished generation batch is in metrics.csv
        if trainer.writer is not None:
            trainer.writer[1].close()
    return trainer


# =================================================================================================
# Everything Alg. 1 needs stands above. Below, what a first reading may skip: how dropped
# completions leave TRL's batch, the trainer's settings checked, the scoring's helpers, loading
# the models and data with clear errors, the flag checks and the run folder.
# =================================================================================================


# ---- Plumbing: Stage II's dropped completions taken out of TRL's batch ----
def keep_only(trainer, b, kept):
    """This process's share of b without the dropped completions, so TRL's update never computes
    them; TRL's optimizer steps stay as many, and the "dapo" normaliser counts every process's kept
    tokens. Every process keeps as many rows as the one with most kept, rounded up to whole
    micro-batches, so all make the same passes (DDP, FSDP): rows added are dropped ones, masked."""
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


# ---- Plumbing: IIF's settings, checked at construction; the scoring's guard ----
def checked_keywords(filter_method, filter_p, target, forward_batch_size):
    """IIFGRPOTrainer's keywords as Args, or an error naming the setting and its allowed values"""
    for ok, msg in [
        (filter_method in ("influence", "random", "none"),
         f"filter_method must be 'influence', 'random' or 'none', got {filter_method!r}"),
        (filter_p is None or 0 <= filter_p <= 1, f"filter_p must be None or in [0, 1], got {filter_p!r}"),
        (filter_p is None or filter_method != "none", "filter_p is for filter_method influence or random"),
        (target in ("f_seq", "f_loss"), f"target must be 'f_seq' or 'f_loss', got {target!r}"),
        (forward_batch_size is None or forward_batch_size >= 1,
         f"forward_batch_size must be None or at least 1, got {forward_batch_size!r}")]:
        if not ok:
            raise ValueError(f"IIFGRPOTrainer: {msg}")
    return Args(filter_method=filter_method, filter_p=filter_p, target=target,
                forward_batch_size=forward_batch_size)


def settings_from_config(trainer, a):
    """IIF's settings a, with beta, epsilon, bf16 and the seed the trainer's GRPOConfig's; an error
    naming a setting under which the scores would not be those of TRL's loss; the scoring's path"""
    c, acc = trainer.args, trainer.accelerator
    a.beta, a.epsilon, a.seed, a.dtype = c.beta, c.epsilon, c.seed, "bfloat16" if c.bf16 else "float32"
    a.forward_batch_size = a.forward_batch_size or (64 if acc.device.type == "cuda" else 16)
    model, kind = acc.unwrap_model(trainer.model), acc.distributed_type.value
    trainer.sharded, layers = kind in ("FSDP", "DEEPSPEED"), trained_linears(model)
    for bad, msg in [
        (c.loss_type != "dapo", f"loss_type={c.loss_type!r}: a completion's share of it depends on its "
         "micro-batch and on the completions dropped; use 'dapo' (TRL's default, one normaliser a batch)"),
        (c.importance_sampling_level != "token", "importance_sampling_level must be 'token' (the scores')"),
        (c.top_entropy_quantile < 1, "top_entropy_quantile must be 1.0: the scores count every token"),
        (c.temperature != 1, "temperature must be 1.0: the scores are of pi_theta at temperature 1"),
        (c.beta and not c.use_bias_correction_kl, "use_bias_correction_kl must be True with beta > 0"),
        (c.entropy_coef or c.use_adaptive_entropy, "entropy_coef must be 0: no entropy bonus in the scores"),
        (c.fp16, "fp16 must be False: the scores are float32, or under autocast with bf16"),
        (c.use_vllm, "use_vllm must be False: vLLM's importance-sampling correction is not in the scores"),
        (getattr(trainer, "tools", None), "tools must be None: the scores count the tools' output tokens"),
        (trainer.sharded and a.filter_method != "none" and layers is None, f"filter_method "
         f"{a.filter_method!r} under {kind} scores from trained linear layers' activations alone, as "
         "parameters may be sharded; here others train too (no LoRA, or LoRA on embeddings or biases)."
         " Use LoRA on linear layers (peft_config, --lora), DDP, or filter_method 'none'")]:
        if bad:
            raise ValueError(f"IIFGRPOTrainer: {msg}")
    if a.filter_method in ("influence", "random") and acc.is_main_process:  # said once
        print("IIF: influence " + ("from the LoRA layers' activations" if layers else "in forward mode "
                                   "over every trained parameter (no LoRA: slower)"), flush=True)
        if any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()):
            warnings.warn("disable_dropout=False: TRL's update trains with dropout, the influence "
                          "is scored without it (disable_dropout=True: the same policy)", stacklevel=3)
    return a


@contextlib.contextmanager
def dropout_off_random_state_kept(model):
    """Dropout off; then every module's train/eval mode and the global random state as they were"""
    modes = [(m, m.training) for m in model.modules()]
    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        model.eval()
        try:
            yield
        finally:
            for m, training in modes:
                m.training = training


# ---- Plumbing: the scoring's helpers ----
def batches(n, size):
    return [torch.arange(i, min(i + size, n)) for i in range(0, n, size)]


def up(x):
    """x in float32 at least (bfloat16 activations under mixed precision)"""
    return x.to(torch.promote_types(x.dtype, torch.float32))


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


def grad(y, io, retain=False):
    """d y / d (every layer's output)"""
    return torch.autograd.grad(y, [out for _, out in io], retain_graph=retain,
                               materialize_grads=True)


def memory_for_grads(device):
    """Bytes the one-pass influence may keep in per-record LoRA gradients: an eighth of the
    device's memory (5.4 GB for 256 episodes of GPT-Neo-2.7B with rank-16 q/v adapters)"""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory // 8
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 8


def take_rows(b, rows):
    """The generation batch b restricted to rows, every per-completion field of it"""
    return {k: v if v is None or isinstance(v, torch.Tensor) and v.ndim == 0 else v[rows]
            if isinstance(v, torch.Tensor) else [v[i] for i in rows.tolist()] for k, v in b.items()}


# ---- Plumbing: loading the models and data, with errors that name the flag ----
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


def load_prompts(args, tokenizer):
    """TRL's example, App. B.3: prompts with toxicity > 0.3, each the first 10-15 tokens of its prompt +
    continuation text, as TRL's rows {"prompt": text}: the training ones and the held-out ones"""
    rows = load_rows("--dataset", args.dataset, "train")
    if "prompt" not in rows.column_names:
        fail(f"--dataset {args.dataset!r} has no 'prompt' column (columns: {rows.column_names})")
    rng = np.random.default_rng(args.seed)
    prompts = []
    for row in rows:
        p, c = row["prompt"], row.get("continuation") or {}
        if p.get("toxicity") is None or p["toxicity"] <= 0.3:
            continue
        ids = tokenizer(p["text"] + (c.get("text") or ""))["input_ids"]
        n = int(rng.integers(10, 16))
        if len(ids) >= n:
            prompts.append({"prompt": tokenizer.decode(ids[:n])})
    return split_rows(args, prompts, rng)


def split_rows(args, rows, rng):
    """Training rows and held-out rows (a fifth, as TRL's example), shuffled"""
    order = rng.permutation(len(rows))
    n_held = int(0.2 * len(rows))
    train, held = [rows[i] for i in order[n_held:]], [rows[i] for i in order[:n_held]]
    if len(train) < args.batch_size // args.num_generations:
        fail(f"--dataset {args.dataset!r} has {len(train)} training rows, fewer than the "
             f"{args.batch_size // args.num_generations} prompts of a generation batch")
    return train, held


@torch.no_grad()
def classify(model, tok, texts, bs=64):
    device = next(model.parameters()).device
    return torch.cat([model(**tok(texts[i:i + bs], padding=True, truncation=True,
                                  return_tensors="pt").to(device)).logits.float()
                      for i in range(0, len(texts), bs)])


def load_classifier(flag, name, label_flag, label):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    tok = load(flag, name, AutoTokenizer.from_pretrained)
    model = load(flag, name, AutoModelForSequenceClassification.from_pretrained).eval()
    labels = {v: int(k) for k, v in model.config.id2label.items()}
    if label not in labels:
        fail(f"{label_flag} {label!r} is not a label of {flag} {name!r}; its labels are "
             f"{sorted(labels)}")
    return model, tok, labels[label]


def make_trainer(args, dtype=None, cls=None, config=None, task=None):
    """The trainer, its models and data loaded. dtype: the policy's weights (default: bfloat16 if
    frozen, under --dtype bfloat16 with LoRA; else float32, TRL's master weights). cls, config, task:
    grpo_variants.py's (default: IIFGRPOTrainer, make_config(args), detox_task)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokenizer = load("--model-name", args.model_name, AutoTokenizer.from_pretrained)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    dtype = dtype or (torch.bfloat16 if args.dtype == "bfloat16" and args.lora else torch.float32)
    lm = load("--model-name", args.model_name, AutoModelForCausalLM.from_pretrained, dtype=dtype)
    reward_fn, train_rows, held_rows, models = (task or detox_task)(args, tokenizer)
    from peft import LoraConfig
    peft_config = LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=0.0,
                             bias="none", task_type="CAUSAL_LM", target_modules=(
                                 args.lora_target_modules.split(",") if args.lora_target_modules
                                 else None)) if args.lora else None
    try:
        trainer = (cls or IIFGRPOTrainer)(
            model=lm, reward_funcs=reward_fn, args=config or make_config(args),
            processing_class=tokenizer, train_dataset=Dataset.from_list(train_rows),
            peft_config=peft_config, iif_args=args)
    except ValueError as e:  # peft's answer to --lora-target-modules the model lacks, or IIF's
        fail(f"--lora-target-modules: {e}" if args.lora_target_modules and "IIF" not in str(e) else str(e))
    trainer.held_rows = held_rows  # the validation prompts of grpo_variants.py's I-PPO target
    for m in models:  # the classifiers, onto the trainer's device
        m.to(trainer.accelerator.device)
    return trainer


def detox_task(args, tokenizer):
    """The reward function, the training and held-out rows, and the models it runs"""
    rm = load_classifier("--reward-model", args.reward_model, "--reward-label", args.reward_label)
    return make_reward_fn(*rm), *load_prompts(args, tokenizer), [rm[0]]


# ---- Plumbing: the flags, the run folder and metrics.csv ----
def resolve_args(args, resuming=False):
    """Check every flag before anything is loaded; fail early with the flag's name. resuming: the
    run folder may hold the run (grpo_variants.py --resume-from-checkpoint)."""
    gpu = torch.cuda.is_available() and not args.use_cpu
    if args.dtype is None:
        args.dtype = "bfloat16" if gpu and torch.cuda.is_bf16_supported() else "float32"
    if args.dtype == "bfloat16" and gpu and not torch.cuda.is_bf16_supported():
        fail(f"--dtype bfloat16: {torch.cuda.get_device_name()} has no bfloat16; use float32")
    args.forward_batch_size = args.forward_batch_size or (64 if gpu else 16)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    for key in ("batch_size", "mini_batch_size", "gradient_accumulation_steps", "num_iterations",
                "gen_tokens", "forward_batch_size", "lora_r", "logging_steps", "max_steps"):
        if getattr(args, key) is not None and getattr(args, key) < 1:
            fail(f"--{key.replace('_', '-')} must be at least 1, got {getattr(args, key)}")
    if args.num_generations < 2:  # GRPO normalises rewards within a group
        fail(f"--num-generations must be at least 2, got {args.num_generations}")
    n_mini = args.batch_size // (args.mini_batch_size * world) * args.num_iterations
    for ok, msg in [
        (args.batch_size % args.num_generations == 0, f"--batch-size ({args.batch_size}) must be "
         f"a multiple of --num-generations ({args.num_generations})"),
        (args.batch_size % (args.mini_batch_size * world) == 0, f"--batch-size ({args.batch_size}) "
         f"must be a multiple of --mini-batch-size ({args.mini_batch_size}) x {world} processes"),
        (n_mini % args.gradient_accumulation_steps == 0, f"--gradient-accumulation-steps must "
         f"divide the {n_mini} mini-batches of a generation batch's update (--batch-size / "
         "(--mini-batch-size x processes) x --num-iterations)"),
        (args.filter_p is None or 0 < args.filter_p <= 1,
         f"--filter-p must be in (0, 1], got {args.filter_p}"),
        (args.filter_p is None or args.filter_method in ("influence", "random"),
         f"--filter-p is for --filter-method influence or random, not {args.filter_method}"),
        (args.learning_rate > 0, f"--learning-rate must be positive, got {args.learning_rate}"),
        (args.epsilon > 0, f"--epsilon must be positive, got {args.epsilon}"),
        (args.beta >= 0, f"--beta must be at least 0, got {args.beta}")]:
        if not ok:
            fail(msg)
    if args.report_to not in ("none", "all"):
        from transformers.integrations import get_available_reporting_integrations
        missing = set(args.report_to.split(",")) - set(get_available_reporting_integrations())
        if missing:
            fail(f"--report-to {args.report_to}: {', '.join(sorted(missing))} is not installed or "
                 "not a tracker that transformers knows")
    args.run_name = args.run_name or f"grpo__{args.filter_method}__{args.seed}__{int(time.time())}"
    run_dir = os.path.join(args.runs_dir, args.run_name)
    if os.path.exists(os.path.join(run_dir, "metrics.csv")) and not resuming:
        fail(f"{run_dir}/metrics.csv exists: choose another --run-name or remove it")
    return args


def timer():
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


# TRL's metrics of a step, as the other scripts name them (TRL logs no policy loss apart, no
# approximate KL to the old policy, and GRPO has no value function)
DIAGNOSTICS = {"entropy": "entropy", "clip_frac": "clip_ratio/region_mean", "kl_ref": "kl"}
METRICS = ["round", "step", "completions", "reward_mean", "reward_std", "n_kept", "n_negative",
           "t_generate", "t_forward", "t_influence", "t_optim", "loss", *DIAGNOSTICS]


def open_metrics(run_dir, rounds_done, columns):
    """metrics.csv, new, or (resuming) cut back to its first rounds_done generation batches"""
    path = os.path.join(run_dir, "metrics.csv")
    rows = [r for r in csv.DictReader(open(path)) if int(r["round"]) < rounds_done] if rounds_done else []
    writer = csv.DictWriter(f := open(path, "w", newline=""), fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    return writer, f


def run_cli(args, main):
    """main(args); Ctrl-C keeps every finished generation batch; several processes leave together"""
    try:
        main(args)
    except KeyboardInterrupt:
        sys.exit(f"\ninterrupted: every finished generation batch is in "
                 f"{os.path.join(args.runs_dir, args.run_name)}/metrics.csv")
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # torch 2.13's gloo aborted at interpreter exit in about 1 run of 5 otherwise


if __name__ == "__main__":
    import tyro  # the command line's parser: the trainer alone needs only TRL's dependencies
    run_cli(resolve_args(tyro.cli(Args)), main)
