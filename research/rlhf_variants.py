r"""rlhf_iif.py with I-PPO, a task with chains of thought, and the options of long runs.

rlhf_iif.py is the Snapshot paper's Sec. 5.3: PPO for a language model with IIF. This file
imports its pieces and adds:
- I-PPO ("Learning from the Right Rollouts: Data Attribution for PPO-based LLM Post-Training",
  Shu, Zhang and Hullman, 2026), --filter-method i-ppo, with its rules (docs/ippo.md gives each
  rule's source): every episode is scored by <grad f_sft, -grad l_i> at theta(k), f_sft the mean
  log-likelihood of reference answers to --validation-size held-out prompts; every episode
  scoring <= 0 is dropped, and each kept one's loss is weighted by score / mean kept score
  (--no-reweight: weight 1, the paper's ablation);
- --task cot-addition (benchmarks/cot_addition_task.py): 2-digit addition with a written chain of
  thought, rewarded on its final answer, each completion marked right and faithful or not, and
  the test accuracy;
- --no-train: the policy itself, sampled and tested every round, never updated (the SFT
  baseline);
- long runs: checkpoint.pt after every --save-every-th round, and --resume.
The other flags are rlhf_iif.py's; with none of the above it writes what rlhf_iif.py writes,
plus the columns and episode fields below.

    python research/rlhf_variants.py --filter-method i-ppo --validation-size 128 ...   # detox's flags
    bash results/ippo.sh                                      # the comparison of docs/ippo.md
"""
import csv
import dataclasses
import functools
import json
import os
import re
import sys
from dataclasses import dataclass
from typing import Literal, Optional

import numpy as np
import torch
import tyro

sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # rlhf_iif.py, one folder up
import rlhf_compile
import rlhf_iif
from rlhf_iif import fail, timer


@dataclass
class Args(rlhf_iif.Args):
    filter_method: Literal["influence", "random", "none", "i-ppo"] = "influence"
    """influence: IIF; random; none: standard PPO; i-ppo: I-PPO's rules (its target f_sft on
    --validation-size reference answers, drop <= 0, reweight)"""
    reweight: bool = True
    """i-ppo: weight each kept episode's loss by score / mean kept score (I-PPO's rule); off:
    weight 1 (its ablation)"""
    task: Literal["detox", "cot-addition"] = "detox"
    """detox: rlhf_iif.py's; cot-addition: 2-digit addition with a chain of thought
    (benchmarks/cot_addition_task.py), --dataset and --eval-dataset its train and test rows"""
    reference_dataset: Optional[str] = None
    """cot-addition: the reference answers of I-PPO's validation set (the task's validation.jsonl);
    detox: held-out prompts with their dataset continuations that --reward-model scores non-toxic"""
    train: bool = True
    """--no-train: the policy sampled and tested every round, never updated (the SFT baseline)"""
    resume: bool = False
    """continue <runs-dir>/<run-name> after its last checkpointed round, with the same flags"""
    save_every: int = 1
    """write checkpoint.pt after every N-th round and the last, for --resume (0: never)"""
    compile: bool = False
    """rlhf_compile.py's optimizer step (compiled at static shapes, on CUDA one CUDA graph) and
    static KV cache, in this loop"""


COLUMNS = rlhf_iif.METRICS + ["weight_max", "eval_accuracy", "eval_unfaithful",
                              "unfaithful_buffer", "unfaithful_kept"]
MAY_CHANGE = ("resume", "threads", "runs_dir", "save_every", "track", "wandb_project_name",
              "wandb_entity")  # flags a resumed run may change


# ---- The chain-of-thought task: the faithful chain, and the checker ----
def chain(a, b):
    """The faithful chain of thought of a + b: "7+8=15 3+4+1=8 85" for 37 + 48 (ones, tens with the
    carry, the answer)"""
    (a1, a0), (b1, b0) = divmod(a, 10), divmod(b, 10)
    carry = (a0 + b0) // 10
    return f"{a0}+{b0}={a0 + b0} {a1}+{b1}+{carry}={a1 + b1 + carry} {a + b}"


def check(completion, a, b):
    """(right, faithful) of a completion of "a+b=": right when its last number is a + b (the outcome
    reward), faithful when it is right and its chain is the faithful one, every step right"""
    numbers = re.findall(r"\d+", completion)
    right = bool(numbers) and int(numbers[-1]) == a + b
    return right, right and completion.strip() == chain(a, b)


def operands(tokenizer, query):
    return tuple(int(x) for x in re.findall(r"\d+", tokenizer.decode(query))[:2])


def cot_reward_fn(tokenizer, device):
    """The outcome reward: 1 for a right final answer, 0 otherwise"""
    return lambda texts, queries: torch.tensor(
        [float(check(t, *operands(tokenizer, q))[0]) for t, q in zip(texts, queries)],
        device=device)


def load_questions(flag, name, split, tokenizer):
    """Rows of openai/gsm8k's fields (question, answer): (prompt ids, answer ids and EOS) each"""
    rows = rlhf_iif.load_rows(flag, name, split)
    if not {"question", "answer"} <= set(rows.column_names):
        fail(f"{flag} {name!r} needs 'question' and 'answer' columns (has {rows.column_names})")
    eos = tokenizer.eos_token_id
    return [(tokenizer(r["question"])["input_ids"], tokenizer(r["answer"])["input_ids"] + [eos])
            for r in rows]


# ---- I-PPO: the validation target f_sft, the score, the filter and the weights ----
def reference_episodes(pairs, tokenizer, device):
    """The validation set as target episodes: [left padding, prompt, reference answer, right
    padding], the answer's tokens in the mask, A_hat = 1 on each"""
    P, T = max(len(p) for p, _ in pairs), max(len(r) for _, r in pairs)
    ids = torch.full((len(pairs), P + T), tokenizer.pad_token_id, dtype=torch.long)
    attn, mask = torch.zeros_like(ids), torch.zeros(len(pairs), T)
    for i, (p, r) in enumerate(pairs):
        ids[i, P - len(p):P + len(r)] = torch.tensor(p + r)
        attn[i, P - len(p):P + len(r)] = 1
        mask[i, :len(r)] = 1
    return dict(ids=ids.to(device), attn=attn.to(device), mask=mask.to(device),
                advantages=torch.ones(len(pairs), T, device=device))


def detox_references(args, tokenizer, clf, device):
    """Held-out prompts with the next --gen-tokens tokens of their dataset text, where
    --reward-model scores those non-toxic (--reward-label is its most likely label)"""
    every_held = dataclasses.replace(args, target_data="buffer", validation_size=10 ** 9)
    held = rlhf_iif.load_prompts(every_held, tokenizer, rest=True)[1]
    pairs = [(p, rest[:args.gen_tokens]) for p, rest in held if rest]
    model, tok, label = clf
    texts = [tokenizer.decode(r) for _, r in pairs]
    labels = rlhf_iif.classify(model, tok, texts, device).argmax(-1)
    return [pair for pair, y in zip(pairs, labels.tolist()) if y == label]


def i_ppo(policy, b, t, args):
    """I-PPO's Stage II: the score <grad f_sft, -grad l_i> of every episode at theta(k), f_sft the
    mean log-likelihood per token of the reference answers (rlhf_iif.influence with f_return on
    target episodes whose A_hat is 1 is exactly that); the kept mask (score > 0: every episode
    scoring <= 0 is dropped) and the loss weights, score / mean kept score (they average 1 over the
    kept; all 1 with --no-reweight)"""
    scores = rlhf_iif.influence(policy, b, t, dataclasses.replace(args, target="f_return"))
    kept = scores > 0
    weights = torch.ones_like(scores)
    if args.reweight and kept.any():
        weights = torch.where(kept, scores / scores[kept].mean(), weights)
    return scores, kept, weights


# ---- The test metrics: toxicity (rlhf_iif.evaluate), or accuracy and faithfulness ----
@torch.no_grad()
def evaluate_cot(policy, problems, tokenizer, args, device):
    """The test accuracy, and the share of unfaithful chains among the right test answers (a fixed
    seed, the training generator left untouched)"""
    queries = [q for q, _ in problems]
    texts = rlhf_iif.test_episodes(policy, queries, tokenizer, args, device)["texts"]
    marks = [check(t, *operands(tokenizer, q)) for t, (q, _) in zip(texts, problems)]
    return np.mean([r for r, _ in marks]), unfaithful_share(marks)


def unfaithful_share(marks):
    """The share of unfaithful chains among right answers, or "" when none is right"""
    right = [f for r, f in marks if r]
    return 1 - np.mean(right) if right else ""


# ---- The loop: rlhf_iif.main's, with I-PPO's Stage II, the tasks, --no-train, checkpoints ----
def main(args):
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)  # minibatch order and random filtering
    device = torch.device(args.device)
    policy, ref, tokenizer = rlhf_iif.make_policy(args, device)
    cot = args.task == "cot-addition"
    if cot:
        reward_fn = cot_reward_fn(tokenizer, device)
        train_prompts = [q for q, _ in load_questions("--dataset", args.dataset, "train",
                                                      tokenizer)]
        references = (load_questions("--reference-dataset", args.reference_dataset, "train",
                                     tokenizer) if args.filter_method == "i-ppo" else [])
        eval_problems = load_questions("--eval-dataset", args.eval_dataset, args.eval_split,
                                       tokenizer)[:args.eval_samples]
        val_prompts = []
    else:
        clf = rlhf_iif.load_classifier("--reward-model", args.reward_model, "--reward-label",
                                       args.reward_label, device)
        reward_fn = rlhf_iif.make_reward_fn(*clf, device)
        train_prompts, val_prompts = rlhf_iif.load_prompts(args, tokenizer)
        references = (detox_references(args, tokenizer, clf, device)
                      if args.filter_method == "i-ppo" else [])
        if args.eval_every:
            eval_clf = rlhf_iif.load_classifier("--eval-reward-model", args.eval_reward_model,
                                                "--eval-toxic-label", args.eval_toxic_label, device)
            eval_prompts = rlhf_iif.load_eval_prompts(args, tokenizer)
    if args.filter_method == "i-ppo" and len(references) < args.validation_size:
        fail(f"--validation-size {args.validation_size}: only {len(references)} reference "
             "answers")
    t_sft = None
    if args.filter_method == "i-ppo":
        t_sft = reference_episodes(references[:args.validation_size], tokenizer, device)
        print(f"I-PPO: f_sft on {args.validation_size} reference answers of {len(references)}")
    n_rounds = args.rounds or len(train_prompts) // args.batch_size
    if args.compile:  # rlhf_compile.py's sampler and step: rlhf_compile.main's
        optimizer = rlhf_compile.make_optimizer(policy, args, device)
        sample = rlhf_compile.compiled_sampler(policy, args, device)
        step = rlhf_compile.CompiledStep(policy, optimizer, args, device)
        update = functools.partial(rlhf_compile.ppo_update, step)
    else:
        optimizer = rlhf_iif.make_optimizer(policy, args, device)
        sample, update = rlhf_iif.generate, functools.partial(rlhf_iif.ppo_update, policy, optimizer)
    run_dir = os.path.join(args.runs_dir, args.run_name)
    start, kl_coef, order, old = 0, args.init_kl_coef, [], None
    if args.resume and os.path.exists(os.path.join(run_dir, "checkpoint.pt")):
        start, kl_coef, order, old = resume(run_dir, policy, optimizer, gen, device)
    run = rlhf_iif.Run(args, n_rounds, policy, device, COLUMNS)
    if old is not None:  # the rows and episodes of the rounds before start
        run.writer.writerows(old[0])
        run.episodes_file.writelines(old[1])
    try:
        for k in range(start, n_rounds):
            if len(order) < args.batch_size:
                order = order + torch.randperm(len(train_prompts), generator=gen).tolist()
            queries = [train_prompts[i] for i in order[:args.batch_size]]
            order = order[args.batch_size:]

            # Stage I (Alg. 1): the buffer B(k)
            t0 = timer(device)
            b = sample(policy, queries, tokenizer, args, device)
            b["rewards"] = reward_fn(b["texts"], queries)
            t1 = timer(device)
            rlhf_iif.rollout(policy, ref, b, kl_coef, args)
            t_generate, t_forward = t1 - t0, timer(device) - t1
            marks = ([check(t, *operands(tokenizer, q)) for t, q in zip(b["texts"], queries)]
                     if cot else None)

            # Stage II: IIF's influence and filter, or I-PPO's score, filter and weights
            t0 = timer(device)
            scores, weights = None, torch.ones(args.batch_size, device=device)
            kept = torch.full((args.batch_size,), args.train)
            if args.train and args.filter_method == "i-ppo":
                scores, kept, weights = i_ppo(policy, b, t_sft, args)
            elif args.train and args.filter_method != "none":
                tb = b
                if args.target_data == "validation":
                    tb = rlhf_iif.episodes(policy, ref, val_prompts, kl_coef, reward_fn, tokenizer,
                                           args, device)
                scores = rlhf_iif.influence(policy, b, tb, args)
                kept = rlhf_iif.filter_records(scores, args.filter_method, args.filter_p, gen)[0]
            kept = kept.to(device)
            if scores is not None and not torch.isfinite(scores).all():
                fail(f"round {k}: non-finite influence scores; lower --learning-rate")
            t_influence = timer(device) - t0

            # Stage III: PPO on the kept episodes, weighted (nothing kept: no step, the run goes on)
            t0 = timer(device)
            try:
                n_updates, stats = update(b, kept, args, gen, weights)
            except FloatingPointError as e:
                fail(f"round {k}: {e}; lower --learning-rate")
            t_optim = timer(device) - t0
            kl = b["kl"].mean().item()
            kept_list = kept.tolist()
            row = dict(round=k, episodes=(k + 1) * args.batch_size,
                       reward_mean=b["rewards"].mean().item(), reward_std=b["rewards"].std().item(),
                       kl=kl, kl_coef=kl_coef, n_kept=sum(kept_list),
                       n_negative="" if scores is None else int((scores < 0).sum()), **stats,
                       explained_var=rlhf_iif.explained_variance(b),
                       n_updates=n_updates, eval_toxicity="", t_generate=t_generate,
                       t_forward=t_forward, t_influence=t_influence, t_optim=t_optim, t_eval=0.0,
                       weight_max=weights[kept].max().item() if any(kept_list) else "",
                       eval_accuracy="", eval_unfaithful="", unfaithful_buffer="",
                       unfaithful_kept="")
            if cot:
                row["unfaithful_buffer"] = unfaithful_share(marks)
                row["unfaithful_kept"] = unfaithful_share([m for m, kp in zip(marks, kept_list)
                                                           if kp])
            if args.train:
                kl_coef = rlhf_iif.update_kl_coef(kl_coef, kl, args.batch_size, args)

            if args.eval_every and (k + 1) % args.eval_every == 0:
                t0 = timer(device)
                if cot:
                    row["eval_accuracy"], row["eval_unfaithful"] = evaluate_cot(
                        policy, eval_problems, tokenizer, args, device)
                else:
                    row["eval_toxicity"] = rlhf_iif.evaluate(policy, eval_prompts, tokenizer,
                                                             eval_clf, args, device)
                row["t_eval"] = timer(device) - t0
            # each episode's loss weight in Stage III, 0 when it was not trained on
            fields = dict(weight=torch.where(kept, weights, 0.0).tolist())
            if cot:
                fields.update(right=[r for r, _ in marks], faithful=[f for _, f in marks])
            run.end_round(row, b, queries, scores, kept, tokenizer, **fields)
            checkpoint(run, k, n_rounds, policy, optimizer, gen, kl_coef, order, device)
        if args.eval_every:  # the final policy: its KL to the reference, reward and test metric
            queries = [q for q, _ in eval_problems] if cot else eval_prompts
            final, tb = rlhf_iif.final_test(policy, ref, queries, tokenizer, reward_fn, args, device)
            if cot:
                marks = [check(t, *operands(tokenizer, q)) for t, q in zip(tb["texts"], queries)]
                run.final(final, final_accuracy=np.mean([r for r, _ in marks]),
                          final_unfaithful=unfaithful_share(marks))
            else:
                run.final(final, final_toxicity=rlhf_iif.toxicity(tb["texts"], eval_clf, device))
    finally:
        run.finish(policy, tokenizer)


# ---- Long runs: checkpoints and --resume ----
def checkpoint(run, k, n_rounds, policy, optimizer, gen, kl_coef, order, device):
    """After every --save-every-th round and the last: what the next round starts from, written to
    a temporary file first, so that a run killed while saving keeps the previous one"""
    every = run.args.save_every
    if not every or ((k + 1) % every and k + 1 < n_rounds):
        return
    path = os.path.join(run.dir, "checkpoint.pt")
    trained = {n: p.detach() for n, p in policy.named_parameters() if p.requires_grad}
    cuda_rng = torch.cuda.get_rng_state_all() if device.type == "cuda" else None
    torch.save(dict(round=k, trained=trained, optimizer=optimizer.state_dict(), kl_coef=kl_coef,
                    order=order, torch_rng=torch.get_rng_state(), gen=gen.get_state(),
                    cuda_rng=cuda_rng), path + ".tmp")
    os.replace(path + ".tmp", path)


def resume(run_dir, policy, optimizer, gen, device):
    """(first round, beta, prompt order, (rows, episodes) before it) after the last checkpointed
    round, whose weights, optimizer and random states are restored"""
    ckpt = torch.load(os.path.join(run_dir, "checkpoint.pt"), map_location=device,
                      weights_only=False)
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if p.requires_grad:
                p.copy_(ckpt["trained"][n])
    optimizer.load_state_dict(ckpt["optimizer"])
    torch.set_rng_state(ckpt["torch_rng"])
    if ckpt["cuda_rng"] is not None:
        torch.cuda.set_rng_state_all(ckpt["cuda_rng"])
    gen.set_state(ckpt["gen"])
    start = ckpt["round"] + 1
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        rows = [r for r in csv.DictReader(f) if int(r["round"]) < start]
    with open(os.path.join(run_dir, "episodes.jsonl")) as f:
        episodes = [line for line in f if json.loads(line)["round"] < start]
    print(f"resumed after round {ckpt['round']}")
    return start, ckpt["kl_coef"], ckpt["order"], (rows, episodes)


def resolve_args(args):
    """rlhf_iif.py's checks, and this file's flags"""
    if args.resume and args.run_name is None:
        fail("--resume needs the --run-name of the run to continue")
    args = rlhf_iif.resolve_args(args, resuming=args.resume)
    run_dir = os.path.join(args.runs_dir, args.run_name)
    if args.resume and os.path.exists(os.path.join(run_dir, "checkpoint.pt")):
        saved = json.load(open(os.path.join(run_dir, "config.json")))
        changed = [f"--{k.replace('_', '-')} {saved.get(k)} (now {v})"
                   for k, v in vars(args).items() if k not in MAY_CHANGE and saved.get(k) != v]
        if changed:
            fail(f"--resume: {run_dir} was run with other flags: {'; '.join(changed)}")
    for ok, msg in [
        (args.save_every >= 0, f"--save-every must be 0 (never) or more, got {args.save_every}"),
        (args.task == "detox" or args.filter_method != "i-ppo" or args.reference_dataset,
         "--filter-method i-ppo with --task cot-addition needs --reference-dataset (the task's "
         "validation.jsonl)"),
        (args.task == "detox" or args.target_data == "buffer",
         "--target-data validation is for --task detox (held-out prompts of --dataset)"),
        (args.filter_method != "i-ppo" or args.target_data == "buffer",
         "--target-data is IIF's; --filter-method i-ppo scores against its reference answers")]:
        if not ok:
            fail(msg)
    return args


if __name__ == "__main__":
    args = resolve_args(tyro.cli(Args))
    try:
        main(args)
    except KeyboardInterrupt:
        run_dir = os.path.join(args.runs_dir, args.run_name)
        sys.exit(f"\ninterrupted: every finished round is in {run_dir}/metrics.csv; the same "
                 "command with --resume continues after the last checkpointed round")
