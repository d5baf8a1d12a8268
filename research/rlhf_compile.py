"""rlhf_iif.py's loop with its optimizer step compiled at static shapes under torch.compile, on CUDA
one CUDA graph a step, and generation with a static KV cache: the same algorithm, kept apart from
rlhf_iif.py, which reads as Alg. 1 (as LeanRL keeps its compile code apart from the algorithm).

    python research/rlhf_compile.py --filter-method influence    # rlhf_iif.py's flags; on a GPU (untried)

Why it pays on a GPU: an optimizer step trains on one 45-token episode; eagerly, PyTorch launches
some 4,000 small kernels for it from Python, so the step is launch-bound. Captured as one CUDA
graph (PyTorch's whole-network capture), a step is an index copy and a replay.
"""
import functools
import os
import sys
from dataclasses import dataclass

import numpy as np
import torch
import tyro

sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # rlhf_iif.py, one folder up
import rlhf_iif
from rlhf_iif import DIAGNOSTICS, generate, ppo_losses, resolve_args


@dataclass
class Args(rlhf_iif.Args):
    compile: tyro.conf.Suppress[bool] = True  # in config.json: the run's steps were compiled


def make_optimizer(policy, args, device):
    """rlhf_iif.make_optimizer's Adam, on CUDA capturable too (its step count on the device, as a
    CUDA graph needs; the rate, constant, a float)"""
    cuda = device.type == "cuda"
    return torch.optim.Adam([p for p in policy.parameters() if p.requires_grad],
                            lr=args.learning_rate, fused=cuda or None, capturable=cuda)


def eager_step(policy, optimizer, args):
    """rlhf_iif.ppo_update's optimizer step as a function step(b, mb, w) (CompiledStep's interface):
    one Adam step on minibatch mb of b, loss the mean of w_i x l_i; returns that loss and the
    minibatch's weighted DIAGNOSTICS, on the device. What the compiled step is checked against."""
    def step(b, mb, w):
        parts = {}
        loss = (ppo_losses(policy, b, mb, args, parts=parts) * w).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return torch.stack([loss.detach()] + [(parts[k] * w).mean() for k in DIAGNOSTICS])
    return step


def ppo_update(step, b, kept, args, gen, weights=None):
    """rlhf_iif.ppo_update with its optimizer step a function step(b, mb, w): the same minibatches
    in the same order, the same returns"""
    device = b["ids"].device
    kept_idx = torch.nonzero(kept.cpu()).squeeze(1)
    if len(kept_idx) == 0:
        return 0, dict.fromkeys(("loss", *DIAGNOSTICS), float("nan"))
    w = torch.ones(len(kept), device=device) if weights is None else weights
    stats = []
    for _ in range(args.ppo_epochs):
        perm = kept_idx[torch.randperm(len(kept_idx), generator=gen)].to(device)
        for mb in perm.split(args.mini_batch_size):
            stats.append(step(b, mb, w[mb]))
    stats = torch.stack(stats).double().cpu().numpy()
    if not np.isfinite(stats[:, 0]).all():
        raise FloatingPointError(f"non-finite PPO loss at optimizer step "
                                 f"{np.flatnonzero(~np.isfinite(stats[:, 0]))[0]} of {len(stats)}")
    return len(stats), dict(zip(("loss", *DIAGNOSTICS), stats.mean(0).tolist()))


class CompiledStep:
    """eager_step at static shapes, the same algorithm: the round's buffer in persistent tensors, a
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
        """eager_step's step(b, mb, w): a step on episodes mb of b with loss weights w"""
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
    """The compiled loop's Stage I sampler: generate() with every round's rows as wide as the prompt
    budget, so that the compiled step sees one shape, and a static KV cache where it is exact"""
    width = args.prompt_max_tokens
    return functools.partial(generate, width=width,
                             **static_cache(policy.lm, width + args.gen_tokens, device))


def static_cache(lm, length, device):
    """The compiled loop's generate() arguments: a static KV cache, decoded compiled on CUDA. GPT-Neo's
    local attention reads its window from the cache's length: exact only while prompt +
    continuation fit in it (256 tokens for gpt-neo-2.7B); past it, the dynamic cache."""
    if "local" in getattr(lm.config, "attention_layers", []) and length > lm.config.window_size:
        return {}
    from transformers import CompileConfig
    compiled = dict(compile_config=CompileConfig(fullgraph=True, dynamic=False))
    return dict(cache_implementation="static", **compiled if device.type == "cuda" else {})


def main(args):
    """rlhf_iif.main, compiled"""
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)  # minibatch order and random filtering
    device = torch.device(args.device)
    # everything is loaded before the run folder is made: a name that fails leaves nothing behind
    policy, ref, tokenizer = rlhf_iif.make_policy(args, device)
    reward_fn = rlhf_iif.make_reward_fn(*rlhf_iif.load_classifier(
        "--reward-model", args.reward_model, "--reward-label", args.reward_label, device), device)
    train_prompts, val_prompts = rlhf_iif.load_prompts(args, tokenizer)
    if args.eval_every:
        eval_clf = rlhf_iif.load_classifier("--eval-reward-model", args.eval_reward_model,
                                            "--eval-toxic-label", args.eval_toxic_label, device)
        eval_prompts = rlhf_iif.load_eval_prompts(args, tokenizer)
    n_rounds = args.rounds or len(train_prompts) // args.batch_size
    optimizer = make_optimizer(policy, args, device)
    # Stage I's sampler and Stage III's optimizer step, compiled: the rest is rlhf_iif.main's loop
    sample, step = compiled_sampler(policy, args, device), CompiledStep(policy, optimizer, args, device)
    run = rlhf_iif.Run(args, n_rounds, policy, device)
    kl_coef, order = args.init_kl_coef, []  # beta, and the prompts not yet drawn
    try:
        for k in range(n_rounds):
            if len(order) < args.batch_size:  # one pass over the shuffled prompts, then another
                order = order + torch.randperm(len(train_prompts), generator=gen).tolist()
            queries = [train_prompts[i] for i in order[:args.batch_size]]
            order = order[args.batch_size:]

            # Stage I (Alg. 1): the buffer B(k) of episodes generated by the policy at theta(k)
            t0 = rlhf_iif.timer(device)
            b = sample(policy, queries, tokenizer, args, device)
            b["rewards"] = reward_fn(b["texts"], queries)  # r(x, y), one number an episode
            t1 = rlhf_iif.timer(device)
            rlhf_iif.rollout(policy, ref, b, kl_coef, args)
            t2 = rlhf_iif.timer(device)

            # Stage II (Alg. 1): score every episode at theta(k) (Sec. 5.1, 5.3), drop harmful ones
            scores, kept, n_negative = None, torch.ones(args.batch_size, dtype=torch.bool), ""
            if args.filter_method != "none":
                tb = b  # the target episodes: B(k), or the released code's fresh held-out ones
                if args.target_data == "validation":
                    tb = rlhf_iif.episodes(policy, ref, val_prompts, kl_coef, reward_fn, tokenizer,
                                           args, device)
                scores = rlhf_iif.influence(policy, b, tb, args)
                if not torch.isfinite(scores).all():
                    rlhf_iif.fail(f"round {k}: non-finite influence scores; lower --learning-rate")
                kept, n_negative = rlhf_iif.filter_records(scores, args.filter_method, args.filter_p,
                                                           gen)
            t3 = rlhf_iif.timer(device)

            # Stage III (Alg. 1): PPO on the kept episodes, then the adaptive KL step on all of B(k)
            try:
                n_updates, stats = ppo_update(step, b, kept, args, gen)
            except FloatingPointError as e:
                rlhf_iif.fail(f"round {k}: {e}; lower --learning-rate")
            t4 = rlhf_iif.timer(device)
            kl = b["kl"].mean().item()
            row = dict(round=k, episodes=(k + 1) * args.batch_size,
                       reward_mean=b["rewards"].mean().item(), reward_std=b["rewards"].std().item(),
                       kl=kl, kl_coef=kl_coef, n_kept=int(kept.sum()), n_negative=n_negative,
                       n_updates=n_updates, **stats, explained_var=rlhf_iif.explained_variance(b),
                       eval_toxicity="", t_generate=t1 - t0, t_forward=t2 - t1,
                       t_influence=t3 - t2, t_optim=t4 - t3, t_eval=0.0)
            kl_coef = rlhf_iif.update_kl_coef(kl_coef, kl, args.batch_size, args)

            if args.eval_every and (k + 1) % args.eval_every == 0:  # test toxicity (App. B.3)
                t0 = rlhf_iif.timer(device)
                row["eval_toxicity"] = rlhf_iif.evaluate(policy, eval_prompts, tokenizer, eval_clf,
                                                         args, device)
                row["t_eval"] = rlhf_iif.timer(device) - t0
            run.end_round(row, b, queries, scores, kept, tokenizer)
        if args.eval_every:  # the final policy's KL to the reference, reward and toxicity
            final, tb = rlhf_iif.final_test(policy, ref, eval_prompts, tokenizer, reward_fn, args,
                                            device)
            run.final(final, final_toxicity=rlhf_iif.toxicity(tb["texts"], eval_clf, device))
    finally:  # also on Ctrl-C (mid-round, the weights as they are then)
        run.finish(policy, tokenizer)


if __name__ == "__main__":
    main(resolve_args(tyro.cli(Args)))
