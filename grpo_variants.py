"""grpo_iif.py with the variants the comparison in docs/grpo.md runs, and the options of long runs.

grpo_iif.py is Alg. 1 with GRPO as the learner. This file imports its pieces and adds:
- the cheap filters GRPO users apply, on rewards or advantages alone: --filter-method
  zero-variance (DAPO), max-variance (PODS), abs-advantage (CPPO), with --keep-fraction;
- I-PPO's validation target ("Learning from the Right Rollouts", 2026): --target-data validation
  scores against fresh completions of --validation-size held-out prompts;
- a verifiable task: --reward-fn exact-answer (GSM8K's fields, reward 1 or 0, test accuracy);
- long runs: TRL's checkpoints (--save-steps) and --resume-from-checkpoint.
With none of these set it writes what grpo_iif.py writes (results/grpo_rerun_check.py checks it).

    python grpo_variants.py --filter-method max-variance --keep-fraction 0.5 ...
    python grpo_variants.py --filter-method influence --target-data validation ...   # I-PPO
    python grpo_variants.py --reward-fn exact-answer --dataset openai/gsm8k --dataset-config main
"""
import copy
import os
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Literal, Optional

import numpy as np
import torch
import tyro

import grpo_iif
from grpo_iif import fail, load_rows, sample


@dataclass
class Args(grpo_iif.Args):
    filter_method: Literal["influence", "random", "zero-variance", "max-variance", "abs-advantage",
                           "none"] = "influence"
    """influence: IIF; random: drop as many completions as IIF would, at random; zero-variance:
    drop the groups whose rewards are all equal (DAPO's dynamic sampling without its regeneration:
    the batch shrinks); max-variance: keep the --keep-fraction of each group with the largest
    reward variance (PODS); abs-advantage: keep the --keep-fraction of each group with the largest
    |advantage| (CPPO); none: plain GRPO"""
    keep_fraction: Optional[float] = None
    """max-variance and abs-advantage: keep round(fraction x --num-generations) of each group"""
    target_data: Literal["buffer", "validation"] = "buffer"
    """completions f is measured on: the generation batch, or fresh completions of
    --validation-size held-out prompts (I-PPO)"""
    validation_size: int = 32
    """held-out prompts (each with --num-generations completions) for --target-data validation"""
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


def answer_task(args, tokenizer):
    """grpo_iif.make_trainer's task for --reward-fn exact-answer: TRL's rows {"prompt", "answer"}
    (TRL hands the answer column to the reward function), training and held-out; the test
    questions (the first --eval-samples of --eval-dataset, tokenized as TRL tokenizes prompts) and
    their answers"""
    rows = load_question_rows("--dataset", args.dataset, "train", args)
    rows = [{"prompt": question_prompt(args, r["question"]), "answer": r["answer"]} for r in rows]
    train, held = grpo_iif.split_rows(args, rows, np.random.default_rng(args.seed))
    evaluation = None
    if args.eval_every:
        rows = load_question_rows("--eval-dataset", args.eval_dataset, args.eval_split, args)
        rows = rows.select(range(min(args.eval_samples, len(rows))))
        texts = [tokenizer.apply_chat_template(question_prompt(args, q), tokenize=False,
                                               add_generation_prompt=True) if args.chat else q
                 for q in rows["question"]]
        evaluation = (None, [tokenizer(t, add_special_tokens=False)["input_ids"][
            -args.eval_max_prompt_tokens:] for t in texts], list(rows["answer"]))
    return exact_answer, train, held, evaluation, []


# ---- The trainer: the cheap filters, the validation target, the test accuracy, checkpoints ----
class Trainer(grpo_iif.IIFGRPOTrainer):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        args = self.iif_args
        if args.reward_fn == "exact-answer":
            i = grpo_iif.METRICS.index("eval_toxicity") + 1  # the test accuracy's column next to it
            self.columns = grpo_iif.METRICS[:i] + ["eval_accuracy"] + grpo_iif.METRICS[i:]
            self.test_column = "eval_accuracy"
        if args.resume_from_checkpoint:  # the generation batches done, the random filter's state
            state = torch.load(os.path.join(args.resume_from_checkpoint, "iif_state.pt"))
            self.n_rounds = state["n_rounds"]
            self.iif_gen.set_state(state["iif_gen"])

    def score_and_filter(self, b, t=None):
        args, n = self.iif_args, self.num_generations
        if args.filter_method in ("influence", "random"):
            return super().score_and_filter(b, self.validation_batch()
                                            if args.target_data == "validation" else None)
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

    def test_metric(self):
        """The test toxicity, or with exact-answer the test accuracy: the fraction of sampled
        answers (temperature 1, a pass@1 estimate) that the checker passes"""
        if self.iif_args.reward_fn != "exact-answer":
            return super().test_metric()
        acc = self.accelerator
        _, queries, answers = self.evaluation
        n = -(-len(queries) // acc.num_processes)
        mine = slice(acc.process_index * n, (acc.process_index + 1) * n)
        texts = sample(acc.unwrap_model(self.model), (queries + queries[-1:] * n)[mine],
                       self.processing_class, self.iif_args, acc.process_index, self.sharded)
        right = [float(is_right(t, a)) for t, a in zip(texts, (answers + answers[-1:] * n)[mine])]
        return acc.gather(torch.tensor(right, device=acc.device))[:len(queries)].mean().item()

    def train(self, **kw):
        return super().train(resume_from_checkpoint=self.iif_args.resume_from_checkpoint, **kw)

    def _save_checkpoint(self, model, trial):
        """TRL's checkpoint, with the generation batches done and the random filter's generator"""
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            torch.save({"iif_gen": self.iif_gen.get_state(), "n_rounds": self.n_rounds},
                       os.path.join(self.args.output_dir, f"checkpoint-{self.state.global_step}",
                                    "iif_state.pt"))


def make_trainer(args, dtype=None):
    def task(args, tokenizer):  # grpo_iif.make_trainer's, and enough held-out prompts
        load = answer_task if args.reward_fn == "exact-answer" else grpo_iif.detox_task
        out = load(args, tokenizer)
        if args.target_data == "validation" and len(out[2]) < args.validation_size:
            fail(f"--validation-size {args.validation_size}: only {len(out[2])} held-out prompts "
                 f"(--held-out-fraction {args.held_out_fraction})")
        return out
    save = dict(save_strategy="steps", save_steps=args.save_steps) if args.save_steps else {}
    return grpo_iif.make_trainer(args, dtype, Trainer, grpo_iif.make_config(args, **save), task)


def main(args, dtype=None):
    return grpo_iif.main(args, make_trainer(args, dtype))


def resolve_args(args):
    """grpo_iif.py's checks, then this file's"""
    args = grpo_iif.resolve_args(args, resuming=bool(args.resume_from_checkpoint))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cheap = args.filter_method in ("max-variance", "abs-advantage")
    steps = args.batch_size // (args.mini_batch_size * world) * args.num_iterations
    checks = [
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
