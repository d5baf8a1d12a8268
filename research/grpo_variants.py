"""grpo_iif.py with the variants the comparison in docs/grpo.md runs, and the options of long runs.

grpo_iif.py is Alg. 1 with GRPO as the learner. This file imports its pieces and adds:
- the test metric after every --eval-every-th update: App. B.3's test toxicity (a second
  classifier on continuations of held-out toxic comments), or a verifiable task's test accuracy;
- the cheap filters GRPO users apply, on rewards or advantages alone: --filter-method
  zero-variance (DAPO), max-variance (PODS), abs-advantage (CPPO), with --keep-fraction;
- I-PPO ("Learning from the Right Rollouts", 2026) with its rules, --filter-method i-ppo on a task
  with reference answers: every completion scored against the mean log-likelihood of the reference
  answers to --validation-size held-out questions, those scoring <= 0 dropped, the others' losses
  weighted by score / mean kept score (docs/ippo.md); and IIF scored against fresh completions of
  held-out prompts, --target-data validation;
- a verifiable task: --reward-fn exact-answer (GSM8K's fields, reward 1 or 0, test accuracy);
- long runs: TRL's checkpoints (--save-steps) and --resume-from-checkpoint.
With --eval-every 0 and none of the others it writes what grpo_iif.py writes (results/
grpo_rerun_check.py checks both files against the single file they were split from).

    python research/grpo_variants.py --filter-method max-variance --keep-fraction 0.5 ...
    python research/grpo_variants.py --filter-method i-ppo --reward-fn exact-answer ...   # I-PPO
    python research/grpo_variants.py --filter-method influence --target-data validation ...   # f on fresh
    python research/grpo_variants.py --reward-fn exact-answer --dataset openai/gsm8k --dataset-config main
"""
import copy
import dataclasses
import json
import os
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Literal, Optional

import numpy as np
import torch
import tyro
from trl.trainer.utils import use_adapter

import grpo_iif
from grpo_iif import fail, load_rows, timer


@dataclass
class Args(grpo_iif.Args):
    # the test metric (App. B.3, as rlhf_iif.py)
    eval_every: int = 1
    """test metric after the update of every N-th generation batch and of the last (0: never)"""
    eval_dataset: str = "OxAISH-AL-LLM/wiki_toxic"
    """test prompts: the toxic comments (label 1) of this dataset, a hub name or a .json/.jsonl"""
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

    # the variants
    filter_method: Literal["influence", "random", "zero-variance", "max-variance", "abs-advantage",
                           "i-ppo", "none"] = "influence"
    """influence: IIF; random: drop as many completions as IIF would, at random; i-ppo: I-PPO's
    rules (with --reward-fn exact-answer: its reference answers); zero-variance:
    drop the groups whose rewards are all equal (DAPO's dynamic sampling without its regeneration:
    the batch shrinks); max-variance: keep the --keep-fraction of each group with the largest
    reward variance (PODS); abs-advantage: keep the --keep-fraction of each group with the largest
    |advantage| (CPPO); none: plain GRPO"""
    keep_fraction: Optional[float] = None
    """max-variance and abs-advantage: keep round(fraction x --num-generations) of each group"""
    target_data: Literal["buffer", "validation"] = "buffer"
    """completions f is measured on: the generation batch, or fresh completions of
    --validation-size held-out prompts"""
    validation_size: int = 32
    """held-out prompts: each with --num-generations fresh completions for --target-data
    validation, or with its reference answer for i-ppo"""
    reweight: bool = True
    """i-ppo: weight each kept completion's loss by score / mean kept score (I-PPO's rule); off:
    weight 1 (its ablation)"""
    reward_fn: Literal["classifier", "exact-answer"] = "classifier"
    """classifier: the detoxification task; exact-answer: reward 1 when the completion's last
    number is the answer, else 0, and the test accuracy: --dataset and --eval-dataset then have
    GSM8K's question and answer fields (the reference after the answer's last '####')"""
    dataset_config: Optional[str] = None
    """the hub configuration of --dataset and --eval-dataset (openai/gsm8k: main)"""
    chat: bool = False
    """with exact-answer: each question a user message in the tokenizer's chat template"""
    save_steps: int = 0
    """TRL's checkpoint every N optimizer steps, a multiple of the steps per generation batch
    (0: never); with the filter's state"""
    resume_from_checkpoint: Optional[str] = None
    """continue a killed run from a checkpoint folder, or the newest in the run folder ("last"),
    the other flags as before; metrics.csv keeps its rows up to the checkpoint"""


# ---- The cheap filters, on rewards and advantages alone (groups of n consecutive completions, as
# TRL orders them). Like IIF they only drop: the kept completions keep the advantages TRL computed
# over their whole group. ----
def zero_variance(rewards, n):
    """DAPO's dynamic sampling (Yu et al. 2025; verl's algorithm.filter_groups): drop every group
    whose rewards are all equal. DAPO then generates more groups; here the batch shrinks instead."""
    groups = rewards.view(-1, n)
    return (groups != groups[:, :1]).any(1).repeat_interleave(n)


def max_variance(rewards, n, m):
    """PODS's max-variance down-sampling (Xu et al. 2025): keep the m completions of each group
    whose rewards have the largest variance. For rewards in ascending order that subset is the i
    largest and the m - i smallest for some i (their Lemma), so the m + 1 candidates are compared
    exactly; ties go to the smallest i."""
    kept = torch.zeros(len(rewards), dtype=torch.bool, device=rewards.device)
    for g, r in enumerate(rewards.double().view(-1, n)):
        up_order = torch.argsort(r, stable=True)
        candidates = [torch.cat([up_order[:m - i], up_order[n - i:]]) for i in range(m + 1)]
        kept[g * n + max(candidates, key=lambda c: r[c].var(unbiased=False))] = True
    return kept


def abs_advantage(advantages, n, m):
    """CPPO's completion pruning (Lin et al. 2025): keep the m completions of each group with the
    largest |advantage|, dropping those with the smallest; ties go to the earlier completion."""
    top = torch.argsort(advantages.abs().view(-1, n), dim=1, descending=True, stable=True)[:, :m]
    return torch.zeros(len(top), n, dtype=torch.bool, device=top.device).scatter_(1, top,
                                                                                   True).flatten()


# ---- The verifiable task: an exact checker on GSM8K-style rows ----
def last_number(text):
    """The last number in text, thousands commas dropped, or None"""
    numbers = re.findall(r"-?\d+(?:\.\d+)?", text.replace(",", ""))
    return float(numbers[-1]) if numbers else None


def is_right(completion, answer):
    """The completion's last number equals the reference (the number after the last '####' of
    GSM8K's answer field, or the field's number)"""
    got = last_number(completion)
    return got is not None and got == last_number(answer.split("####")[-1])


def exact_answer(prompts, completions, answer, **kwargs):
    """The reward of --reward-fn exact-answer: 1.0 for a right answer, 0.0 otherwise (TRL logs it
    as rewards/exact_answer/mean)"""
    return [float(is_right(c if isinstance(c, str) else c[-1]["content"], a))
            for c, a in zip(completions, answer)]


def question_prompt(args, question):
    """TRL's prompt for a question: its text, or with --chat a user message"""
    return [{"role": "user", "content": question}] if args.chat else question


def load_question_rows(flag, name, split, args):
    rows = load_rows(flag, name, split, args.dataset_config)
    if not {"question", "answer"} <= set(rows.column_names):
        fail(f"{flag} {name!r} needs 'question' and 'answer' columns with --reward-fn exact-answer "
             f"(has {rows.column_names})")
    return rows


def answer_rows(args):
    """TRL's rows {"prompt", "answer"} (TRL hands the answer column to the reward function),
    training and held-out"""
    rows = load_question_rows("--dataset", args.dataset, "train", args)
    rows = [{"prompt": question_prompt(args, r["question"]), "answer": r["answer"]} for r in rows]
    return grpo_iif.split_rows(args, rows, np.random.default_rng(args.seed))


# ---- The test metric (App. B.3): continuations of test prompts, sampled as in training ----
def load_evaluation(args, tokenizer):
    """The test prompts' token ids, their references and score(texts, references), a value per
    text; and the models it runs. Toxicity: the toxic comments of --eval-dataset, each cut to its
    last --eval-max-prompt-tokens tokens, and the second classifier's toxic-label probability.
    exact-answer: the first --eval-samples questions (tokenized as TRL tokenizes prompts), and 1
    for a right answer, else 0."""
    if args.reward_fn == "exact-answer":
        rows = load_question_rows("--eval-dataset", args.eval_dataset, args.eval_split, args)
        rows = rows.select(range(min(args.eval_samples, len(rows))))
        texts = [tokenizer.apply_chat_template(question_prompt(args, q), tokenize=False,
                                               add_generation_prompt=True) if args.chat else q
                 for q in rows["question"]]
        queries = [tokenizer(t, add_special_tokens=False)["input_ids"][-args.eval_max_prompt_tokens:]
                   for t in texts]
        return (queries, list(rows["answer"]), lambda texts, answers: torch.tensor(
            [float(is_right(t, a)) for t, a in zip(texts, answers)])), []
    model, tok, toxic = grpo_iif.load_classifier("--eval-reward-model", args.eval_reward_model,
                                                 "--eval-toxic-label", args.eval_toxic_label)
    rows = load_rows("--eval-dataset", args.eval_dataset, args.eval_split)
    if not {"comment_text", "label"} <= set(rows.column_names):
        fail(f"--eval-dataset {args.eval_dataset!r} needs 'comment_text' and 'label' columns "
             f"(has {rows.column_names})")
    texts = [r["comment_text"] for r in rows if r["label"] == 1][:args.eval_samples]
    if not texts:
        fail(f"--eval-dataset {args.eval_dataset!r} has no toxic (label 1) rows in split "
             f"{args.eval_split!r}")
    queries = [tokenizer(t)["input_ids"][-args.eval_max_prompt_tokens:] for t in texts]
    return (queries, [None] * len(queries), lambda texts, _: grpo_iif.classify(
        model, tok, texts).softmax(-1)[:, toxic]), [model]


@torch.no_grad()
def sample(model, queries, tokenizer, args, rank=0, synced=False, bs=64):
    """Continuations of the token-id queries, sampled from pi_theta itself as in training, each up
    to its first EOS; a fixed seed per process, training's random state untouched. Under FSDP or
    DeepSpeed every process keeps stepping until all have finished (synced_gpus). Returns the
    texts and the completions' token ids, EOS included (TRL's completion mask)."""
    device = next(model.parameters()).device
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    texts, completions = [], []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(args.seed + 10_000 + rank)
        for i in range(0, len(queries), bs):
            q = queries[i:i + bs]
            P = max(map(len, q))
            ids = torch.tensor([[pad] * (P - len(x)) + x for x in q])  # left-padded
            attn = torch.tensor([[0] * (P - len(x)) + [1] * len(x) for x in q])
            out = model.generate(  # every sampling knob a generation_config may set, neutralised
                input_ids=ids.to(device), attention_mask=attn.to(device), do_sample=True,
                temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0,
                repetition_penalty=1.0, no_repeat_ngram_size=0, max_new_tokens=args.gen_tokens,
                min_new_tokens=0, pad_token_id=pad, eos_token_id=eos,
                synced_gpus=synced)[:, P:].cpu()
            is_eos = out == eos
            ends = torch.where(is_eos.any(1), is_eos.int().argmax(1), out.shape[1])
            texts += [tokenizer.decode(r[:n], skip_special_tokens=True)
                      for r, n in zip(out, ends.tolist())]
            completions += [r[:n + 1].tolist() for r, n in zip(out, ends.tolist())]
    return texts, completions


def next_token_logprobs(model, b, args):
    """log pi(. | x, y_<t) over the vocabulary at every completion position of the left-padded
    prompts and right-padded completions b, the positions counting real tokens only, as generate
    counts them (TRL's forward counts the padding too, which shifts a padded row's positions)"""
    ids = torch.cat([b["prompt_ids"], b["completion_ids"]], 1)
    attn = torch.cat([b["prompt_mask"], b["completion_mask"]], 1)
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=args.dtype == "bfloat16"):
        logits = model(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(1) - 1).clamp(
            min=0), logits_to_keep=b["completion_ids"].shape[1] + 1).logits
    return torch.log_softmax(grpo_iif.up(logits[:, :-1]), -1)


def trl_batch(prompts, completions, pad):
    """Token-id prompts and completions in TRL's batch fields: the prompts left-padded, the
    completions right-padded, with their masks"""
    P, C = max(map(len, prompts)), max(map(len, completions))
    return {k: torch.tensor(v) for k, v in dict(
        prompt_ids=[[pad] * (P - len(x)) + x for x in prompts],
        prompt_mask=[[0] * (P - len(x)) + [1] * len(x) for x in prompts],
        completion_ids=[y + [pad] * (C - len(y)) for y in completions],
        completion_mask=[[1] * len(y) + [0] * (C - len(y)) for y in completions]).items()}


# ---- The trainer: the cheap filters, the validation target, the test accuracy, checkpoints ----
class Trainer(grpo_iif.IIFGRPOTrainer):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        args = self.iif_args
        self.evaluation = None  # load_evaluation's test set, set by make_trainer
        self.references = None  # i-ppo's reference_batch, made once
        self.test_column = "eval_accuracy" if args.reward_fn == "exact-answer" else "eval_toxicity"
        i = self.columns.index("n_negative") + 1
        self.columns = self.columns[:i] + [self.test_column] + self.columns[i:] + ["t_eval"]
        if args.resume_from_checkpoint:  # the generation batches done, the random filter's state
            state = torch.load(os.path.join(args.resume_from_checkpoint, "iif_state.pt"))
            self.rounds_done = state["rounds_done"]
            self.iif_gen.set_state(state["iif_gen"])

    def score_and_filter(self, b, t=None):
        args, n = self.iif_args, self.num_generations
        if args.filter_method in ("influence", "random"):
            return super().score_and_filter(b, self.validation_batch()
                                            if args.target_data == "validation" else None)
        if args.filter_method == "i-ppo":
            return self.i_ppo(b)
        m = max(1, round((args.keep_fraction or 0) * n))  # max-variance and abs-advantage
        if args.filter_method == "zero-variance":
            return zero_variance(self.rewards[:, 0].cpu(), n), None
        if args.filter_method == "max-variance":
            return max_variance(self.rewards[:, 0].cpu(), n, m), None
        if args.filter_method == "abs-advantage":
            return abs_advantage(self.accelerator.gather(b["advantages"]).cpu(), n, m), None
        return super().score_and_filter(b)  # none

    def validation_batch(self):
        """Fresh completions (with rewards, advantages, reference log-probs) of the held-out
        prompts, this process's share; kept out of TRL's logs and token count"""
        acc = self.accelerator
        rows = [row for row in self.held_rows[:self.iif_args.validation_size]
                for _ in range(self.num_generations)]
        n = len(rows) // acc.num_processes
        saved = self._metrics["train"], self._logs, self.state.num_input_tokens_seen, self.rewards
        self._metrics["train"], self._logs = defaultdict(list), copy.deepcopy(self._logs)
        try:
            return super(grpo_iif.IIFGRPOTrainer, self)._generate_and_score_completions(
                rows[acc.process_index * n:][:n])
        finally:
            (self._metrics["train"], self._logs, self.state.num_input_tokens_seen,
             self.rewards) = saved

    def i_ppo(self, b):
        """I-PPO's Stage II: every completion's score <grad f_sft, -grad l_i> at theta(k) (f_sft the
        reference answers' mean log-likelihood per token: f_seq on reference_batch), the kept mask
        (score > 0) and each kept completion's loss weight, score / mean kept score (1 with
        --no-reweight). TRL multiplies its loss mask by a batch's "tool_mask" (0 on a tool's output
        tokens): the weights ride on it, and keep_only takes its rows with the others."""
        args, acc = self.iif_args, self.accelerator
        scores = grpo_iif.influence(acc.unwrap_model(self.model), b, self.reference_batch(),
                           dataclasses.replace(args, target="f_seq"), world=acc.num_processes,
                           all_sum=lambda g: acc.reduce(g, reduction="sum"))
        scores = acc.gather(scores).cpu()
        if not torch.isfinite(scores).all():
            fail(f"generation batch {self.rounds_done}: non-finite scores; lower --learning-rate")
        kept = scores > 0
        weights = kept.float()
        if args.reweight and kept.any():
            weights = torch.where(kept, scores / scores[kept].mean(), 0.0)
        mine = weights.view(acc.num_processes, -1)[acc.process_index].to(acc.device)
        b["tool_mask"] = mine[:, None] * torch.ones_like(b["completion_mask"], dtype=mine.dtype)
        return kept, scores

    def reference_batch(self):
        """I-PPO's validation set, this process's share, in TRL's batch fields: the first
        --validation-size held-out questions, left-padded, and their reference answers with EOS,
        right-padded; A_hat = answers / their tokens, so that f_seq on it is the mean log-likelihood
        per token"""
        if self.references is None:
            acc, tok = self.accelerator, self.processing_class
            rows = self.held_rows[:self.iif_args.validation_size]
            n = len(rows) // acc.num_processes
            text = [tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True)
                    if self.iif_args.chat else r["prompt"] for r in rows]
            q = [tok(t, add_special_tokens=False)["input_ids"] for t in text]
            a = [tok(r["answer"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
                 for r in rows]
            ref = {k: v[acc.process_index * n:][:n].to(acc.device)
                   for k, v in trl_batch(q, a, tok.pad_token_id).items()}
            ref["advantages"] = torch.full((n,), len(rows) / sum(map(len, a)), device=acc.device)
            self.references = ref
        return self.references

    def write_row(self, r):
        """The row with the test metric after every --eval-every-th update and after the last
        (every process measures)"""
        r["t_eval"] = 0.0
        last = self.state.global_step >= self.state.max_steps
        if self.evaluation and ((r["round"] + 1) % self.iif_args.eval_every == 0 or last):
            t0 = timer()
            r[self.test_column] = self.test_metric()
            r["t_eval"] = timer() - t0
        super().write_row(r)

    def test_metric(self):
        """The mean score of sampled continuations of the test prompts: the test toxicity, or the
        test accuracy (temperature 1: a pass@1 estimate)"""
        return self.test_samples()[0].mean().item()

    def test_samples(self, final=False):
        """The test metric of one sampled continuation of each test prompt and, with final, its KL
        to the reference and its training reward. Every process samples an equal share (the last
        prompt repeated to even them out, and left out) with its own seed: the final policy's
        samples are those of its last test metric."""
        acc, tok = self.accelerator, self.processing_class
        queries, refs, score = self.evaluation
        n = -(-len(queries) // acc.num_processes)
        mine = slice(acc.process_index * n, (acc.process_index + 1) * n)
        queries, refs = (queries + queries[-1:] * n)[mine], (refs + refs[-1:] * n)[mine]
        model = acc.unwrap_model(self.model)
        texts, completions = sample(model, queries, tok, self.iif_args, acc.process_index,
                                    self.sharded)
        values = [score(texts, refs)]
        if final:
            values += [self.kl_to_reference(model, queries, completions), torch.tensor(
                self.reward_funcs[0](prompts=tok.batch_decode(queries, skip_special_tokens=True),
                                     completions=texts, answer=refs), dtype=torch.float)]
        return [acc.gather(v.float().to(acc.device))[:len(self.evaluation[0])].cpu()
                for v in values]

    @torch.no_grad()
    def kl_to_reference(self, model, queries, completions):
        """Each completion's sum over its tokens (EOS included) of KL(pi_theta || pi_ref) of the
        next token's distribution: unbiased for the KL of whole completions of its prompt, and
        never negative (rlhf_iif.py sums log pi_theta - log pi_ref of the sampled tokens, an
        unbiased estimate too, but noisier). pi_ref is TRL's reference, the policy with its LoRA
        adapter off, or ref_model; nan without one (--beta 0 --no-lora)."""
        if self.ref_model is None and not hasattr(model, "peft_config"):
            return torch.full((len(queries),), float("nan"))
        pad, kl, bs = self.processing_class.pad_token_id, [], self.iif_args.forward_batch_size
        for i in range(0, len(queries), bs):
            b = {k: v.to(self.accelerator.device) for k, v in
                 trl_batch(queries[i:i + bs], completions[i:i + bs], pad).items()}
            logp = next_token_logprobs(model, b, self.iif_args)
            if self.ref_model is not None:
                ref = next_token_logprobs(self.ref_model, b, self.iif_args)
            else:
                with use_adapter(model, "ref" if "ref" in model.peft_config else None):
                    ref = next_token_logprobs(model, b, self.iif_args)
            per_token = (logp.exp() * (logp - ref)).sum(-1)  # KL of the next token's distribution
            kl.append((per_token * b["completion_mask"]).sum(1).double().cpu())
        return torch.cat(kl)

    def final_test(self):
        """final.json, where a reward-KL frontier reads the final policy (analysis_variants.py
        frontier): on the test prompts, its KL to the reference, training reward and test metric,
        each a mean with its standard error"""
        metric, kl, reward = self.test_samples(final=True)
        n, key = len(kl), "final_" + self.test_column[5:]
        final = {"n_test": n}
        for name, v in (("final_kl", kl), ("final_reward", reward), (key, metric)):
            final[name], final[name + "_se"] = v.mean().item(), (v.std() / n ** 0.5).item()
        return final

    def train(self, **kw):
        return super().train(resume_from_checkpoint=self.iif_args.resume_from_checkpoint, **kw)

    def _save_checkpoint(self, model, trial):
        """TRL's checkpoint, with the generation batches done and the random filter's generator"""
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            torch.save({"iif_gen": self.iif_gen.get_state(), "rounds_done": self.rounds_done},
                       os.path.join(self.args.output_dir, f"checkpoint-{self.state.global_step}",
                                    "iif_state.pt"))


def make_trainer(args, dtype=None):
    evaluation = None

    def task(args, tokenizer):  # grpo_iif.make_trainer's, with enough held-out prompts, and the test
        nonlocal evaluation
        if args.reward_fn == "exact-answer":
            reward_fn, (train, held), models = exact_answer, answer_rows(args), []
        else:
            reward_fn, train, held, models = grpo_iif.detox_task(args, tokenizer)
        if args.eval_every:
            evaluation, test_models = load_evaluation(args, tokenizer)
            models = models + test_models
        if (args.target_data == "validation" or args.filter_method == "i-ppo") \
                and len(held) < args.validation_size:
            fail(f"--validation-size {args.validation_size}: only {len(held)} held-out prompts "
                 "(a fifth of --dataset's)")
        return reward_fn, train, held, models
    save = dict(save_strategy="steps", save_steps=args.save_steps) if args.save_steps else {}
    trainer = grpo_iif.make_trainer(args, dtype, Trainer, grpo_iif.make_config(args, **save), task)
    trainer.evaluation = evaluation
    return trainer


def main(args, dtype=None):
    trainer = grpo_iif.main(args, make_trainer(args, dtype))
    if trainer.evaluation:
        final = trainer.final_test()
        if trainer.accelerator.is_main_process:
            with open(os.path.join(args.runs_dir, args.run_name, "final.json"), "w") as f:
                json.dump(final, f, indent=1)
            print("final policy on {n_test} test prompts: KL to the reference {final_kl:.3f} +- "
                  "{final_kl_se:.3f} (s.e.), reward {final_reward:.3f} +- "
                  "{final_reward_se:.3f}, ".format(**final) + trainer.test_column[5:]
                  + f" {final['final_' + trainer.test_column[5:]]:.3f}", flush=True)
    return trainer


def resolve_args(args):
    """grpo_iif.py's checks, then this file's"""
    args = grpo_iif.resolve_args(args, resuming=bool(args.resume_from_checkpoint))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cheap = args.filter_method in ("max-variance", "abs-advantage")
    steps = args.batch_size // (args.mini_batch_size * world) * args.num_iterations
    checks = [
        (args.eval_every >= 0, f"--eval-every must be 0 (never) or more, got {args.eval_every}"),
        (args.eval_samples >= 1 and args.eval_max_prompt_tokens >= 1,
         "--eval-samples and --eval-max-prompt-tokens must be at least 1"),
        (args.keep_fraction is not None or not cheap, f"--filter-method {args.filter_method} keeps "
         "--keep-fraction of each group: set it (e.g. to IIF's mean kept fraction on the task)"),
        (args.keep_fraction is None or cheap, "--keep-fraction is for --filter-method "
         f"max-variance or abs-advantage, not {args.filter_method}"),
        (args.keep_fraction is None or 0 < args.keep_fraction <= 1,
         f"--keep-fraction must be in (0, 1], got {args.keep_fraction}"),
        (args.validation_size >= 1,
         f"--validation-size must be at least 1, got {args.validation_size}"),
        (args.target_data == "buffer" or args.validation_size * args.num_generations % world == 0,
         f"--validation-size ({args.validation_size}) x --num-generations must be a multiple of "
         f"the {world} processes"),
        (args.filter_method != "i-ppo" or args.validation_size % world == 0,
         f"--validation-size ({args.validation_size}) must be a multiple of the {world} processes"),
        (args.filter_method != "i-ppo" or args.reward_fn == "exact-answer",
         "--filter-method i-ppo scores against reference answers: --reward-fn exact-answer"),
        (args.filter_method != "i-ppo" or args.target_data == "buffer",
         "--target-data is IIF's; --filter-method i-ppo scores against its reference answers"),
        (not args.chat or args.reward_fn == "exact-answer",
         "--chat is for --reward-fn exact-answer (questions as chat messages)"),
        (args.save_steps >= 0 and args.save_steps * args.gradient_accumulation_steps % steps == 0,
         f"--save-steps ({args.save_steps}) must be 0 or a multiple of the optimizer steps per "
         "generation batch (--batch-size / (--mini-batch-size x processes x "
         "--gradient-accumulation-steps) x --num-iterations), so that a checkpoint falls "
         "between generation batches")]
    for ok, msg in checks:
        if not ok:
            fail(msg)
    run_dir = os.path.join(args.runs_dir, args.run_name)
    if args.resume_from_checkpoint == "last":
        from transformers.trainer_utils import get_last_checkpoint
        last = get_last_checkpoint(run_dir) if os.path.isdir(run_dir) else None
        if last is None:
            fail(f"--resume-from-checkpoint last: no checkpoint-* folder in {run_dir}")
        args.resume_from_checkpoint = last
    if args.resume_from_checkpoint and not os.path.isfile(
            os.path.join(args.resume_from_checkpoint, "trainer_state.json")):
        fail(f"--resume-from-checkpoint {args.resume_from_checkpoint!r} is not a checkpoint folder")
    return args


if __name__ == "__main__":
    grpo_iif.run_cli(resolve_args(tyro.cli(Args)), main)
