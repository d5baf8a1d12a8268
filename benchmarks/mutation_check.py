"""The tests against deliberate mistakes in Alg. 1: each mutation below changes one line of a paper script the
way a slip would (a sign, a clip, a normalisation, a mask, a tie, a count, a target, the shuffling, the KL
shaping), on a scratch copy of the project, and runs that script's tests until one fails. A mutation no test
catches is a blind spot of the suite: it survives, and the check exits with 1.

    python benchmarks/mutation_check.py                    # every mutation (about an hour on 2 cores)
    python benchmarks/mutation_check.py --files iif.py     # one script's
    python benchmarks/mutation_check.py --list             # the mutations, without running them
    python benchmarks/mutation_check.py --only 3 17        # two of them

Prints a table, a row per mutation as it ends (its progress to stderr): the stage of Alg. 1, what changed, killed
or survived, the first test that failed and the seconds it took. A mutation whose line is no longer in the file
stops the check (the list follows the code). The tests run with -x, so a killed mutation ends at its first
failing test; a surviving one runs all of its script's tests.
"""
import argparse
import os
import py_compile
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = {  # each script's tests, quick ones first
    "iif.py": ["tests/test_influence.py", "tests/test_cli.py", "tests/test_variants.py", "tests/test_backend.py",
               "tests/test_analysis.py"],
    "research/iif_variants.py": ["tests/test_influence.py", "tests/test_cli.py"],  # the agreement guard, beside Alg. 1
    "rlhf_iif.py": ["tests/test_rlhf.py", "tests/test_rlhf_variants.py", "tests/test_rlhf_compile.py"],
    "research/rlhf_compile.py": ["tests/test_rlhf_compile.py"],
    "research/grpo_iif.py": ["tests/test_grpo.py", "tests/test_grpo_variants.py", "tests/test_grpo_sharded.py"],
}
DESELECT = ["-k", "not gpu_check"]  # gpu_check.sh at a tiny shape: slow, and no Alg. 1 test of its own

# (script, stage, the line as it is, the line mistaken)
MUTATIONS = [
    # ---- iif.py, Stage I: the buffer and GAE ----
    ("iif.py", "I: GAE", "lastgaelam = delta + gamma * lam * (1.0 - done[t]) * lastgaelam",
     "lastgaelam = delta + gamma * lam * lastgaelam"),
    ("iif.py", "I: GAE", "delta = r[t] + gamma * v_next[t] * (1.0 - term[t]) - v[t]",
     "delta = r[t] + gamma * v_next[t] - v[t]"),
    ("iif.py", "I: GAE", "delta = r[t] + gamma * v_next[t] * (1.0 - term[t]) - v[t]",
     "delta = r[t] + gamma * v_next[t] * (1.0 - done[t]) - v[t]"),
    ("iif.py", "I: GAE", "    return advantages, advantages + values", "    return advantages, advantages"),
    ("iif.py", "I: GAE", "r[\"dones\"], args.gamma, args.gae_lambda)", "r[\"dones\"], args.gamma, 0.95)"),
    ("iif.py", "I: GAE", "r[\"dones\"], args.gamma, args.gae_lambda)", "r[\"dones\"], 0.99, args.gae_lambda)"),
    ("iif.py", "I: truncation", "r[\"next_values\"][steps, env_ids] = agent.value(final_obs)", "pass"),
    ("iif.py", "I: buffer", "r[\"next_values\"] = torch.cat([r[\"values\"][1:], agent.value(as_tensor(next_obs, device))[None]])",
     "r[\"next_values\"] = torch.cat([r[\"values\"][:-1], agent.value(as_tensor(next_obs, device))[None]])"),
    # ---- iif.py, Stage II: the loss, the target, the influence, the filter ----
    ("iif.py", "II: loss", "pg_loss = -torch.min(ratio * adv, clipped_ratio * adv)",
     "pg_loss = -torch.max(ratio * adv, clipped_ratio * adv)"),
    ("iif.py", "II: loss", "clipped_ratio = ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)",
     "clipped_ratio = ratio.clamp(1 - args.clip_coef, 1 + 2 * args.clip_coef)"),
    ("iif.py", "II: loss", "ratio = (logp - b[\"logprobs\"][idx]).exp()", "ratio = (b[\"logprobs\"][idx] - logp).exp()"),
    ("iif.py", "II: loss", "v_loss = (b[\"returns\"][idx] - value) ** 2", "v_loss = (b[\"advantages\"][idx] - value) ** 2"),
    ("iif.py", "II: loss", "return pg_loss + vf_coef * v_loss - args.ent_coef * entropy",
     "return pg_loss + vf_coef * v_loss + args.ent_coef * entropy"),
    ("iif.py", "II: target", "return (logp * a_hat).mean()", "return (logp * a_hat.abs()).mean()"),
    ("iif.py", "II: target", "*(target or (b[\"obs\"], b[\"actions\"], b[\"advantages\"]))",
     "*(target or (b[\"obs\"], b[\"actions\"], normalize(b[\"advantages\"])))"),
    ("iif.py", "II: influence", "    _, dl = jvp(losses, (primals,), (g,))\n    return -dl",
     "    _, dl = jvp(losses, (primals,), (g,))\n    return dl"),
    ("iif.py", "II: influence", "adv = normalize(b[\"advantages\"])  # l_i's", "adv = b[\"advantages\"]  # l_i's"),
    ("iif.py", "II: influence", "{**frozen, **p}, adv, vf_coef=0.0)", "{**frozen, **p}, adv, vf_coef=None)"),
    ("iif.py", "II: normalisation", "return (x - x.mean()) / (x.std() + 1e-8)", "return x - x.mean()"),
    ("iif.py", "II: filter count", "n_drop = math.floor(p * n_neg + 1e-9)", "n_drop = math.floor(p * n_neg)"),
    ("iif.py", "II: filter count", "n_neg = int((scores < 0).sum())", "n_neg = int((scores <= 0).sum())"),
    ("iif.py", "II: filter order", "order = torch.argsort(scores, stable=True)",
     "order = torch.argsort(scores, descending=True, stable=True)"),
    ("iif.py", "II: filter ties", "n_drop = int((scores < scores[order[n_drop]]).sum())",
     "n_drop = int((scores <= scores[order[n_drop]]).sum())"),
    ("iif.py", "II: random filter", "order = torch.randperm(len(scores), generator=gen)",
     "order = torch.randperm(len(scores))"),
    ("iif.py", "II: filter", "    kept[order[:n_drop]] = False\n    return kept, n_neg",
     "    kept[order[n_drop:]] = False\n    return kept, n_neg"),
    ("research/iif_variants.py", "II: guard measure", "return float(((g @ g.T).sum() - n_slices) / (n_slices * (n_slices - 1)))",
     "return float((g @ g.T).sum() / (n_slices * (n_slices - 1)))"),
    ("research/iif_variants.py", "II: guard", "return agreement, args.filter_p if agreement >= args.min_agreement else 0.0",
     "return agreement, args.filter_p if agreement < args.min_agreement else 0.0"),
    # ---- iif.py, Stage III: the PPO update on the kept records ----
    ("iif.py", "III: shuffling", "perm = kept_idx[torch.as_tensor(rng.permutation(len(kept_idx)), device=kept_idx.device)]",
     "perm = kept_idx"),
    ("iif.py", "III: normalisation", "mb_adv = normalize(b[\"advantages\"][mb_inds])",
     "mb_adv = b[\"advantages\"][mb_inds]"),
    ("iif.py", "III: minibatches", "range(0, len(perm) - args.minibatch_size + 1, args.minibatch_size)",
     "range(0, len(perm), args.minibatch_size)"),
    ("iif.py", "III: clipping", "if args.max_grad_norm > 0:", "if args.max_grad_norm < 0:"),
    ("iif.py", "III: epochs", "for epoch in range(args.update_epochs):", "for epoch in range(args.update_epochs - 1):"),
    ("iif.py", "III: kept records", "ppo_update(agent, optimizer, b, torch.nonzero(kept)[:, 0], args, rng)",
     "ppo_update(agent, optimizer, b, torch.arange(len(kept)), args, rng)"),
    ("iif.py", "III: round KL", "return float((logratio.exp() - 1 - logratio).mean())",
     "return float((-logratio).mean())"),
    ("iif.py", "III: diagnostics", "r - 1 - r.log(), ((r - 1).abs() > args.clip_coef).float()",
     "r - 1 - r.log(), ((r - 1).abs() < args.clip_coef).float()"),
    ("iif.py", "III: diagnostics", "return float(1 - (b[\"returns\"] - b[\"values\"]).var() / b[\"returns\"].var())",
     "return float(1 - (b[\"returns\"] - b[\"values\"]).var())"),

    # ---- rlhf_iif.py, Stage I: the buffer, KL shaping, GAE, whitening ----
    ("rlhf_iif.py", "I: KL shaping", "kl = (b[\"logprobs\"] - b[\"ref_logprobs\"]) * mask",
     "kl = (b[\"ref_logprobs\"] - b[\"logprobs\"]) * mask"),
    ("rlhf_iif.py", "I: KL shaping", "token_rewards = -kl_coef * kl", "token_rewards = kl_coef * kl"),
    ("rlhf_iif.py", "I: KL shaping", "token_rewards[torch.arange(len(ids)), b[\"last\"]] += b[\"rewards\"]",
     "token_rewards[:, 0] += b[\"rewards\"]"),
    ("rlhf_iif.py", "I: whitening", "b[\"advantages\"] = whiten(adv, mask)", "b[\"advantages\"] = adv"),
    ("rlhf_iif.py", "I: whitening", "return (x - mean) * torch.rsqrt(var + 1e-8)", "return x - mean"),
    ("rlhf_iif.py", "I: whitening", "var = ((x - mean) ** 2 * mask).sum() / (mask.sum() - 1).clamp(min=1)",
     "var = ((x - mean) ** 2 * mask).sum() / mask.sum()"),
    ("rlhf_iif.py", "I: whitening", "mean = (x * mask).sum() / mask.sum()", "mean = x.mean()"),
    ("rlhf_iif.py", "I: GAE", "adv[:, t] = lastgaelam = delta + gamma * lam * lastgaelam",
     "adv[:, t] = lastgaelam = delta + gamma * lastgaelam"),
    ("rlhf_iif.py", "I: GAE", "next_values = values[:, t + 1] if t < T - 1 else 0.0",
     "next_values = values[:, t] if t < T - 1 else 0.0"),
    ("rlhf_iif.py", "I: GAE", "    values = values * mask\n", "    values = values\n"),
    ("rlhf_iif.py", "I: GAE", "    return adv, adv + values", "    return adv, adv"),
    ("rlhf_iif.py", "I: episode end", "mask = ((is_eos.cumsum(1) - is_eos.long()) == 0).float()",
     "mask = (is_eos.cumsum(1) == 0).float()"),
    ("rlhf_iif.py", "I: positions", "pos = (attn.cumsum(1) - 1).clamp(min=0)", "pos = attn.cumsum(1)"),
    ("rlhf_iif.py", "I: KL controller", "error = float(np.clip(kl / args.kl_target - 1, -0.2, 0.2))",
     "error = float(kl / args.kl_target - 1)"),
    ("rlhf_iif.py", "I: KL controller", "return kl_coef * (1 + error * n_episodes / args.kl_horizon)",
     "return kl_coef * (1 - error * n_episodes / args.kl_horizon)"),
    # ---- rlhf_iif.py, Stage II ----
    ("rlhf_iif.py", "II: loss", "pg = torch.max(pg1, pg2)", "pg = torch.min(pg1, pg2)"),
    ("rlhf_iif.py", "II: loss", "vf = 0.5 * torch.max(vf1, vf2)", "vf = 0.5 * torch.min(vf1, vf2)"),
    ("rlhf_iif.py", "II: loss", "ratio = torch.exp(logp - b[\"logprobs\"][idx])",
     "ratio = torch.exp(b[\"logprobs\"][idx] - logp)"),
    ("rlhf_iif.py", "II: loss", "v_clipped = old_v + (v - old_v).clamp(-args.cliprange_value, args.cliprange_value)",
     "v_clipped = v"),
    ("rlhf_iif.py", "II: loss", "return ((pg + args.vf_coef * vf) * m).sum(1) / m.sum(1)",
     "return (pg + args.vf_coef * vf).sum(1) / m.sum(1)"),
    ("rlhf_iif.py", "II: loss", "ratio.clamp(1 - args.cliprange, 1 + args.cliprange)",
     "ratio.clamp(1 - args.cliprange, 1 + 2 * args.cliprange)"),
    ("rlhf_iif.py", "II: target", "w = tb[\"advantages\"][idx].gather(1, tb[\"last\"][idx, None])",
     "w = tb[\"advantages\"][idx, :1]"),
    ("rlhf_iif.py", "II: target", "w = tb[\"advantages\"][idx] * tb[\"mask\"][idx] / tb[\"mask\"].sum()",
     "w = tb[\"advantages\"][idx] * tb[\"mask\"][idx] / len(tb[\"mask\"])"),
    ("rlhf_iif.py", "II: influence", "scores.append(-sum(((up(dy) @ g) * up(x))",
     "scores.append(sum(((up(dy) @ g) * up(x))"),
    ("rlhf_iif.py", "II: influence", "lambda: target(policy, tb, idx, args))", "lambda: target(policy, b, idx, args))"),
    ("rlhf_iif.py", "II: influence", "G = [g + torch.einsum(\"...o,...i->oi\", up(dy), up(x))",
     "G = [torch.einsum(\"...o,...i->oi\", up(dy), up(x))"),
    ("rlhf_iif.py", "II: influence", "scores.append(-fwAD.unpack_dual(ppo_losses(",
     "scores.append(fwAD.unpack_dual(ppo_losses("),
    ("rlhf_iif.py", "II: filter count", "int(p * n_neg + 1e-9)", "int(p * n_neg)"),
    ("rlhf_iif.py", "II: filter count", "n_neg = int((scores < 0).sum())", "n_neg = int((scores <= 0).sum())"),
    ("rlhf_iif.py", "II: filter ties", "n_drop = int((scores < scores[order[n_drop]]).sum())",
     "n_drop = int((scores <= scores[order[n_drop]]).sum())"),
    ("rlhf_iif.py", "II: filter count", "n_drop = int((scores <= 0).sum()) if p is None",
     "n_drop = int((scores < 0).sum()) if p is None"),
    ("rlhf_iif.py", "II: filter order", "order = torch.argsort(scores, stable=True)",
     "order = torch.argsort(scores, descending=True, stable=True)"),
    ("rlhf_iif.py", "II: filter", "    kept[order[:n_drop]] = False\n    return kept, n_neg",
     "    kept[order[n_drop:]] = False\n    return kept, n_neg"),
    # ---- rlhf_iif.py, Stage III ----
    ("rlhf_iif.py", "III: shuffling", "perm = kept_idx[torch.randperm(len(kept_idx), generator=gen)].to(device)",
     "perm = kept_idx.to(device)"),
    ("rlhf_iif.py", "III: loss weights", "loss = (ppo_losses(policy, b, mb, args, parts=parts) * w[mb]).mean()",
     "loss = ppo_losses(policy, b, mb, args, parts=parts).mean()"),
    ("rlhf_iif.py", "III: diagnostics", "torch.exp(logr) - 1 - logr", "torch.exp(logr) - 1"),
    ("rlhf_iif.py", "III: diagnostics", "(pg2 > pg1).float(), (vf2 > vf1).float()",
     "(pg2 < pg1).float(), (vf2 > vf1).float()"),
    ("rlhf_iif.py", "III: diagnostics", "return float(1 - (returns - values).var() / returns.var())",
     "return float(1 - (returns - values).var())"),
    ("rlhf_iif.py", "III: epochs", "for _ in range(args.ppo_epochs):", "for _ in range(1):"),
    ("rlhf_iif.py", "III: KL controller", "kl_coef = update_kl_coef(kl_coef, kl, args.batch_size, args)",
     "kl_coef = kl_coef"),
    ("research/rlhf_compile.py", "III: compiled step", "self.w.copy_(torch.cat([w, w.new_zeros(pad)]) / n)",
     "self.w.copy_(torch.cat([w, w.new_zeros(pad)]) / len(self.idx))"),
    ("research/rlhf_compile.py", "III: compiled step", "            self.graph.replay()\n            return self.out.detach().clone()",
     "            self.graph.replay()\n            return self.out.detach()"),
    ("research/rlhf_compile.py", "III: compiled step", "        self.optimizer.zero_grad(set_to_none=True)",
     "        self.optimizer.zero_grad(set_to_none=False)"),
    ("research/rlhf_compile.py", "III: compiled step", "if b is not self.source:", "if self.source is None:"),
    ("rlhf_iif.py", "test toxicity", "softmax(-1)[:, toxic].mean()", "softmax(-1)[:, 1 - toxic].mean()"),

    # ---- grpo_iif.py: the loss (Stage III's, TRL's) ----
    ("research/grpo_iif.py", "III: loss", "loss = -torch.min(ratio * adv, ratio.clamp(", "loss = -torch.max(ratio * adv, ratio.clamp("),
    ("research/grpo_iif.py", "III: loss", "ratio, adv = torch.exp(logp - old),", "ratio, adv = torch.exp(old - logp),"),
    ("research/grpo_iif.py", "III: KL", "loss = loss + args.beta * (torch.exp(d) - d - 1) * ratio",
     "loss = loss - args.beta * (torch.exp(d) - d - 1) * ratio"),
    ("research/grpo_iif.py", "III: KL", "d = b[\"ref_per_token_logps\"][idx] - logp", "d = logp - b[\"ref_per_token_logps\"][idx]"),
    ("research/grpo_iif.py", "III: KL", "loss = loss + args.beta * (torch.exp(d) - d - 1) * ratio",
     "loss = loss + args.beta * (torch.exp(d) - d - 1)"),
    ("research/grpo_iif.py", "III: loss", "return (loss * m).sum(1) / b[\"num_items_in_batch\"].clamp(min=1)",
     "return loss.sum(1) / b[\"num_items_in_batch\"].clamp(min=1)"),
    ("research/grpo_iif.py", "III: loss", "ratio.clamp(1 - args.epsilon, 1 + args.epsilon)",
     "ratio.clamp(1 - args.epsilon, 1 + 2 * args.epsilon)"),
    ("research/grpo_iif.py", "III: log-probabilities", "logits = up(logits[:, :-1])", "logits = up(logits[:, 1:])"),
    ("research/grpo_iif.py", "III: TRL's loss", "loss_type=\"dapo\"", "loss_type=\"grpo\""),
    ("research/grpo_iif.py", "III: TRL's loss", "use_bias_correction_kl=True", "use_bias_correction_kl=False"),
    # ---- grpo_iif.py, Stage II ----
    ("research/grpo_iif.py", "II: target", "/ (len(t[\"advantages\"]) * world))", "/ len(t[\"advantages\"]))"),
    ("research/grpo_iif.py", "II: target", "return ((t[\"advantages\"][idx, None] * logp",
     "return ((t[\"advantages\"][idx, None].abs() * logp"),
    ("research/grpo_iif.py", "II: target", "return -completion_losses(model, t, idx, args, logp=logp).sum()",
     "return completion_losses(model, t, idx, args, logp=logp).sum()"),
    ("research/grpo_iif.py", "II: influence", "scores.append(-fwAD.unpack_dual(completion_losses(",
     "scores.append(fwAD.unpack_dual(completion_losses("),
    ("research/grpo_iif.py", "II: influence", "c = -1.0 if args.target == \"f_loss\"", "c = 1.0 if args.target == \"f_loss\""),
    ("research/grpo_iif.py", "II: influence", "len(b[\"advantages\"]) * world)\n", "len(b[\"advantages\"]))\n"),
    ("research/grpo_iif.py", "II: influence", "proportional = one_pass and (args.beta == 0.0 or args.target == \"f_loss\")",
     "proportional = one_pass"),
    ("research/grpo_iif.py", "II: influence", "scores = [-sum((g * gi).flatten(1).sum(1)", "scores = [sum((g * gi).flatten(1).sum(1)"),
    ("research/grpo_iif.py", "II: influence", "scores.append(-sum(((up(dy) @ g) * up(x))", "scores.append(sum(((up(dy) @ g) * up(x))"),
    ("research/grpo_iif.py", "II: influence", "one_pass = t is b and n_bytes <= memory_for_grads(",
     "one_pass = n_bytes <= memory_for_grads("),
    ("research/grpo_iif.py", "II: influence", "        G = reduce(G)\n        scores = [", "        scores = ["),
    ("research/grpo_iif.py", "II: filter count", "int(p * n_neg + 1e-9)", "int(p * n_neg)"),
    ("research/grpo_iif.py", "II: filter ties", "n_drop = int((scores < scores[order[n_drop]]).sum())",
     "n_drop = int((scores <= scores[order[n_drop]]).sum())"),
    ("research/grpo_iif.py", "II: filter count", "n_drop = int((scores <= 0).sum()) if p is None",
     "n_drop = int((scores < 0).sum()) if p is None"),
    ("research/grpo_iif.py", "II: filter order", "order = torch.argsort(scores, stable=True)",
     "order = torch.argsort(scores, descending=True, stable=True)"),
    ("research/grpo_iif.py", "II: filter", "    kept[order[:n_drop]] = False\n    return kept, n_neg",
     "    kept[order[n_drop:]] = False\n    return kept, n_neg"),
    ("research/grpo_iif.py", "II: random filter", "order = torch.randperm(len(scores), generator=gen)",
     "order = torch.randperm(len(scores))"),
    ("research/grpo_iif.py", "II: filter", "return filter_records(scores, args.filter_method, args.filter_p, self.iif_gen)[0], scores",
     "return filter_records(-scores, args.filter_method, args.filter_p, self.iif_gen)[0], scores"),
    ("research/grpo_iif.py", "III: kept completions", "rows = torch.argsort((~mine).int(), stable=True)[:n_rows]",
     "rows = torch.argsort(mine.int(), stable=True)[:n_rows]"),
    ("research/grpo_iif.py", "III: kept completions",
     "b[\"completion_mask\"] = b[\"completion_mask\"] * mine[rows, None].to(b[\"completion_mask\"])", "pass"),
    ("research/grpo_iif.py", "III: kept completions",
     "b[\"num_items_in_batch\"] = acc.gather(b[\"completion_mask\"].sum()).sum()", "pass"),
    ("research/grpo_iif.py", "III: kept completions", "if self.iif_args.filter_method != \"none\":\n            b = keep_only(",
     "if False:\n            b = keep_only("),
]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def scratch_copy():
    """The project's files (tracked, and untracked ones git does not ignore) in a temporary folder"""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split("\n")
    out = tempfile.mkdtemp(prefix="mutation_check_")
    for f in filter(None, files):
        if os.path.isfile(os.path.join(ROOT, f)):
            os.makedirs(os.path.dirname(os.path.join(out, f)), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, f), os.path.join(out, f))
    return out


def run(copy, script, timeout):
    """The script's tests on the copy, stopping at the first failure: (killed, the first failing test)"""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-n", "0", *DESELECT,
           *TESTS[script]]
    try:
        proc = subprocess.run(cmd, cwd=copy, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return True, f"timed out after {timeout} s"
    failed = re.search(r"^(?:FAILED|ERROR) (\S+)", proc.stdout, re.M)
    if proc.returncode == 0:
        return False, ""
    return True, failed[1] if failed else f"pytest exit {proc.returncode}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", nargs="+", default=list(TESTS), choices=list(TESTS))
    ap.add_argument("--list", action="store_true", help="print the mutations and stop")
    ap.add_argument("--only", nargs="+", type=int, help="these mutations only (their numbers in --list)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds a mutation's tests may take")
    a = ap.parse_args()
    chosen = [(i, m) for i, m in enumerate((m for m in MUTATIONS if m[0] in a.files), 1)]  # numbered as --list
    if a.only:
        chosen = [(i, m) for i, m in chosen if i in a.only]
    for _, (script, _, old, _) in chosen:  # every mistake must still apply to today's code
        n = open(os.path.join(ROOT, script)).read().count(old)
        if n != 1:
            sys.exit(f"mutation_check.py: {script} holds {n} copies of {old!r} (it must hold one): update MUTATIONS")
    counts = {s: sum(m[0] == s for _, m in chosen) for s in a.files}
    print(f"{len(chosen)} mutations ({', '.join(f'{s} {n}' for s, n in counts.items())}); tests run with -x: "
          + "; ".join(f"{s}: {' '.join(TESTS[s])}" for s in a.files) + "\n")
    print("| # | script | stage | mistake | result | first failing test | s |")
    print("|---|---|---|---|---|---|---|", flush=True)
    if a.list:
        for i, (script, stage, old, new) in chosen:
            print(f"| {i} | {script} | {stage} | {cell(old)} -> {cell(new)} | | | |")
        return
    copy, t_all, survived = scratch_copy(), time.perf_counter(), 0
    try:
        for k, (i, (script, stage, old, new)) in enumerate(chosen, 1):
            path = os.path.join(copy, script)
            original = open(path).read()
            with open(path, "w") as f:
                f.write(original.replace(old, new))
            py_compile.compile(path, doraise=True)  # a mutation is a mistake in valid code
            t0 = time.perf_counter()
            log(f"[{k}/{len(chosen)}] {script}: {old.strip()[:60]!r} -> {new.strip()[:60]!r}")
            killed, test = run(copy, script, a.timeout)
            with open(path, "w") as f:
                f.write(original)
            survived += not killed
            print(f"| {i} | {script} | {stage} | {cell(old)} -> {cell(new)} | {'killed' if killed else '**survived**'} "
                  f"| {test} | {time.perf_counter() - t0:.0f} |", flush=True)
    finally:
        shutil.rmtree(copy)
    print(f"\n{len(chosen) - survived} of {len(chosen)} killed, {survived} survived; "
          f"{(time.perf_counter() - t_all) / 60:.0f} minutes on {os.cpu_count()} cores")
    sys.exit(1 if survived else 0)


def cell(code):
    """One line of code in a table cell"""
    return "`" + " ".join(code.split()).replace("|", "\\|") + "`"


if __name__ == "__main__":
    main()
