"""grpo_variants.py: the cheap filters (DAPO, PODS, CPPO), I-PPO's validation target, the verifiable task
(--reward-fn exact-answer) and TRL's checkpoints, on the tiny task of tests/conftest.py (offline)."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
import tyro

import grpo_iif
import grpo_variants
from conftest import run_killed
from test_grpo import ROOT, flags, parse, read_rows, runs, trainer_and_batch  # noqa: F401 (runs: a fixture)


def test_bad_flags_fail_early_naming_the_flag(tmp_path, toy):
    for extra, needle in [(("--validation-size", "500", "--target-data", "validation"), "--validation-size"),
                          (("--save-steps", "3", "--mini-batch-size", "4"), "--save-steps"),
                          (("--resume-from-checkpoint", "last"), "no checkpoint-* folder"),
                          (("--filter-method", "max-variance"), "--keep-fraction"),
                          (("--keep-fraction", "0.5"), "--keep-fraction"),
                          (("--filter-method", "abs-advantage", "--keep-fraction", "0"), "--keep-fraction"),
                          (("--filter-method", "zero-variance", "--filter-p", "0.5"), "--filter-p"),
                          (("--chat",), "--chat"), (("--batch-size", "7"), "--batch-size"),
                          (("--eval-every", "-1"), "--eval-every"), (("--eval-samples", "0"), "--eval-samples"),
                          (("--eval-toxic-label", "toxic"), "'offensive'")]:
        with pytest.raises(SystemExit) as e:
            grpo_variants.main(parse(toy, tmp_path, *extra, script=grpo_variants))
        assert needle in str(e.value), (extra, e.value)
        assert not (tmp_path / "r").exists()


def test_test_toxicity_every_n_and_after_the_last_leaves_training_unchanged(runs, toy, tmp_path):
    """--eval-every 3 over 4 generation batches measures after the third and the last. Its sampling leaves
    training's random state untouched, so the first two batches are grpo_iif.py's (the runs fixture's plain
    GRPO run), every column but the timings"""
    torch.manual_seed(0)
    grpo_variants.main(parse(toy, tmp_path, "--filter-method", "none", "--eval-every", "3", "--max-steps", "4",
                             script=grpo_variants))
    rows, core = read_rows(tmp_path / "r"), read_rows(runs / "toy__none__1")
    assert list(rows[0]) == grpo_iif.METRICS[:7] + ["eval_toxicity"] + grpo_iif.METRICS[7:] + ["t_eval"]
    assert [r["eval_toxicity"] == "" for r in rows] == [True, True, False, False]
    assert all(0 <= float(r["eval_toxicity"]) <= 1 and float(r["t_eval"]) > 0 for r in rows[2:])
    assert float(rows[0]["t_eval"]) == 0
    assert [{k: r[k] for k in core[0] if not k.startswith("t_")} for r in rows[:2]] == [
        {k: r[k] for k in r if not k.startswith("t_")} for r in core]


def test_final_json_reads_the_final_policy_on_the_last_tests_samples(toy, tmp_path):
    """final.json: on the test prompts, the samples of the last test metric (the same toxicity), their
    training reward, and the KL to the reference: each completion's per-token KL summed, recomputed here one
    prompt at a time (no padding) with peft's own switch for the adapter; 0 only if the policy never moved"""
    torch.manual_seed(0)
    trainer = grpo_variants.main(parse(toy, tmp_path, "--filter-method", "none", "--eval-every", "4",
                                       "--max-steps", "4", "--learning-rate", "1e-2", script=grpo_variants))
    with open(tmp_path / "r" / "final.json") as f:
        final = json.load(f)
    assert final["n_test"] == 4 and final["final_toxicity"] == float(read_rows(tmp_path / "r")[-1]["eval_toxicity"])
    model, tok, args = trainer.accelerator.unwrap_model(trainer.model), trainer.processing_class, trainer.iif_args
    queries = trainer.evaluation[0]
    texts, completions = grpo_variants.sample(model, queries, tok, args)
    rewards = trainer.reward_funcs[0](prompts=tok.batch_decode(queries), completions=texts)
    assert final["final_reward"] == pytest.approx(sum(rewards) / 4, rel=1e-6)
    kl = []
    with torch.no_grad():
        for q, c in zip(queries, completions):
            ids = torch.tensor([q + c])
            logp = torch.log_softmax(model(input_ids=ids).logits[0, len(q) - 1:-1].double(), -1)
            with model.disable_adapter():
                ref = torch.log_softmax(model(input_ids=ids).logits[0, len(q) - 1:-1].double(), -1)
            kl.append((logp.exp() * (logp - ref)).sum().item())
    assert min(kl) > 0 and final["final_kl"] == pytest.approx(sum(kl) / 4, rel=1e-4)


def test_validation_target_scores_the_batch_against_held_out_completions(toy, tmp_path):
    args, trainer, b = trainer_and_batch(toy, tmp_path, "--filter-method", "none", "--target-data", "validation",
                                         "--validation-size", "2", script=grpo_variants)
    logs, rewards = len(trainer._logs["completion"]), trainer.rewards
    t = trainer.validation_batch()
    assert len(t["advantages"]) == 4 and len(trainer._logs["completion"]) == logs  # 2 prompts x 2; out of the logs
    assert trainer.rewards is rewards  # the generation batch's rewards, for its metrics.csv row
    held = {r["prompt"] for r in trainer.held_rows[:2]}
    assert held.isdisjoint(trainer.train_dataset["prompt"])
    model = trainer.accelerator.unwrap_model(trainer.model)
    assert not torch.allclose(grpo_iif.influence(model, b, t, args), grpo_iif.influence(model, b, b, args))


def test_killed_run_resumes_from_its_last_checkpoint(toy, tmp_path):
    """A run killed (SIGKILL) after its checkpoint at step 4 continues from it with --resume-from-checkpoint last:
    metrics.csv keeps the generation batches that the checkpoint holds, and the run goes on as one never killed"""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")

    def cmd(name, steps, *extra):  # random filtering: its generator's state must come back too
        return [sys.executable, os.path.join(ROOT, "research", "grpo_variants.py"), *flags(toy, "--runs-dir", str(tmp_path), test=True),
                "--run-name", name, "--max-steps", str(steps), "--filter-method", "random", "--eval-every", "0",
                "--save-steps", "4", *extra]
    subprocess.run(cmd("whole", 6), env=env, check=True, capture_output=True, timeout=300)
    run = tmp_path / "killed"
    # one generation batch a step: killed as the 6th is filtered, before its next checkpoint (step 8)
    run_killed(cmd("killed", 100), "grpo_iif", "filter_records", 6, env)
    assert len(read_rows(run)) == 5
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-4"]
    out = subprocess.run(cmd("killed", 6, "--resume-from-checkpoint", "last"), env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "after 4 generation batches" in out.stdout
    resumed, whole = read_rows(run), read_rows(tmp_path / "whole")
    assert [r["round"] for r in resumed] == [r["step"] for r in resumed] == [str(i) for i in range(6)]
    for key in ("reward_mean", "n_kept"):
        assert [r[key] for r in resumed] == [r[key] for r in whole], key
    assert (run / "policy" / "adapter_config.json").exists()


def test_checkpoint_flags_reach_trl(toy, tmp_path):
    trainer = grpo_variants.make_trainer(parse(toy, tmp_path, "--save-steps", "2", script=grpo_variants))
    config = trainer.args
    assert config.save_strategy == "steps" and config.save_steps == 2 and config.output_dir == str(tmp_path / "r")


# ---- The cheap filters (DAPO, PODS, CPPO) and the verifiable task (--reward-fn exact-answer) ----
def test_zero_variance_drops_the_groups_whose_rewards_are_all_equal():
    rewards = torch.tensor([1., 1., 1., 1., 0., 1., 0., 0., .5, .5, .5, .5])
    assert grpo_variants.zero_variance(rewards, 4).tolist() == [False] * 4 + [True] * 4 + [False] * 4


def test_max_variance_keeps_the_subset_of_largest_variance():
    # m = 3 of {0, 1, 2, 3, 10}: {0, 1, 10} (variance 20.2) beats {0, 3, 10} (17.6) and {2, 3, 10}
    assert grpo_variants.max_variance(torch.tensor([2., 10., 0., 3., 1.]), 5, 3).tolist() == [False, True, True, False,
                                                                                      True]
    # binary rewards: as many right as wrong where the group allows it
    kept = grpo_variants.max_variance(torch.tensor([1., 1., 1., 1., 1., 1., 0., 0., 1., 0., 0., 0., 0., 0., 0., 0.]), 8, 4)
    assert kept.view(2, 8).sum(1).tolist() == [4, 4] and kept[6] and kept[7] and kept[8]
    # the top-i / bottom-(m - i) candidates reach the largest variance over all subsets of m
    import itertools
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(6 * 8, generator=gen).double()
    rewards[:16] = rewards[:16].round()  # groups with ties, too
    for m in (2, 3, 4, 5):
        kept = grpo_variants.max_variance(rewards, 8, m).view(6, 8)
        for g, r in enumerate(rewards.view(6, 8)):
            best = max(r[list(c)].var(unbiased=False) for c in itertools.combinations(range(8), m))
            assert kept[g].sum() == m and torch.isclose(r[kept[g]].var(unbiased=False), best, rtol=0, atol=1e-12)


def test_abs_advantage_drops_the_smallest_absolute_advantages_of_each_group():
    advantages = torch.tensor([.1, -2., .5, 1.5, 0., 0., 0., 0.])
    assert grpo_variants.abs_advantage(advantages, 4, 2).tolist() == [False, True, False, True, True, True, False, False]


def test_exact_answer_checks_the_last_number():
    assert grpo_variants.exact_answer(None, ["85", "85 12+3", "8", "", "so 1,234.", "x"],
                                 ["85", "85", "85", "85", "step... #### 1,234", "0"]) == [1., 0., 0., 0., 1., 0.]
    assert grpo_variants.exact_answer(None, [[{"role": "assistant", "content": "It is 7"}]], ["7"]) == [1.]  # chat


@pytest.mark.parametrize("method", ["max-variance", "abs-advantage"])
def test_cheap_filters_take_their_completions_out_through_the_hook(toy, tmp_path, method):
    args, trainer, b0 = trainer_and_batch(toy, tmp_path, "--filter-method", "none", script=grpo_variants)
    rewards = trainer.rewards[:, 0].clone()
    trainer.iif_args.filter_method, trainer.iif_args.keep_fraction = method, 0.5  # m = 1 of each group of 2
    torch.manual_seed(0)  # the same completions as b0, now filtered
    b = trainer._generate_and_score_completions([{"prompt": p} for p in trainer.train_dataset["prompt"][:4]
                                                 for _ in range(2)])
    kept = (grpo_variants.max_variance(rewards, 2, 1) if method == "max-variance"
            else grpo_variants.abs_advantage(b0["advantages"], 2, 1))
    assert int(kept.sum()) == 4 and len(b["advantages"]) == 4  # one micro-batch a generation batch: no padding
    assert torch.equal(b["completion_ids"], b0["completion_ids"][kept])
    assert b["num_items_in_batch"] == b0["completion_mask"][kept].sum()


@pytest.mark.parametrize("chat", [False, True])
def test_exact_answer_task_end_to_end(toy, tmp_path, chat):
    """--reward-fn exact-answer on addition rows, with an untrained policy: every answer is wrong, so
    every group's rewards are all 0, zero-variance drops every completion, and the test accuracy is 0.
    With --chat the questions are user messages in the tokenizer's chat template."""
    from transformers import AutoTokenizer
    from benchmarks.addition_toy_task import pairs, write_rows
    train, test = pairs(0, 20)
    write_rows(tmp_path / "train.jsonl", train[:60])
    write_rows(tmp_path / "test.jsonl", test)
    args = flags(toy, "--runs-dir", str(tmp_path), "--run-name", "add", "--reward-fn", "exact-answer",
                 "--filter-method", "zero-variance", "--gen-tokens", "4", *["--chat"] * chat, test=True)
    args[args.index("--dataset") + 1] = str(tmp_path / "train.jsonl")
    args[args.index("--eval-dataset") + 1] = str(tmp_path / "test.jsonl")
    if chat:  # the toy policy with a chat template
        shutil.copytree(toy / "policy", tmp_path / "policy")
        tok = AutoTokenizer.from_pretrained(tmp_path / "policy")
        tok.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"
        tok.save_pretrained(tmp_path / "policy")
        args[args.index("--model-name") + 1] = str(tmp_path / "policy")
    trainer = grpo_variants.main(grpo_variants.resolve_args(tyro.cli(grpo_variants.Args, args=args)))
    row = trainer.train_dataset[0]
    question = row["prompt"][0]["content"] if chat else row["prompt"]
    assert question.endswith("=") and row["answer"].isdigit()
    assert row["prompt"] == ([{"role": "user", "content": question}] if chat else question)
    question = f"{test[0][0]}+{test[0][1]}="  # the first test question, as the policy sees it
    assert trainer.processing_class.decode(trainer.evaluation[0][0]) == (
        f"<user>{question}<assistant>" if chat else question)
    rows = read_rows(tmp_path / "add")
    assert len(rows) == 2 and list(rows[0]) == trainer.columns and "eval_accuracy" in trainer.columns
    for r in rows:
        assert float(r["reward_mean"]) == 0 and int(r["n_kept"]) == 0 and r["n_negative"] == ""
        assert float(r["eval_accuracy"]) == 0 and float(r["t_eval"]) > 0


def test_cheap_filters_keep_their_input_device():
    """The masks are made where their input is (a GPU's tensors stay there); the meta device stands in here"""
    advantages = torch.tensor([.1, -2., .5, 1.5, 0., 0., 0., 0.], device="meta")
    assert grpo_variants.abs_advantage(advantages, 4, 2).device.type == "meta"
    assert grpo_variants.zero_variance(advantages, 4).device.type == "meta"




# ---- I-PPO's rules (--filter-method i-ppo) ----
def addition_args(toy, tmp_path, *extra):
    """grpo_variants.py's flags on addition rows (question, answer) in place of the toy's prompts"""
    from benchmarks.addition_toy_task import pairs, write_rows
    train, test = pairs(0, 20)
    write_rows(tmp_path / "train.jsonl", train[:60])
    write_rows(tmp_path / "test.jsonl", test)
    args = flags(toy, "--runs-dir", str(tmp_path), "--run-name", "add", "--reward-fn", "exact-answer",
                 "--gen-tokens", "4", *extra, test=True)
    args[args.index("--dataset") + 1] = str(tmp_path / "train.jsonl")
    args[args.index("--eval-dataset") + 1] = str(tmp_path / "test.jsonl")
    return grpo_variants.resolve_args(tyro.cli(grpo_variants.Args, args=args))


@pytest.mark.parametrize("reweight", [True, False])
def test_i_ppo_weights_the_kept_completions_in_trls_loss(toy, tmp_path, reweight):
    """float64, away from theta(k): i-ppo keeps the completions scoring > 0, with weights score / mean kept score
    (1 with --no-reweight), and TRL's loss on the filtered batch is the sum of the kept completions' weighted
    losses; the scores are the influence on the reference answers' log-likelihood"""
    from test_grpo import perturb_
    args = addition_args(toy, tmp_path, "--filter-method", "i-ppo", "--validation-size", "4",
                         *[] if reweight else ["--no-reweight"])
    trainer = grpo_variants.make_trainer(args, dtype=torch.float64)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    torch.manual_seed(0)
    inputs = [r for r in trainer.train_dataset.select(range(4)) for _ in range(2)]
    b = super(grpo_iif.IIFGRPOTrainer, trainer)._generate_and_score_completions(inputs)  # TRL's: unfiltered
    model = trainer.accelerator.unwrap_model(trainer.model)
    perturb_(model)
    b["advantages"] = torch.linspace(-1, 1, 8, dtype=torch.float64)  # the untrained policy's are all 0
    kept, scores = trainer.i_ppo(b)
    assert torch.equal(kept, scores > 0) and 0 < int(kept.sum()) < 8
    w = b["tool_mask"][:, 0]
    assert (b["tool_mask"] == w[:, None]).all() and (w[~kept] == 0).all()
    if reweight:
        assert torch.allclose(w[kept], scores[kept] / scores[kept].mean()) and w[kept].mean() == pytest.approx(1)
    else:
        assert (w[kept] == 1).all()
    t = trainer.reference_batch()  # 4 held-out questions with their answers and EOS
    assert len(t["advantages"]) == 4 and (t["completion_ids"][torch.arange(4), t["completion_mask"].sum(1) - 1]
                                          == trainer.processing_class.eos_token_id).all()
    f = (grpo_iif.completion_logprobs(model, t, torch.arange(4)) * t["completion_mask"]).sum() / t["completion_mask"].sum()
    params = [p for p in model.parameters() if p.requires_grad]
    g_f = torch.autograd.grad(f, params)
    for i in range(8):
        g_i = torch.autograd.grad(grpo_iif.completion_losses(model, b, torch.tensor([i]), args).sum(), params)
        assert torch.allclose(scores[i], -sum((a * c).sum() for a, c in zip(g_f, g_i)).cpu(), rtol=1e-7)
    filtered = grpo_iif.keep_only(trainer, b, kept)
    expected = (filtered["tool_mask"][:, 0] * grpo_iif.completion_losses(model, filtered, torch.arange(
        len(filtered["advantages"])), args)).sum()
    assert torch.allclose(trainer._compute_loss(trainer.model, filtered), expected, rtol=1e-10)


def test_i_ppo_needs_reference_answers(toy, tmp_path):
    with pytest.raises(SystemExit) as e:
        parse(toy, tmp_path, "--filter-method", "i-ppo", script=grpo_variants)
    assert "--reward-fn exact-answer" in str(e.value)


def test_plain_filter_trains_what_trls_own_trainer_trains(toy, tmp_path):
    """grpo_iif.py's trainer with --filter-method none and TRL's GRPOTrainer, built from the same config and seed:
    bit-identical weights after two optimizer steps"""
    import trl

    class TRLs(trl.GRPOTrainer):  # TRL's trainer as it is, built by make_trainer
        sharded = False

        def __init__(self, *a, iif_args, **kw):
            super().__init__(*a, **kw)
    weights = []
    for cls in (grpo_iif.IIFGRPOTrainer, TRLs):
        args = parse(toy, tmp_path, "--filter-method", "none", name=cls.__name__)
        torch.manual_seed(0)
        trainer = grpo_iif.make_trainer(args, cls=cls)
        trainer.train()
        weights.append({n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad})
    assert weights[0].keys() == weights[1].keys()
    assert any((p != 0).any() for n, p in weights[0].items() if "lora_B" in n)  # trained: B moved off 0
    assert all(torch.equal(weights[0][n], weights[1][n]) for n in weights[0])
