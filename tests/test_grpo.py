"""grpo_iif.py on a tiny GPT-2, a tiny ELECTRA classifier and tiny jsonl data built here (offline)."""
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
import tyro

import grpo_iif

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = ["none", "influence", "random"]


def flags(toy, *extra):
    return ["--model-name", str(toy / "policy"), "--reward-model", str(toy / "reward"),
            "--dataset", str(toy / "prompts.jsonl"), "--eval-dataset", str(toy / "wiki_toxic.jsonl"),
            "--eval-reward-model", str(toy / "eval_reward"), "--eval-samples", "4", "--num-generations", "2",
            "--batch-size", "8", "--mini-batch-size", "8", "--gen-tokens", "6", "--forward-batch-size", "3",
            "--validation-size", "2", "--threads", "1", "--use-cpu", "--max-steps", "2", *extra]


def parse(toy, tmp_path, *extra, name="r"):
    return grpo_iif.resolve_args(tyro.cli(grpo_iif.Args, args=flags(
        toy, "--runs-dir", str(tmp_path), "--run-name", name, *extra)))


def read_rows(run_dir):
    with open(run_dir / "metrics.csv") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def runs(toy, tmp_path_factory):
    """Two optimizer steps (two generation batches) for each filter method, named as analysis.py reads them"""
    out = tmp_path_factory.mktemp("runs")
    for method in METHODS:
        torch.manual_seed(0)
        grpo_iif.main(parse(toy, out, "--filter-method", method, name=f"toy__{method}__1"))
    return out


def trainer_and_batch(toy, tmp_path, *extra, seed=0, prompts=4):
    """A float64 trainer and one generation batch (4 prompts x 2 completions) of the training prompts"""
    args = parse(toy, tmp_path, *extra)
    trainer = grpo_iif.make_trainer(args, dtype=torch.float64)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop, read by TRL's loss
    prompts = trainer.train_dataset["prompt"][:prompts]
    torch.manual_seed(seed)
    b = trainer._generate_and_score_completions([{"prompt": p} for p in prompts for _ in range(2)])
    return args, trainer, b


def perturb_(model, scale=0.3):
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(scale * torch.randn_like(p))


@pytest.mark.parametrize("method", METHODS)
def test_two_steps_end_to_end(runs, method):
    run = runs / f"toy__{method}__1"
    rows = read_rows(run)
    assert [r["round"] for r in rows] == ["0", "1"] and list(rows[0]) == grpo_iif.METRICS
    for r in rows:
        assert int(r["completions"]) == 8 and float(r["t_generate"]) > 0 and float(r["t_optim"]) > 0
        assert 0 <= float(r["eval_toxicity"]) <= 1 and float(r["t_eval"]) > 0  # after every update
        if method == "none":
            assert int(r["n_kept"]) == 8 and r["n_negative"] == ""
        else:
            assert 0 < int(r["n_kept"]) <= 8
    if method != "none":  # an untrained policy's batches hold harmful completions
        assert sum(int(r["n_kept"]) for r in rows) < 16
    if method == "random":  # the same first batch as IIF's, and as many completions dropped
        assert rows[0]["n_kept"] == read_rows(runs / "toy__influence__1")[0]["n_kept"]
    assert rows[0]["reward_mean"] == read_rows(runs / "toy__none__1")[0]["reward_mean"]  # same seed, same batch
    config = json.load(open(run / "config.json"))
    assert config["filter_method"] == method and config["batch_size"] == 8
    assert (run / "policy" / "adapter_config.json").exists()


def test_eval_every_n_and_the_last_leaves_training_unchanged(runs, toy, tmp_path):
    """--eval-every 3 over 4 generation batches measures after the third and the last; training's
    random state is untouched by it, so the first two batches are those of the run measuring every one"""
    torch.manual_seed(0)
    grpo_iif.main(parse(toy, tmp_path, "--filter-method", "none", "--eval-every", "3", "--max-steps", "4"))
    rows = read_rows(tmp_path / "r")
    assert [r["eval_toxicity"] == "" for r in rows] == [True, True, False, False]
    assert all(0 <= float(r["eval_toxicity"]) <= 1 for r in rows[2:]) and float(rows[0]["t_eval"]) == 0
    every = read_rows(runs / "toy__none__1")
    assert [r["reward_mean"] for r in rows[:2]] == [r["reward_mean"] for r in every]


def test_analysis_rlhf_draws_grpo_runs(runs, capsys):
    import analysis
    out = runs / "grpo.png"
    analysis.cmd_rlhf(analysis.Rlhf(runs=str(runs), env="toy", smooth=1, out=str(out)))
    assert out.stat().st_size > 10_000
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("| Standard | 2 |") for line in lines) and any(line.startswith("| IIF | 2 |")
                                                                            for line in lines)


@pytest.mark.parametrize("extra", [(), ("--no-lora",), ("--target", "f_loss")])
def test_influence_matches_per_completion_autograd(toy, tmp_path, extra):
    args, trainer, b = trainer_and_batch(toy, tmp_path, "--filter-method", "none", *extra)
    model = trainer.accelerator.unwrap_model(trainer.model)
    params = [p for p in model.parameters() if p.requires_grad]
    with torch.no_grad():  # theta(k)'s log-probs become the old ones; then move away so ratios clip
        b["old_per_token_logps"] = grpo_iif.completion_logprobs(model, b, torch.arange(8))
    perturb_(model)
    m = b["completion_mask"]
    ratio = torch.exp(grpo_iif.completion_logprobs(model, b, torch.arange(8)) - b["old_per_token_logps"])
    assert ((ratio - 1).abs()[m > 0] > args.epsilon).any() and b["advantages"].abs().min() > 0
    # the per-completion losses sum to TRL's own loss of a step on the whole batch (TRL's fused
    # log-probs are float32 even for a float64 model)
    assert torch.allclose(grpo_iif.completion_losses(model, b, torch.arange(8), args).sum(),
                          trainer._compute_loss(model, b), rtol=1e-5, atol=1e-6)
    scores = grpo_iif.influence(model, b, b, args)

    f = sum(grpo_iif.target(model, b, idx, args) for idx in grpo_iif.batches(8, 3))
    g_f = torch.autograd.grad(f, params)
    brute = []
    for i in range(8):
        g_i = torch.autograd.grad(grpo_iif.completion_losses(model, b, torch.tensor([i]), args).sum(), params)
        brute.append(-sum((a * c).sum() for a, c in zip(g_f, g_i)))
    brute = torch.stack(brute)
    print(f"max |influence - autograd| = {(scores - brute).abs().max().item():.2e} "
          f"(scores up to {brute.abs().max().item():.2e})")
    assert torch.allclose(scores, brute, rtol=1e-9, atol=1e-14), (scores, brute)
    assert (scores.abs() > 1e-8).all()
    if "--no-lora" in extra:  # embeddings and norms train too: no activation form
        assert grpo_iif.trained_linears(model) is None
    else:  # the activation form, which sharded parameters use, gives the same scores
        sharded = grpo_iif.influence_activations(model, b, b, args)
        print(f"max |activation form - autograd| = {(sharded - brute).abs().max().item():.2e}")
        assert torch.allclose(sharded, brute, rtol=1e-9, atol=1e-14), (sharded, brute)


def test_validation_target_scores_the_batch_against_held_out_completions(toy, tmp_path):
    args, trainer, b = trainer_and_batch(toy, tmp_path, "--filter-method", "none", "--target-data", "validation")
    logs = len(trainer._logs["completion"])
    t = trainer.validation_batch()
    assert len(t["advantages"]) == 4 and len(trainer._logs["completion"]) == logs  # 2 prompts x 2; out of the logs
    model = trainer.accelerator.unwrap_model(trainer.model)
    assert not torch.allclose(grpo_iif.influence(model, b, t, args), grpo_iif.influence(model, b, b, args))


@pytest.mark.parametrize("mini_batch", ["8", "2"])
def test_filter_takes_the_dropped_completions_out(toy, tmp_path, mini_batch):
    """The filtered batch holds the kept completions, then dropped ones with their mask zeroed up to
    whole micro-batches (1 or 4 of them); its loss and gradient are those of the kept ones alone"""
    args, trainer, b0 = trainer_and_batch(toy, tmp_path, "--filter-method", "none", "--mini-batch-size", mini_batch)
    model = trainer.accelerator.unwrap_model(trainer.model)
    trainer.iif_args.filter_method = "influence"
    torch.manual_seed(0)  # the same completions as b0, now filtered
    b = trainer._generate_and_score_completions([{"prompt": p} for p in trainer.train_dataset["prompt"][:4]
                                                 for _ in range(2)])
    kept = grpo_iif.influence(model, b0, b0, args) > 0
    k, n_micro = int(kept.sum()), trainer.args.steps_per_generation
    assert 0 < k < 8 and n_micro == 8 // int(mini_batch)
    assert len(b["advantages"]) == -(-k // n_micro) * n_micro  # k rounded up to whole micro-batches
    assert torch.equal(b["completion_ids"][:k], b0["completion_ids"][kept])
    assert torch.equal(b["completion_mask"][:k], b0["completion_mask"][kept]) and b["completion_mask"][k:].sum() == 0
    only_kept = grpo_iif.take_rows(b0, kept.nonzero()[:, 0])
    only_kept["num_items_in_batch"] = b0["completion_mask"][kept].sum()
    assert b["num_items_in_batch"] == only_kept["num_items_in_batch"]

    def loss_and_grad(batch):
        loss = trainer._compute_loss(model, batch)
        return loss, torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad])
    perturb_(model)  # off theta(k), where the KL and clipping terms count too
    (loss, grads), (loss_kept, grads_kept) = loss_and_grad(b), loss_and_grad(only_kept)
    assert torch.allclose(loss, loss_kept, rtol=1e-6)
    assert all(torch.allclose(g, h, rtol=1e-6, atol=1e-12) for g, h in zip(grads, grads_kept))
    assert not torch.allclose(loss, loss_and_grad(b0)[0])  # the dropped completions did count before


def test_filter_records():
    scores = torch.tensor([0.5, -1.0, 0.0, -2.0, 3.0, -1.0])
    gen = torch.Generator().manual_seed(0)
    assert grpo_iif.filter_records(scores, "influence", None, gen).tolist() == [True, False, False, False, True,
                                                                               False]
    # p of the 3 negatives: floor(0.5 * 3) = 1, the most negative
    assert grpo_iif.filter_records(scores, "influence", 0.5, gen).tolist() == [True, True, True, False, True, True]
    assert int(grpo_iif.filter_records(scores, "random", None, gen).sum()) == 2


def test_bad_flags_fail_early_naming_the_flag(tmp_path, toy, capsys):
    for extra, needle in [(("--filter-p", "1.5"), "--filter-p"), (("--batch-size", "7"), "--batch-size"),
                          (("--num-generations", "1"), "--num-generations"), (("--max-steps", "0"), "--max-steps"),
                          (("--mini-batch-size", "3"), "--mini-batch-size"),
                          (("--validation-size", "500", "--target-data", "validation"), "--validation-size"),
                          (("--reward-label", "toxic"), "'nothate'"), (("--eval-every", "-1"), "--eval-every"),
                          (("--eval-samples", "0"), "--eval-samples"),
                          (("--eval-toxic-label", "toxic"), "'offensive'"),
                          (("--lora-target-modules", "no_such_module"), "--lora-target-modules"),
                          (("--report-to", "no_such_tracker"), "--report-to"),
                          (("--save-steps", "3", "--mini-batch-size", "4"), "--save-steps"),
                          (("--resume-from-checkpoint", "last"), "no checkpoint-* folder"),
                          (("--filter-method", "max-variance"), "--keep-fraction"),
                          (("--keep-fraction", "0.5"), "--keep-fraction"),
                          (("--filter-method", "abs-advantage", "--keep-fraction", "0"), "--keep-fraction"),
                          (("--filter-method", "zero-variance", "--filter-p", "0.5"), "--filter-p"),
                          (("--chat",), "--chat")]:
        with pytest.raises(SystemExit) as e:
            grpo_iif.main(parse(toy, tmp_path, *extra))
        assert needle in str(e.value), (extra, e.value)
        assert not (tmp_path / "r").exists()
    with pytest.raises(SystemExit):
        parse(toy, tmp_path, "--filter-method", "best")
    err = capsys.readouterr().err
    assert "--filter-method" in err and "influence" in err and "random" in err


@pytest.mark.parametrize("flag,name", [("--dataset", "no-such-org/no-such-dataset"),
                                       ("--dataset", "/nonexistent/prompts.jsonl"),
                                       ("--reward-model", "/nonexistent/classifier"),
                                       ("--eval-dataset", "/nonexistent/wiki_toxic.jsonl"),
                                       ("--eval-reward-model", "/nonexistent/classifier")])
def test_unloadable_name_stops_cleanly(tmp_path, toy, flag, name):
    args = flags(toy, "--runs-dir", str(tmp_path), "--run-name", "r")
    args[args.index(flag) + 1] = name
    with pytest.raises(SystemExit) as e:
        grpo_iif.main(grpo_iif.resolve_args(tyro.cli(grpo_iif.Args, args=args)))
    assert f"{flag} {name!r} could not be loaded" in str(e.value) and "local path" in str(e.value)
    assert not (tmp_path / "r").exists()


def test_unloadable_model_exits_without_a_traceback(tmp_path, toy):
    args = flags(toy, "--runs-dir", str(tmp_path), "--run-name", "r")
    args[args.index("--model-name") + 1] = "no-such-org/no-such-model"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "grpo_iif.py"), *args], capture_output=True,
                          text=True, timeout=300,
                          env=dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1"))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "--model-name 'no-such-org/no-such-model' could not be loaded" in proc.stderr
    assert not (tmp_path / "r").exists()


def test_docs_links_point_at_what_they_name():
    import re
    lines = open(os.path.join(ROOT, "grpo_iif.py")).read().splitlines()
    for doc in ("docs/grpo.md", "README_grpo_snippet.md"):
        path = os.path.join(ROOT, doc)
        if not os.path.exists(path):
            continue
        links = re.findall(r"\[`([^`]+)`\]\((?:\.\./)?grpo_iif\.py#L(\d+)\)", open(path).read())
        assert len(links) >= 5, doc
        for name, line in links:  # the line that defines it: its def or class, or a "# Stage I (" comment
            defines = re.compile(rf"^\s*((def|class) {re.escape(name)}\(|# {re.escape(name)} \()")
            assert defines.match(lines[int(line) - 1]), f"{doc} links `{name}` to line {line}: {lines[int(line) - 1]!r}"


def test_killed_run_resumes_from_its_last_checkpoint(toy, tmp_path):
    """A run killed (SIGKILL) after its checkpoint at step 4 continues from it with --resume-from-checkpoint last:
    metrics.csv keeps the generation batches that the checkpoint holds, and the run goes on as one never killed"""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")

    def cmd(name, steps, *extra):  # random filtering: its generator's state must come back too
        return [sys.executable, os.path.join(ROOT, "grpo_iif.py"), *flags(toy, "--runs-dir", str(tmp_path)),
                "--run-name", name, "--max-steps", str(steps), "--filter-method", "random", "--eval-every", "0",
                "--save-steps", "4", *extra]
    subprocess.run(cmd("whole", 6), env=env, check=True, capture_output=True, timeout=300)
    run = tmp_path / "killed"
    proc = subprocess.Popen(cmd("killed", 100), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:  # one generation batch a step: kill it once the 6th has begun, before its next checkpoint (step 8)
        while not ((run / "metrics.csv").exists() and len(read_rows(run)) >= 5):
            assert proc.poll() is None, "the run ended first"
            time.sleep(0.01)
    finally:
        proc.kill()
    assert proc.wait() == -signal.SIGKILL
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


def test_tracking_and_checkpoint_flags_reach_trl(toy, tmp_path):
    args = parse(toy, tmp_path, "--save-steps", "2", "--output-dir", str(tmp_path / "out"))
    args.report_to = "wandb,tensorboard"  # not installed here, so resolve_args would refuse them
    config = grpo_iif.make_config(args)
    assert config.report_to == ["wandb", "tensorboard"] and config.run_name == "r"
    assert config.save_strategy == "steps" and config.save_steps == 2 and config.output_dir == str(tmp_path / "out")
    config = grpo_iif.make_config(parse(toy, tmp_path))
    assert config.report_to == [] and config.save_strategy == "no" and config.output_dir == str(tmp_path / "r")


# ---- The cheap filters (DAPO, PODS, CPPO) and the verifiable task (--reward-fn exact-answer) ----
def test_zero_variance_drops_the_groups_whose_rewards_are_all_equal():
    rewards = torch.tensor([1., 1., 1., 1., 0., 1., 0., 0., .5, .5, .5, .5])
    assert grpo_iif.zero_variance(rewards, 4).tolist() == [False] * 4 + [True] * 4 + [False] * 4


def test_max_variance_keeps_the_subset_of_largest_variance():
    # m = 3 of {0, 1, 2, 3, 10}: {0, 1, 10} (variance 20.2) beats {0, 3, 10} (17.6) and {2, 3, 10}
    assert grpo_iif.max_variance(torch.tensor([2., 10., 0., 3., 1.]), 5, 3).tolist() == [False, True, True, False,
                                                                                      True]
    # binary rewards: as many right as wrong where the group allows it
    kept = grpo_iif.max_variance(torch.tensor([1., 1., 1., 1., 1., 1., 0., 0., 1., 0., 0., 0., 0., 0., 0., 0.]), 8, 4)
    assert kept.view(2, 8).sum(1).tolist() == [4, 4] and kept[6] and kept[7] and kept[8]
    # the top-i / bottom-(m - i) candidates reach the largest variance over all subsets of m
    import itertools
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(6 * 8, generator=gen).double()
    rewards[:16] = rewards[:16].round()  # groups with ties, too
    for m in (2, 3, 4, 5):
        kept = grpo_iif.max_variance(rewards, 8, m).view(6, 8)
        for g, r in enumerate(rewards.view(6, 8)):
            best = max(r[list(c)].var(unbiased=False) for c in itertools.combinations(range(8), m))
            assert kept[g].sum() == m and torch.isclose(r[kept[g]].var(unbiased=False), best, rtol=0, atol=1e-12)


def test_abs_advantage_drops_the_smallest_absolute_advantages_of_each_group():
    advantages = torch.tensor([.1, -2., .5, 1.5, 0., 0., 0., 0.])
    assert grpo_iif.abs_advantage(advantages, 4, 2).tolist() == [False, True, False, True, True, True, False, False]


def test_exact_answer_checks_the_last_number():
    assert grpo_iif.exact_answer(None, ["85", "85 12+3", "8", "", "so 1,234.", "x"],
                                 ["85", "85", "85", "85", "step... #### 1,234", "0"]) == [1., 0., 0., 0., 1., 0.]
    assert grpo_iif.exact_answer(None, [[{"role": "assistant", "content": "It is 7"}]], ["7"]) == [1.]  # chat


@pytest.mark.parametrize("method", ["max-variance", "abs-advantage"])
def test_cheap_filters_take_their_completions_out_through_the_hook(toy, tmp_path, method):
    args, trainer, b0 = trainer_and_batch(toy, tmp_path, "--filter-method", "none")
    rewards = trainer.rewards[:, 0].clone()
    trainer.iif_args.filter_method, trainer.iif_args.keep_fraction = method, 0.5  # m = 1 of each group of 2
    torch.manual_seed(0)  # the same completions as b0, now filtered
    b = trainer._generate_and_score_completions([{"prompt": p} for p in trainer.train_dataset["prompt"][:4]
                                                 for _ in range(2)])
    kept = (grpo_iif.max_variance(rewards, 2, 1) if method == "max-variance"
            else grpo_iif.abs_advantage(b0["advantages"], 2, 1))
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
                 "--filter-method", "zero-variance", "--gen-tokens", "4", *["--chat"] * chat)
    args[args.index("--dataset") + 1] = str(tmp_path / "train.jsonl")
    args[args.index("--eval-dataset") + 1] = str(tmp_path / "test.jsonl")
    if chat:  # the toy policy with a chat template
        shutil.copytree(toy / "policy", tmp_path / "policy")
        tok = AutoTokenizer.from_pretrained(tmp_path / "policy")
        tok.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"
        tok.save_pretrained(tmp_path / "policy")
        args[args.index("--model-name") + 1] = str(tmp_path / "policy")
    trainer = grpo_iif.main(grpo_iif.resolve_args(tyro.cli(grpo_iif.Args, args=args)))
    row = trainer.train_dataset[0]
    question = row["prompt"][0]["content"] if chat else row["prompt"]
    assert question.endswith("=") and row["answer"].isdigit()
    assert row["prompt"] == ([{"role": "user", "content": question}] if chat else question)
    question = f"{test[0][0]}+{test[0][1]}="  # the first test question, as the policy sees it
    assert trainer.processing_class.decode(trainer.evaluation[1][0]) == (
        f"<user>{question}<assistant>" if chat else question)
    rows = read_rows(tmp_path / "add")
    assert len(rows) == 2 and list(rows[0]) == grpo_iif.METRICS
    for r in rows:
        assert float(r["reward_mean"]) == 0 and int(r["n_kept"]) == 0 and r["n_negative"] == ""
        assert float(r["eval_accuracy"]) == 0 and r["eval_toxicity"] == ""


@pytest.mark.parametrize("extra", [("--beta", "0"), ()])
def test_activation_passes_agree_with_forward_mode(toy, tmp_path, monkeypatch, extra):
    """At theta(k), float64: with beta = 0 one backward pass gives G and every score (grad f_seq is a multiple of
    the losses' gradients there); with beta > 0 a second backward pass gives G; a validation target (here a copy
    of the batch) or gradients too large to keep take a target pass first. All equal the forward-mode scores."""
    args, trainer, b = trainer_and_batch(toy, tmp_path, "--filter-method", "none", *extra)
    model = trainer.accelerator.unwrap_model(trainer.model)
    assert "old_per_token_logps" not in b  # one optimizer step a generation batch: the ratio is exactly 1
    forward_mode = grpo_iif.influence(model, b, b, args)
    assert (forward_mode.abs() > 1e-10).all()
    one_pass, validation = grpo_iif.influence_activations(model, b, b, args), grpo_iif.influence_activations(
        model, b, dict(b), args)
    monkeypatch.setattr(grpo_iif, "memory_for_grads", lambda device: 0)
    for scores in (one_pass, validation, grpo_iif.influence_activations(model, b, b, args)):
        assert torch.allclose(scores, forward_mode, rtol=1e-9, atol=1e-14), (scores, forward_mode)


def test_bfloat16_scores_track_float64(toy, tmp_path):
    """--dtype bfloat16 (TRL's bf16, frozen weights in bfloat16, scoring under autocast) against float64 on one
    generation batch of 32 completions: tolerance Spearman >= 0.99 and >= 95 % of the completions with the same
    fate (kept when the score is > 0); docs/grpo.md gives the figures on the trained toy task"""
    import scipy.stats
    args, trainer, b = trainer_and_batch(toy, tmp_path, "--filter-method", "none", "--batch-size", "32",
                                         "--mini-batch-size", "32", prompts=16)
    model = trainer.accelerator.unwrap_model(trainer.model)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # a trained adapter's size: LoRA B away from 0
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.add_(0.02 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    s64 = grpo_iif.influence_activations(model, b, b, args)
    args16 = parse(toy, tmp_path, "--filter-method", "none", "--batch-size", "32", "--mini-batch-size", "32",
                   "--dtype", "bfloat16")
    trainer16 = grpo_iif.make_trainer(args16)
    assert trainer16.args.bf16
    model16 = trainer16.accelerator.unwrap_model(trainer16.model)
    assert {p.dtype for p in model16.parameters() if not p.requires_grad} == {torch.bfloat16}
    trained = dict(model.named_parameters())
    with torch.no_grad():
        for n, p in model16.named_parameters():
            if p.requires_grad:
                assert p.dtype == torch.float32
                p.copy_(trained[n])
    s16 = grpo_iif.influence_activations(model16, b, b, args16)
    assert s16.dtype == torch.float32
    rho = scipy.stats.spearmanr(s64.numpy(), s16.double().numpy()).statistic
    same_fate = ((s64 > 0) == (s16 > 0)).double().mean()
    print(f"bfloat16 against float64: Spearman {rho:.4f}, same fate {same_fate:.3f}")
    assert rho >= 0.99 and same_fate >= 0.95


def test_bfloat16_run_and_the_cpu_default(toy, tmp_path):
    assert parse(toy, tmp_path).dtype == "float32" and parse(toy, tmp_path).forward_batch_size == 3
    assert parse(toy, tmp_path, "--forward-batch-size", "16").forward_batch_size == 16
    trainer = grpo_iif.main(parse(toy, tmp_path, "--dtype", "bfloat16", "--filter-method", "influence"))
    rows = read_rows(tmp_path / "r")
    assert trainer.args.bf16 and len(rows) == 2 and all(0 < int(r["n_kept"]) <= 8 for r in rows)


def test_cheap_filters_keep_their_input_device():
    """The masks are made where their input is (a GPU's tensors stay there); the meta device stands in here"""
    advantages = torch.tensor([.1, -2., .5, 1.5, 0., 0., 0., 0.], device="meta")
    assert grpo_iif.abs_advantage(advantages, 4, 2).device.type == "meta"
    assert grpo_iif.zero_variance(advantages, 4).device.type == "meta"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("method", ["influence", "random"])
def test_cuda_smoke(toy, tmp_path, method):
    """On a GPU: bfloat16 by default, every stage on the device, the filters' masks on their input's device"""
    args = grpo_iif.resolve_args(tyro.cli(grpo_iif.Args, args=[
        a for a in flags(toy, "--runs-dir", str(tmp_path), "--run-name", "r", "--filter-method", method)
        if a != "--use-cpu"]))
    assert args.dtype == "bfloat16"
    trainer = grpo_iif.main(args)
    assert trainer.accelerator.device.type == "cuda" and len(read_rows(tmp_path / "r")) == 2
    x = torch.tensor([0.5, -1.0, 0.0, -2.0], device="cuda")
    gen = torch.Generator().manual_seed(0)
    assert grpo_iif.filter_records(x, method, None, gen).device.type == "cuda"
    for kept in (grpo_iif.abs_advantage(x, 2, 1), grpo_iif.max_variance(x, 2, 1), grpo_iif.zero_variance(x, 2)):
        assert kept.device.type == "cuda"
