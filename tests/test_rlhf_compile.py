"""rlhf_compile.py on the CPU (forward and loss under torch.compile; the CUDA graph around them needs a GPU:
benchmarks/gpu_check.sh): the same algorithm as the eager step, at static shapes, on the tests' 2-layer GPT-2; the
CUDA-graph path of CompiledStep with a stand-in for torch.cuda; and gpu_check.sh itself at a tiny shape."""
import contextlib
import copy
import functools
import os
import re
import subprocess
import sys

import pytest
import torch
import tyro

import rlhf_compile
import rlhf_iif
from benchmarks.rlhf_toy_task import byte_tokenizer, tiny_lm
from test_rlhf import ROOT, flags, perturb_, run_main

CPU = torch.device("cpu")


def budget_buffer(policy, ref, prompts, reward_fn, tok, args):
    """Stage I as rlhf_compile.main runs it: rows as wide as the prompt budget"""
    b = rlhf_compile.compiled_sampler(policy, args, CPU)(policy, prompts, tok, args, CPU)
    b["rewards"] = reward_fn(b["texts"], prompts)
    return rlhf_iif.rollout(policy, ref, b, 0.05, args)


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
    args, policy, ref, tok, reward_fn, prompts = setup(toy)
    torch.manual_seed(1)
    buffers = [budget_buffer(policy, ref, prompts[8 * i:8 * i + 8], reward_fn, tok, args)
               for i in range(2)]
    state = copy.deepcopy(policy.state_dict())
    kept = torch.tensor([1, 1, 1, 1, 1, 1, 0, 1], dtype=torch.bool)
    weights = torch.rand(8, generator=torch.Generator().manual_seed(2)) + 0.5
    out = {}
    for mode in ("eager", "compiled"):
        policy.load_state_dict(state)
        optimizer = rlhf_compile.make_optimizer(policy, args, CPU)
        # the compiled loop's Stage III against rlhf_iif.py's own
        update = (functools.partial(rlhf_compile.ppo_update, rlhf_compile.CompiledStep(policy, optimizer, args, CPU))
                  if mode == "compiled" else functools.partial(rlhf_iif.ppo_update, policy, optimizer))
        gen = torch.Generator().manual_seed(0)
        rounds = [update(buffers[0], kept, args, gen)]
        torch.compiler.set_stance("fail_on_recompile")
        try:
            rounds.append(update(buffers[1], kept, args, gen, weights))
        finally:
            torch.compiler.set_stance("default")
        out[mode] = rounds, {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
    return out, buffers, state


def test_compiled_step_matches_eager(eager_and_compiled):
    (eager, p_eager), (compiled, p_compiled) = eager_and_compiled[0]["eager"], eager_and_compiled[0]["compiled"]
    assert [n for n, _ in eager] == [n for n, _ in compiled] == [6, 6]  # 2 epochs of ceil(7 / 3) steps
    losses = [abs(a[k] - b[k]) for (_, a), (_, b) in zip(eager, compiled) for k in a]  # loss and diagnostics
    params = max((p_eager[n] - p_compiled[n]).abs().max().item() for n in p_eager)
    moved = min((p_eager[n] - eager_and_compiled[2][n]).abs().max().item() for n in p_eager)
    print(f"compiled against eager, float32, 12 Adam steps: mean losses and diagnostics {max(losses):.1e}, "
          f"parameters {params:.1e} "
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
    longest prompt equal those of the same buffer padded further (as rlhf_compile.py pads every buffer)"""
    args, policy, ref, tok, reward_fn, prompts = setup(toy)
    policy.to(torch.float64)
    b = rlhf_iif.episodes(policy, ref, prompts[:8], 0.05, reward_fn, tok, args, CPU)
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
    """rlhf_compile.py generates with a static KV cache: for one seed, the same continuations as the dynamic cache
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
            assert rlhf_compile.static_cache(lm, window + 1, CPU) == {}
    assert rlhf_compile.static_cache(lm, 12 + 20, CPU) == {"cache_implementation": "static"}
    args.prompt_max_tokens = 12
    out = []
    for sample in (rlhf_iif.generate, rlhf_compile.compiled_sampler(policy, args, CPU)):  # a static cache
        torch.manual_seed(3)
        out.append(sample(policy, queries, tok, args, CPU))
    assert all(torch.equal(out[0][k], out[1][k]) for k in ("ids", "attn", "mask")) and out[0]["texts"] == out[1]["texts"]


def test_non_finite_loss_stops_the_run_before_anything_non_finite_is_written(tmp_path, toy):
    """A learning rate that blows the weights up in the first round: the run stops naming the flag, writes no row,
    no checkpoint and no policy"""
    with pytest.raises(SystemExit) as e:
        run_main(tmp_path, toy, "--rounds", "3", "--learning-rate", "1e30", "--filter-method", "none")
    assert "non-finite PPO loss" in str(e.value) and "--learning-rate" in str(e.value)
    run = tmp_path / "r"
    assert open(run / "metrics.csv").read().strip() == ",".join(rlhf_iif.METRICS)
    assert not (run / "checkpoint.pt").exists() and not (run / "policy").exists()


def trained(policy):
    return {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}


def eager_steps(policy, optimizer, b, mbs, args):
    """ppo_update's eager step on each minibatch of mbs: the losses"""
    losses = []
    for mb in mbs:
        loss = rlhf_iif.ppo_losses(policy, b, mb, args).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def compiled_steps(step, b, mbs):
    """the losses, read after the last step, as ppo_update reads a round's stats once"""
    stats = [step(b, mb, torch.ones(len(mb))) for mb in mbs]
    return [s[0].item() for s in stats]


class FakeCuda:
    """torch.cuda's streams and graphs on the CPU. Work inside torch.cuda.stream(s) is marked as on a side stream;
    capturing records (and, like a real capture, does not do) the step's work: the trained weights and Adam's state
    are put back afterwards; a replay does the captured work again, writing fresh gradients and, in place, the
    captured output, as a replay writes into the graph's memory."""

    def __init__(self, policy, optimizer):
        self.policy, self.optimizer, self.step, self.events, self.side = policy, optimizer, None, [], False
        fake = self

        class Stream:
            def wait_stream(self, other):
                pass

        class CUDAGraph:
            def replay(self):
                fake.events.append("replay")
                for p in fake.params():
                    p.grad = None
                fake.step.out.copy_(fake.step.body())
        self.Stream, self.CUDAGraph = Stream, CUDAGraph

    def params(self):
        return [p for p in self.policy.parameters() if p.requires_grad]

    def current_stream(self):
        return self.Stream()

    @contextlib.contextmanager
    def stream(self, s):
        if s is not None:
            self.events.append("side stream")
            self.side = True
        yield
        self.side = False

    @contextlib.contextmanager
    def graph(self, g):
        assert all(p.grad is None for p in self.params()), "zero_grad(set_to_none=True) before capture"
        assert torch._dynamo.eval_frame._stance.stance == "fail_on_recompile", "capture under fail_on_recompile"
        weights = [p.detach().clone() for p in self.params()]
        state = copy.deepcopy(self.optimizer.state_dict()["state"])
        self.events.append("capture")
        yield
        with torch.no_grad():
            for p, w in zip(self.params(), weights):
                p.copy_(w)
        for i, s in state.items():
            for k, v in s.items():
                self.optimizer.state[self.params()[i]][k].copy_(v)


def test_cuda_graph_path_warms_up_captures_and_replays_as_eager_steps(toy, monkeypatch):
    """CompiledStep's CUDA path on the CPU (torch.compile and torch.cuda stood in for): 3 warm-up steps on a side
    stream, a capture after zero_grad(set_to_none=True), then replays whose outputs are cloned; new shapes and
    loaded optimizer state warm up and capture again; every loss and weight as the eager steps give them"""
    args, policy, ref, tok, reward_fn, prompts = setup(toy)
    torch.manual_seed(1)
    bs = [budget_buffer(policy, ref, prompts[8 * i:8 * i + 8], reward_fn, tok, args)
          for i in range(2)]
    bs.append(budget_buffer(policy, ref, prompts[16:22], reward_fn, tok, args))  # 6 episodes
    mbs = [torch.tensor(m) for m in ([0, 1, 2], [3, 4, 5], [6, 7, 0], [1, 2, 3], [4, 5, 6])]
    plan = [(0, mbs), (1, mbs[:2]), ("load", None), (1, mbs), (2, [torch.tensor([0, 1, 2]), torch.tensor([5])] * 3)]
    state = copy.deepcopy(policy.state_dict())
    out = {}
    for mode in ("eager", "graph"):
        policy.load_state_dict(state)
        optimizer = rlhf_compile.make_optimizer(policy, args, CPU)
        fake = FakeCuda(policy, optimizer)
        if mode == "graph":
            for name in ("Stream", "current_stream", "stream", "CUDAGraph", "graph"):
                monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
            monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)
            fake.step = rlhf_compile.CompiledStep(policy, optimizer, args, CPU, graph=True)
        losses, events = [], []
        for i, mb in plan:
            if i == "load":
                optimizer.load_state_dict(optimizer.state_dict())
                continue
            fake.events = []
            losses.append(compiled_steps(fake.step, bs[i], mb) if fake.step else
                          eager_steps(policy, optimizer, bs[i], mb, args))
            events.append(fake.events)
        out[mode] = losses, events, trained(policy)
        monkeypatch.undo()
    (l_e, _, w_e), (l_g, ev, w_g) = out["eager"], out["graph"]
    warm_capture = ["side stream"] * 3 + ["capture"]
    assert ev == [warm_capture + ["replay"] * 2, ["replay"] * 2, warm_capture + ["replay"] * 2,
                  warm_capture + ["replay"] * 3]
    for a, b in zip(l_e, l_g):
        assert a == pytest.approx(b, abs=1e-6)
    assert len(set(l_g[0])) == len(l_g[0])  # each step's own loss: replays' outputs are cloned
    assert max((w_e[n] - w_g[n]).abs().max().item() for n in w_e) < 1e-6


def test_make_optimizer_on_cuda_is_fused_and_compiled_capturable(toy, monkeypatch):
    made = []
    monkeypatch.setattr(torch.optim, "Adam", lambda params, **kw: made.append(kw))
    cuda = torch.device("cuda")
    args = rlhf_iif.resolve_args(tyro.cli(rlhf_iif.Args, args=flags(toy)))
    for make in (rlhf_iif.make_optimizer, rlhf_compile.make_optimizer):
        make(torch.nn.Linear(2, 2), args, cuda)
        make(torch.nn.Linear(2, 2), args, CPU)
    assert [(kw["fused"], kw.get("capturable", False)) for kw in made] == [(True, False), (None, False),
                                                                            (True, True), (None, False)]
    assert all(kw["lr"] == args.learning_rate and isinstance(kw["lr"], float) for kw in made)


SYNCS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default, torch.ops.aten.is_nonzero.default}


def recording_compile(graphs):
    """torch.compile whose backend keeps the forward and backward graphs of aten operations it would hand to
    Inductor (and runs them as they are)"""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    real = torch.compile

    def record(gm, _):
        graphs.append(gm)
        return make_boxed_func(gm.forward)
    return lambda fn, **kw: real(fn, backend=aot_autograd(fw_compiler=record, bw_compiler=record), **kw)


def ops(graphs):
    return {n.target for g in graphs for n in g.graph.nodes if n.op == "call_function"}


def test_compiled_step_reads_no_value_on_the_host(toy, monkeypatch):
    """What a CUDA graph captures may not make the GPU wait for the host: the compiled forward + loss and its
    backward hold no operation that reads a value (.item(), nonzero, a tensor's truth); fullgraph=True forbids a
    graph break, so nothing else runs between them. (Eagerly, transformers' mask code does read one.)"""
    args, policy, ref, tok, reward_fn, prompts = setup(toy)
    b = budget_buffer(policy, ref, prompts[:8], reward_fn, tok, args)
    graphs = []
    monkeypatch.setattr(torch, "compile", recording_compile(graphs))
    step = rlhf_compile.CompiledStep(policy, rlhf_compile.make_optimizer(policy, args, CPU), args, CPU)
    step(b, torch.tensor([2, 5]), torch.ones(2))
    assert len(graphs) == 2 and len(ops(graphs)) > 20  # forward and backward
    assert not ops(graphs) & SYNCS
    monkeypatch.setattr(torch._dynamo.config, "capture_dynamic_output_shape_ops", True)
    torch._dynamo.reset()
    graphs.clear()
    torch.compile(lambda x: x.nonzero().sum(), fullgraph=True)(torch.ones(3, requires_grad=True))
    assert ops(graphs) & SYNCS  # the check sees such a read when there is one


def test_compiled_and_eager_bfloat16_steps_agree_within_bfloat16_rounding(toy):
    """--dtype bfloat16 compiled on the CPU: fused kernels round differently, so the check is a tolerance"""
    args, policy, ref, tok, reward_fn, prompts = setup(toy, "--dtype", "bfloat16")
    b = budget_buffer(policy, ref, prompts[:8], reward_fn, tok, args)
    mbs = [torch.tensor(m) for m in ([0, 1, 2], [3, 4, 5], [6, 7, 0], [1, 2, 3])]
    state, losses = trained(policy), {}
    for mode in ("eager", "compiled"):
        with torch.no_grad():
            for n, p in policy.named_parameters():
                if p.requires_grad:
                    p.copy_(state[n])
        optimizer = rlhf_compile.make_optimizer(policy, args, CPU)
        losses[mode] = (compiled_steps(rlhf_compile.CompiledStep(policy, optimizer, args, CPU), b, mbs)
                        if mode == "compiled" else eager_steps(policy, optimizer, b, mbs, args))
    diff = max(abs(a - c) for a, c in zip(losses["eager"], losses["compiled"]))
    print(f"bfloat16 losses {losses}, largest difference {diff:.1e}")
    assert diff <= 1e-2 and max(map(abs, losses["eager"])) > 1e-2


def test_static_cache_decoding_compiles_once_for_two_rounds(toy, monkeypatch):
    """generate() with rlhf_compile.py's static cache and its compile_config (on CUDA; here on the CPU): the second round
    of the same shapes compiles no new graph"""
    from torch._dynamo.utils import counters
    args, policy, ref, tok, reward_fn, prompts = setup(toy)
    real = rlhf_compile.static_cache

    def on_this_cpu(lm, length, device):  # what static_cache gives a CUDA device, allowed on the CPU
        kw = real(lm, length, torch.device("cuda"))
        kw["compile_config"]._compile_all_devices = True
        return kw
    monkeypatch.setattr(rlhf_compile, "static_cache", on_this_cpu)
    sample = rlhf_compile.compiled_sampler(policy, args, CPU)
    graphs = [counters["stats"]["unique_graphs"]]
    for i in range(2):  # prompts of other lengths, rows as wide as the budget
        sample(policy, prompts[4 * i:4 * i + 4], tok, args, CPU)
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[1] > graphs[0] and graphs[2] == graphs[1], graphs


def test_gpu_check_runs_both_calls_end_to_end_at_a_tiny_shape(tmp_path, request):
    """benchmarks/gpu_check.sh 1 and 2 as a GPU machine runs them, on the CPU at a tiny shape: each call's limits
    add up to at most 300 s, every part ends well and writes its printout, and the temporary folder is removed.
    About 2 minutes on 2 cores, so asked for: python -m pytest tests -q --gpu-check -k gpu_check"""
    if not request.config.getoption("--gpu-check"):
        pytest.skip("benchmarks/gpu_check.sh end to end: python -m pytest tests -q --gpu-check -k gpu_check")
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    work = tmp_path / "tmp"
    work.mkdir()
    env = dict(os.environ, DEVICE="cpu", SHAPE="32x2", QWEN_SHAPE="32x2", BATCH="4", GRPO_BATCH="16",
               GRPO_TOKENS="4", OUT=str(tmp_path / "out"), PYTHON=sys.executable, TMPDIR=str(work),
               TORCHINDUCTOR_CACHE_DIR=cache_dir())  # the kernels the tests compiled already
    out = tmp_path / "out"
    for call, parts in [(1, ("preflight", "build", "step_check", "round_time_rlhf_compile", "iif_cuda")),
                        (2, ("preflight", "build", "round_time_rlhf_eager", "round_time_grpo"))]:
        proc = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gpu_check.sh"), str(call)], env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        limits = re.match(rf"call {call}: (.*) within (\d+) s\n", proc.stdout)
        assert limits and int(limits[2]) <= 300
        assert int(limits[2]) == sum(int(x.split()[1]) for x in limits[1].split(", "))
        for part in parts:
            assert re.search(rf"^{part}: exit 0 in \d+ s$", proc.stdout, re.M), proc.stdout[-3000:]
        assert (out / f"call{call}.txt").read_text() == proc.stdout
        assert os.listdir(work) == []
    step = (out / "step_check.md").read_text()
    numbers = re.search(r"Equality, float32, .* loss difference (\S+) .* weight difference after them (\S+) ", step)
    d_loss, d_weight = map(float, numbers.groups())
    assert d_loss < 1e-5 and d_weight < 1e-5
    graphs = re.search(r"\| --compile \| [\d.]+ \| [\d.]+ \(compile\) \| (\d+) / (\d+) \|", step)
    assert graphs and graphs[1] == graphs[2]
    assert "| optimiser step, ms |" in (out / "round_time_rlhf_compile.md").read_text()
    assert "Projected to 256 episodes" in (out / "round_time_rlhf_eager.md").read_text()
    assert "Acrobot-v1 on gymnasium, tests on gymnasium, cpu: 2 rounds" in (out / "iif_cuda.md").read_text()  # --no-cuda
    run = out / "round_time_rlhf_compile_runs" / "influence_0"  # rlhf_compile.main
    assert '"compile": true' in (run / "config.json").read_text()
    assert (run / "policy" / "adapter_config.json").exists()
