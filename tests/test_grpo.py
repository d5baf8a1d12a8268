"""grpo_iif.py on a tiny GPT-2, a tiny ELECTRA classifier and tiny jsonl data built here (offline)."""
import csv
import json
import os
import subprocess
import sys

import pytest
import torch
import tyro

import grpo_iif

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = ["none", "influence", "random"]


def flags(toy, *extra, test=False):
    """test: grpo_variants.py's test toxicity too, on 4 test prompts"""
    return ["--model-name", str(toy / "policy"), "--reward-model", str(toy / "reward"),
            "--dataset", str(toy / "prompts.jsonl"), "--num-generations", "2",
            *(["--eval-dataset", str(toy / "wiki_toxic.jsonl"), "--eval-reward-model", str(toy / "eval_reward"),
               "--eval-samples", "4"] if test else []),
            "--batch-size", "8", "--mini-batch-size", "8", "--gen-tokens", "6", "--forward-batch-size", "3",
            "--threads", "1", "--use-cpu", "--max-steps", "2", *extra]


def parse(toy, tmp_path, *extra, name="r", script=grpo_iif):
    return script.resolve_args(tyro.cli(script.Args, args=flags(
        toy, "--runs-dir", str(tmp_path), "--run-name", name, *extra, test=script is not grpo_iif)))


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


def trainer_and_batch(toy, tmp_path, *extra, seed=0, prompts=4, script=grpo_iif):
    """A float64 trainer and one generation batch (4 prompts x 2 completions) of the training prompts"""
    args = parse(toy, tmp_path, *extra, script=script)
    trainer = script.make_trainer(args, dtype=torch.float64)
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
        assert r["loss"] != "" and r["entropy"] != "" and r["clip_frac"] != ""  # TRL's, per step
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
    scores = grpo_iif.influence_forward_mode(model, b, b, args)

    f = sum(grpo_iif.target(model, b, idx, args) for idx in grpo_iif.batches(8, 3))
    g_f = torch.autograd.grad(f, params)
    brute = []
    for i in range(8):
        g_i = torch.autograd.grad(grpo_iif.completion_losses(model, b, torch.tensor([i]), args).sum(), params)
        brute.append(-sum((a * c).sum() for a, c in zip(g_f, g_i)))
    brute = torch.stack(brute)
    print(f"{' '.join(extra) or 'LoRA, f_seq'}: max |influence_forward_mode - autograd| = "
          f"{(scores - brute).abs().max().item():.2e} (scores up to {brute.abs().max().item():.2e})")
    assert torch.allclose(scores, brute, rtol=1e-9, atol=1e-14), (scores, brute)
    assert (scores.abs() > 1e-8).all()
    if "--no-lora" in extra:  # embeddings and norms train too: no activation form
        assert grpo_iif.trained_linears(model) is None
    else:  # the activation form, which sharded parameters use, gives the same scores
        sharded = grpo_iif.influence(model, b, b, args)
        print(f"{' '.join(extra) or 'LoRA, f_seq'}: max |influence (activations) - autograd| = "
              f"{(sharded - brute).abs().max().item():.2e}")
        assert torch.allclose(sharded, brute, rtol=1e-9, atol=1e-14), (sharded, brute)


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
    kept = grpo_iif.influence_forward_mode(model, b0, b0, args) > 0
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


def test_random_filters_draw_from_their_own_generator():
    """The random filter draws from the run's filter generator alone, whatever the global torch RNG has done (so
    the runs' other draws are the same with and without it)"""
    import iif
    import rlhf_iif
    scores = torch.linspace(-1, 1, 41)
    for filter_records in (grpo_iif.filter_records, rlhf_iif.filter_records, iif.filter_records):
        drawn = []
        for global_seed in (0, 1):
            torch.manual_seed(global_seed)
            drawn.append(filter_records(scores, "random", 0.5, torch.Generator().manual_seed(3))[0])
        assert torch.equal(*drawn) and not drawn[0].all()


def test_completion_losses_count_only_the_completions_tokens(toy, tmp_path):
    """TRL's "dapo" loss per completion, written out: the token sum of the clipped surrogate (and beta x the k3
    KL x the ratio) over the real tokens only, over the generation batch's token count; a completion that ends
    early leaves padding that counts nothing"""
    args, trainer, b = trainer_and_batch(toy, tmp_path, "--beta", "0.1")
    b["completion_mask"][0, 2:] = 0  # the first completion ends after 2 tokens
    b["num_items_in_batch"] = b["completion_mask"].sum()
    model = trainer.accelerator.unwrap_model(trainer.model)
    perturb_(model, 0.05)
    logp = grpo_iif.completion_logprobs(model, b, torch.arange(len(b["advantages"])))
    losses = grpo_iif.completion_losses(model, b, torch.arange(len(b["advantages"])), args, logp=logp)
    for i in range(len(losses)):
        total = 0.0
        for t in range(b["completion_mask"].shape[1]):
            if b["completion_mask"][i, t]:
                old = b["old_per_token_logps"][i, t] if "old_per_token_logps" in b else logp[i, t]
                r, a = torch.exp(logp[i, t] - old), b["advantages"][i]
                d = b["ref_per_token_logps"][i, t] - logp[i, t]
                total += -min(r * a, r.clamp(0.8, 1.2) * a) + 0.1 * (torch.exp(d) - d - 1) * r
        assert float(losses[i]) == pytest.approx(float(total / b["num_items_in_batch"]), rel=1e-9, abs=1e-12)


def test_filter_records():
    scores = torch.tensor([0.5, -1.0, 0.0, -2.0, 3.0, -1.0])
    gen = torch.Generator().manual_seed(0)
    assert grpo_iif.filter_records(scores, "influence", None, gen)[0].tolist() == [True, False, False, False, True,
                                                                               False]
    # p of the 3 negatives: floor(0.5 * 3) = 1, the most negative
    assert grpo_iif.filter_records(scores, "influence", 0.5, gen)[0].tolist() == [True, True, True, False, True, True]
    assert int(grpo_iif.filter_records(scores, "random", None, gen)[0].sum()) == 2
    many = -torch.ones(100) - torch.arange(100) / 1000  # 100 negatives: p x 100 is 28.999.. in floating point
    for p in (0.29, 0.57, 0.58):
        assert int((~grpo_iif.filter_records(many, "influence", p, gen)[0]).sum()) == round(100 * p)


def test_bad_flags_fail_early_naming_the_flag(tmp_path, toy, capsys):
    for extra, needle in [(("--filter-p", "1.5"), "--filter-p"), (("--batch-size", "7"), "--batch-size"),
                          (("--num-generations", "1"), "--num-generations"), (("--max-steps", "0"), "--max-steps"),
                          (("--mini-batch-size", "3"), "--mini-batch-size"),
                          (("--mini-batch-size", "2", "--gradient-accumulation-steps", "3"),
                           "--gradient-accumulation-steps"),
                          (("--reward-label", "toxic"), "'nothate'"),
                          (("--lora-target-modules", "no_such_module"), "--lora-target-modules"),
                          (("--report-to", "no_such_tracker"), "--report-to")]:
        with pytest.raises(SystemExit) as e:
            grpo_iif.main(parse(toy, tmp_path, *extra))
        assert needle in str(e.value), (extra, e.value)
        assert not (tmp_path / "r").exists()
    with pytest.raises(SystemExit):
        parse(toy, tmp_path, "--filter-method", "best")
    err = capsys.readouterr().err
    assert "--filter-method" in err and "influence" in err and "random" in err


def test_help_states_each_worked_out_default_once(capsys):
    """A flag whose None stands for a default worked out at run time states that default in its help, and
    --help adds no "(default: None)" after it"""
    import re
    with pytest.raises(SystemExit):
        tyro.cli(grpo_iif.Args, args=["--help"])
    text = " ".join(re.sub(r"[│╭╮╰╯─]", " ", capsys.readouterr().out).split())  # the box's wrapped lines joined
    assert "(default: None)" not in text
    for stated in ("(default: grpo__method__seed__time)", "(default: bfloat16 on a GPU that has it, else float32)",
                   "(default: torch's choice)", "(default: one pass over the training prompts)",
                   "(default: peft's choice for the architecture)", "(default: drop every completion with influence",
                   "(default: 64 on a GPU, 16 on the CPU)"):
        assert text.count(stated) == 1, stated


@pytest.mark.parametrize("flag,name", [("--dataset", "no-such-org/no-such-dataset"),
                                       ("--dataset", "/nonexistent/prompts.jsonl"),
                                       ("--reward-model", "/nonexistent/classifier"),
                                       ("--eval-dataset", "/nonexistent/wiki_toxic.jsonl"),
                                       ("--eval-reward-model", "/nonexistent/classifier")])
def test_unloadable_name_stops_cleanly(tmp_path, toy, flag, name):
    import grpo_variants
    script = grpo_variants if flag.startswith("--eval") else grpo_iif
    args = flags(toy, "--runs-dir", str(tmp_path), "--run-name", "r", test=script is grpo_variants)
    args[args.index(flag) + 1] = name
    with pytest.raises(SystemExit) as e:
        script.main(script.resolve_args(tyro.cli(script.Args, args=args)))
    assert f"{flag} {name!r} could not be loaded" in str(e.value) and "local path" in str(e.value)
    assert not (tmp_path / "r").exists()


def test_unloadable_model_exits_without_a_traceback(tmp_path, toy):
    args = flags(toy, "--runs-dir", str(tmp_path), "--run-name", "r")
    args[args.index("--model-name") + 1] = "no-such-org/no-such-model"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "research", "grpo_iif.py"), *args], capture_output=True,
                          text=True, timeout=300,
                          env=dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1"))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "--model-name 'no-such-org/no-such-model' could not be loaded" in proc.stderr
    assert not (tmp_path / "r").exists()


def test_docs_links_point_at_what_they_name():
    import re
    text = open(os.path.join(ROOT, "docs", "grpo.md")).read()
    for script, at_least in (("grpo_iif", 10), ("grpo_variants", 4)):
        lines = open(os.path.join(ROOT, "research", f"{script}.py")).read().splitlines()
        links = re.findall(rf"\[`([^`]+)`\]\((?:\.\./research/)?{script}\.py#L(\d+)\)", text)
        assert len(links) >= at_least, script
        for name, line in links:  # the line that defines it: its def or class, or a "# Stage I (" comment
            defines = re.compile(rf"^\s*((def|class) {re.escape(name.split('.')[-1])}\(|# {re.escape(name)} \()")
            assert defines.match(lines[int(line) - 1]), f"{script}.py: `{name}` linked to line {line}: " \
                                                         f"{lines[int(line) - 1]!r}"


def test_tracking_flags_reach_trl_and_carry_iifs_columns(toy, tmp_path):
    config = grpo_iif.make_config(parse(toy, tmp_path, "--report-to", "wandb,tensorboard"))
    assert config.report_to == ["wandb", "tensorboard"] and config.run_name == "r"
    config = grpo_iif.make_config(parse(toy, tmp_path))
    assert config.report_to == [] and config.save_strategy == "no" and config.output_dir == str(tmp_path / "r")
    torch.manual_seed(0)  # TRL's TensorBoard logs IIF's numbers beside its own
    grpo_iif.main(parse(toy, tmp_path, "--report-to", "tensorboard", "--logging-steps", "1", name="tb"))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = [d for d, _, files in os.walk(tmp_path / "tb") if any("tfevents" in f for f in files)]
    acc = EventAccumulator(events[0])
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/iif/kept_fraction", "train/iif/n_kept", "train/iif/n_negative",
            "train/iif/influence_seconds"} <= tags, tags
    rows = read_rows(tmp_path / "tb")
    assert [e.value for e in acc.Scalars("train/iif/n_kept")] == [float(r["n_kept"]) for r in rows]


def test_trl_private_members_it_overrides_are_as_pinned(toy, tmp_path):
    """IIFGRPOTrainer overrides three private methods of TRL's GRPOTrainer and reads its generation batch's
    fields and its _metrics: a TRL release that renames or reshapes any of them fails here, by name"""
    import inspect
    import trl
    pinned = {"_generate_and_score_completions": ["self", "inputs"], "_generate": ["self", "prompts"],
              "_calculate_rewards": ["self", "inputs", "prompts", "completions", "completion_ids_list"]}
    for name, params in pinned.items():
        assert list(inspect.signature(getattr(trl.GRPOTrainer, name)).parameters) == params, \
            f"TRL {trl.__version__} changed GRPOTrainer.{name}: grpo_iif.IIFGRPOTrainer overrides it"
    args, trainer, b = trainer_and_batch(toy, tmp_path, "--filter-method", "none")
    fields = {"prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "num_items_in_batch",
              "ref_per_token_logps"}
    assert fields <= set(b), f"TRL {trl.__version__}'s generation batch lacks {fields - set(b)}"
    assert trainer.rewards.shape == (8, 1) and isinstance(trainer._metrics["train"], dict)
    assert trainer.args.steps_per_generation == 1 and trainer.num_iterations == 1


@pytest.mark.parametrize("extra", [("--beta", "0"), ()])
def test_activation_passes_agree_with_forward_mode(toy, tmp_path, monkeypatch, extra):
    """At theta(k), float64: with beta = 0 one backward pass gives G and every score (grad f_seq is a multiple of
    the losses' gradients there); with beta > 0 a second backward pass gives G; a validation target (here a copy
    of the batch) or gradients too large to keep take a target pass first. All equal the forward-mode scores."""
    args, trainer, b = trainer_and_batch(toy, tmp_path, "--filter-method", "none", *extra)
    model = trainer.accelerator.unwrap_model(trainer.model)
    assert "old_per_token_logps" not in b  # one optimizer step a generation batch: the ratio is exactly 1
    forward_mode = grpo_iif.influence_forward_mode(model, b, b, args)
    assert (forward_mode.abs() > 1e-10).all()
    one_pass, validation = grpo_iif.influence(model, b, b, args), grpo_iif.influence(
        model, b, dict(b), args)
    monkeypatch.setattr(grpo_iif, "memory_for_grads", lambda device: 0)
    for scores in (one_pass, validation, grpo_iif.influence(model, b, b, args)):
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
    s64 = grpo_iif.influence(model, b, b, args)
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
    s16 = grpo_iif.influence(model16, b, b, args16)
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


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA")
def test_bfloat16_without_use_cpu_runs_on_a_machine_without_cuda(toy, tmp_path):
    """--dtype bfloat16 without --use-cpu: TRL's config is told to use the CPU, which it accepts in bf16"""
    args = grpo_iif.resolve_args(tyro.cli(grpo_iif.Args, args=[
        a for a in flags(toy, "--runs-dir", str(tmp_path), "--run-name", "r", "--dtype", "bfloat16") if a != "--use-cpu"]))
    trainer = grpo_iif.main(args)
    assert trainer.args.bf16 and trainer.accelerator.device.type == "cpu" and len(read_rows(tmp_path / "r")) == 2


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
    assert grpo_iif.filter_records(x, method, None, gen)[0].device.type == "cuda"
    import grpo_variants
    for kept in (grpo_variants.abs_advantage(x, 2, 1), grpo_variants.max_variance(x, 2, 1),
                 grpo_variants.zero_variance(x, 2)):
        assert kept.device.type == "cuda"
