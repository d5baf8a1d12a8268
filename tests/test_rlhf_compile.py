"""rlhf_iif.py --compile on the CPU (forward and loss under torch.compile; the CUDA graph around them needs a GPU:
benchmarks/gpu_check.sh): the same algorithm as the eager step, at static shapes, on the tests' 2-layer GPT-2."""
import copy
import json
import os

import pytest
import torch
import tyro

import rlhf_iif
from benchmarks.rlhf_toy_task import byte_tokenizer, tiny_lm
from test_rlhf import flags, perturb_, run_main

CPU = torch.device("cpu")


def setup(toy, *extra):
    args = rlhf_iif.resolve_args(tyro.cli(rlhf_iif.Args, args=flags(toy, "--mini-batch-size", "3",
                                                                   "--learning-rate", "1e-3", *extra)))
    torch.manual_seed(0)
    policy, ref, tok = rlhf_iif.make_policy(args, CPU)
    reward_fn = rlhf_iif.make_reward_fn(*rlhf_iif.load_classifier("--reward-model", args.reward_model,
                                                                  "--reward-label", "nothate", CPU), CPU)
    return args, policy, ref, tok, reward_fn, rlhf_iif.load_prompts(args, tok)[0]


@pytest.fixture(scope="module")
def eager_and_compiled(toy):
    """Two rounds of Stage III from one state, eagerly and compiled, on buffers padded to the prompt budget: round 1
    keeps 7 of 8 episodes (minibatches of 3, 3 and a padded 1), round 2 has shorter prompts and I-PPO-like
    weights, and runs with recompiling forbidden"""
    args, policy, ref, tok, reward_fn, prompts = setup(toy, "--compile")
    torch.manual_seed(1)
    buffers = [rlhf_iif.rollout(policy, ref, prompts[8 * i:8 * i + 8], 0.05, reward_fn, tok, args, CPU)[0]
               for i in range(2)]
    state = copy.deepcopy(policy.state_dict())
    kept = torch.tensor([1, 1, 1, 1, 1, 1, 0, 1], dtype=torch.bool)
    weights = torch.rand(8, generator=torch.Generator().manual_seed(2)) + 0.5
    out = {}
    for mode in ("eager", "compiled"):
        policy.load_state_dict(state)
        optimizer = rlhf_iif.make_optimizer(policy, args, CPU)
        step = rlhf_iif.CompiledStep(policy, optimizer, args, CPU) if mode == "compiled" else None
        gen = torch.Generator().manual_seed(0)
        rounds = [rlhf_iif.ppo_update(policy, optimizer, buffers[0], kept, args, gen, step=step)]
        torch.compiler.set_stance("fail_on_recompile")
        try:
            rounds.append(rlhf_iif.ppo_update(policy, optimizer, buffers[1], kept, args, gen, weights, step))
        finally:
            torch.compiler.set_stance("default")
        out[mode] = rounds, {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
    return out, buffers, state


def test_compiled_step_matches_eager(eager_and_compiled):
    (eager, p_eager), (compiled, p_compiled) = eager_and_compiled[0]["eager"], eager_and_compiled[0]["compiled"]
    assert [n for n, _ in eager] == [n for n, _ in compiled] == [6, 6]  # 2 epochs of ceil(7 / 3) steps
    losses = [abs(a - b) for (_, a), (_, b) in zip(eager, compiled)]
    params = max((p_eager[n] - p_compiled[n]).abs().max().item() for n in p_eager)
    moved = min((p_eager[n] - eager_and_compiled[2][n]).abs().max().item() for n in p_eager)
    print(f"compiled against eager, float32, 12 Adam steps: mean losses {losses}, parameters {params:.1e} "
          f"(each parameter tensor moved at least {moved:.1e})")
    assert max(losses) <= 1e-6 and params <= 1e-6 and moved > 1e-3


def test_no_recompile_across_prompt_lengths(eager_and_compiled):
    """The second round ran under fail_on_recompile with prompts of other lengths: the buffer's width is the
    budget's"""
    prompt_lengths = [sorted(b["attn"][:, :15].sum(1).tolist()) for b in eager_and_compiled[1]]
    assert prompt_lengths[0] != prompt_lengths[1]
    assert all(b["ids"].shape == (8, 15 + 6) for b in eager_and_compiled[1])  # --prompt-max-tokens + --gen-tokens


def test_padding_to_the_budget_changes_no_loss_or_score(toy):
    """float64, away from theta(k): the per-episode losses and the influence scores of a buffer padded to its
    longest prompt equal those of the same buffer padded further (as --compile pads every buffer)"""
    args, policy, ref, tok, reward_fn, prompts = setup(toy)
    policy.to(torch.float64)
    b = rlhf_iif.rollout(policy, ref, prompts[:8], 0.05, reward_fn, tok, args, CPU)[0]
    perturb_(policy)
    wide = dict(b)
    extra = torch.full((8, 7), tok.pad_token_id)
    wide["ids"], wide["attn"] = torch.cat([extra, b["ids"]], 1), torch.cat([torch.zeros_like(extra), b["attn"]], 1)
    idx = torch.arange(8)
    for fn in (lambda x: rlhf_iif.ppo_losses(policy, x, idx, args), lambda x: rlhf_iif.influence(policy, x, x, args)):
        narrow, padded = fn(b), fn(wide)
        assert torch.allclose(narrow, padded, rtol=1e-12, atol=1e-15), (narrow - padded).abs().max()


@pytest.mark.parametrize("arch", ["gpt2", "gpt_neo"])
def test_static_cache_samples_what_the_dynamic_cache_samples(arch):
    """--compile generates with a static KV cache: for one seed, the same continuations as the dynamic cache
    (GPT-Neo within its local window; past it static_cache() keeps the dynamic cache)"""
    from peft import LoraConfig, get_peft_model
    tok = byte_tokenizer()
    torch.manual_seed(0)
    lm = get_peft_model(tiny_lm(tok, arch, width=32, heads=2), LoraConfig(r=4, lora_alpha=8, task_type="CAUSAL_LM"))
    with torch.no_grad():
        for n, p in lm.named_parameters():
            if "lora_B" in n:
                p.add_(0.1 * torch.randn_like(p))
    policy = rlhf_iif.Policy(lm).eval()
    args = rlhf_iif.Args(gen_tokens=20)
    queries = [list(range(40, 40 + n)) for n in (5, 12, 9, 12)]
    window = getattr(lm.config, "window_size", None)
    if window:
        assert rlhf_iif.static_cache(lm, window + 1, CPU) == {}
    assert rlhf_iif.static_cache(lm, 12 + 20, CPU) == {"cache_implementation": "static"}
    out = []
    for P in (None, 12):  # a fixed width: the static cache
        torch.manual_seed(3)
        out.append(rlhf_iif.generate(policy, queries, tok, args, CPU, P=P))
    assert all(torch.equal(a, b) for a, b in zip(*out))


def test_non_finite_loss_stops_the_run_before_anything_non_finite_is_written(tmp_path, toy):
    """A learning rate that blows the weights up in the first round: the run stops naming the flag, writes no row,
    no checkpoint and no policy"""
    with pytest.raises(SystemExit) as e:
        run_main(tmp_path, toy, "--rounds", "3", "--learning-rate", "1e30", "--filter-method", "none")
    assert "non-finite PPO loss" in str(e.value) and "--learning-rate" in str(e.value)
    run = tmp_path / "r"
    assert open(run / "metrics.csv").read().strip() == ",".join(rlhf_iif.METRICS)
    assert not (run / "checkpoint.pt").exists() and not (run / "policy").exists()


def test_compile_end_to_end(tmp_path, toy):
    """rlhf_iif.py --compile through main: two rounds, and the trained policy saved"""
    rows = run_main(tmp_path, toy, "--compile", "--rounds", "2", "--eval-every", "0")
    assert len(rows) == 2 and 0 < int(rows[1]["n_kept"]) < 8
    assert json.load(open(tmp_path / "r" / "config.json"))["compile"] is True
    assert os.path.exists(tmp_path / "r" / "policy" / "adapter_config.json")


def test_gpu_check_runs_end_to_end_at_a_tiny_shape(tmp_path):
    """benchmarks/gpu_check.sh as a GPU machine runs it, on the CPU at a tiny shape: every part ends well and
    writes its printout"""
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, DEVICE="cpu", SHAPE="32x2", QWEN_SHAPE="32x2", BATCH="4", EAGER_BATCH="4",
               GRPO_BATCH="16", GRPO_TOKENS="4", OUT=str(tmp_path))
    proc = subprocess.run(["bash", os.path.join(root, "benchmarks", "gpu_check.sh")], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for part in ("step_check", "round_time_rlhf_compile", "round_time_rlhf_eager", "round_time_grpo"):
        assert f"{part}: exit 0" in proc.stdout, proc.stdout[-3000:]
    assert "no recompile after step 1" in (tmp_path / "step_check.md").read_text()
    assert "| optimiser step, ms |" in (tmp_path / "round_time_rlhf_compile.md").read_text()
