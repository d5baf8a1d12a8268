"""rlhf_iif.py --compile: the same optimizer step at static shapes under torch.compile, on CUDA one
CUDA graph a step, and generation with a static KV cache. Kept apart from rlhf_iif.py, which reads
as Alg. 1 and runs alone without this file (as LeanRL keeps its compile code apart from the
algorithm): rlhf_iif.main passes Stage I compiled_sampler(...) and Stage III a CompiledStep, in
place of generate and adam_step.

Why it pays on a GPU: an optimizer step trains on one 45-token episode; eagerly, PyTorch launches
some 4,000 small kernels for it from Python, so the step is launch-bound. Captured as one CUDA
graph (PyTorch's whole-network capture), a step is an index copy and a replay.
"""
import functools

import torch

from rlhf_iif import DIAGNOSTICS, generate, ppo_losses


class CompiledStep:
    """adam_step at static shapes, the same algorithm: the round's buffer in persistent tensors, a
    minibatch an index copied into a fixed tensor (a short last one padded with weight-0 episodes),
    forward and loss under torch.compile. With graph (default on CUDA), after 3 warm-up steps on a
    side stream, forward, loss, backward and Adam's step are captured as one CUDA graph (PyTorch's
    whole-network capture), then replayed: no Python, no host sync in a step. New shapes, or
    optimizer state loaded (--resume), warm up and capture again."""
    KEYS = ("ids", "attn", "mask", "logprobs", "values", "advantages", "returns")

    def __init__(self, policy, optimizer, args, device, graph=None):
        self.policy, self.optimizer, self.args = policy, optimizer, args
        self.cuda = device.type == "cuda" if graph is None else graph
        self.warmup0 = 3 if self.cuda else 0
        self.idx = torch.zeros(args.mini_batch_size, dtype=torch.long, device=device)
        self.w = torch.zeros(args.mini_batch_size, device=device)
        self.b, self.source = None, None
        self.reset()
        # loaded state replaces the tensors a captured graph reads and writes
        optimizer.register_load_state_dict_post_hook(lambda _: self.reset())
        self.loss = torch.compile(self.minibatch_loss, fullgraph=True, dynamic=False)

    def reset(self):  # warm up and capture at the next steps
        self.graph, self.warmup = None, self.warmup0

    def minibatch_loss(self):
        """The weighted mean of the minibatch's l_i (its weights / n here), then its DIAGNOSTICS"""
        parts = {}
        loss = (ppo_losses(self.policy, self.b, self.idx, self.args, parts=parts) * self.w).sum()
        return torch.stack([loss] + [(parts[k] * self.w).sum() for k in DIAGNOSTICS])

    def body(self):
        """What a step runs, and a CUDA graph holds: loss, backward, Adam"""
        stats = self.loss()
        stats[0].backward()
        self.optimizer.step()
        return stats

    def load(self, b):
        """The round's buffer, copied into the tensors the step reads"""
        if self.b is None or self.b["ids"].shape != b["ids"].shape:  # new shapes: warm up again
            self.b = {k: b[k].clone() for k in self.KEYS}
            self.reset()
        for k in self.KEYS:
            self.b[k].copy_(b[k])
        self.source = b

    def __call__(self, b, mb, w):
        """adam_step's step(b, mb, w): a step on episodes mb of b with loss weights w"""
        if b is not self.source:  # a new round's buffer
            self.load(b)
        n, pad = len(mb), len(self.idx) - len(mb)
        self.idx.copy_(torch.cat([mb, mb[:1].expand(pad)]))
        self.w.copy_(torch.cat([w, w.new_zeros(pad)]) / n)
        if self.cuda and self.graph is None and self.warmup == 0:
            self.capture()
        if self.graph is not None:
            self.graph.replay()
            return self.out.detach().clone()  # the next replay overwrites self.out
        stream = torch.cuda.Stream() if self.cuda else None
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # with None, no stream: a no-op
            self.optimizer.zero_grad()
            stats = self.body()
        if stream is not None:
            torch.cuda.current_stream().wait_stream(stream)
        self.warmup -= 1
        return stats.detach()

    def capture(self):
        self.optimizer.zero_grad(set_to_none=True)  # the gradients then live in the graph's memory
        self.graph = torch.cuda.CUDAGraph()
        # a recompile inside a capture would read the CUDA RNG state, which a capture forbids
        with torch.compiler.set_stance("fail_on_recompile"), torch.cuda.graph(self.graph):
            self.out = self.body()


def compiled_sampler(policy, args, device):
    """--compile's Stage I sampler: generate() with every round's rows as wide as the prompt
    budget, so that the compiled step sees one shape, and a static KV cache where it is exact"""
    width = args.prompt_max_tokens
    return functools.partial(generate, width=width,
                             **static_cache(policy.lm, width + args.gen_tokens, device))


def static_cache(lm, length, device):
    """--compile's generate() arguments: a static KV cache, decoded compiled on CUDA. GPT-Neo's
    local attention reads its window from the cache's length: exact only while prompt +
    continuation fit in it (256 tokens for gpt-neo-2.7B); past it, the dynamic cache."""
    if "local" in getattr(lm.config, "attention_layers", []) and length > lm.config.window_size:
        return {}
    from transformers import CompileConfig
    compiled = dict(compile_config=CompileConfig(fullgraph=True, dynamic=False))
    return dict(cache_implementation="static", **compiled if device.type == "cuda" else {})


