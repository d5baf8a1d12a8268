"""iif.py with every variant the experiments in results/ use, and the options of long runs.

iif.py is Alg. 1 with the choices of the paper's presets. This file imports its pieces and runs the
same loop with, in addition:
- the released code's switches, where the paper is silent or differs (docs/method.md): --adv-norm,
  --target-adv, --influence-loss, --score-log-std, --filter-ties, --reseed-rounds;
- the paper's other targets and scores: --target f_action (Sec. 4.2), --influence-mode tracin
  (Sec. 3.1, the sum over the round's optimizer steps);
- App. C's baselines: --filter-method adv-error, adv-product (C.4), td-weight (C.5);
- options beyond the paper: --influence-precond adam, --target-kl, --hold-step, --critic-records;
- long runs: --resume, --save-states, --eval-every, --eval-envs, --async-envs, --threads.
With none of these set it writes what iif.py writes (tests/test_variants.py checks it).

    python research/iif_variants.py --env-id LunarLander-v3 --eval-episodes 200 --run-name ll --resume
    python research/iif_variants.py --env-id BipedalWalker-v3 --eval-every 2 --run-name bw --resume
"""
import collections
import contextlib
import copy
import csv
import dataclasses
import json
import math
import os
import sys
import time
from typing import Literal, Optional

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.func import jvp

sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # iif.py and analysis.py, one folder up
import iif
from analysis import mc_advantage  # Sec. 4.1's Monte-Carlo advantage, App. C.4's too
from iif import (DIAGNOSTICS, PRESETS, Agent, approx_kl, collect_rollout, evaluate,
                 explained_variance, fail, make_env, make_optimizer, normalize, ppo_losses,
                 target_grad)


@dataclasses.dataclass
class Args(iif.Args):
    filter_method: Optional[Literal[
        "influence", "random", "none", "adv-error", "adv-product", "td-weight"]] = None
    """influence: IIF; random: drop as many records at random; none: standard PPO; the baselines
    adv-error, adv-product (App. C.4, Discrete actions) and td-weight (App. C.5) (None: as
    iif.py, influence on the paper's envs, none on others)"""
    target: Literal["f_return", "f_action"] = "f_return"
    """target function the influence is measured on (Sec. 3.1)"""
    target_state: Optional[str] = None
    """f_action's state: comma-separated observation values (an index for a Discrete observation)"""
    target_action: Optional[str] = None
    """f_action's action: an index, or comma-separated values for a Box action"""
    influence_mode: Literal["snapshot", "tracin"] = "snapshot"
    """snapshot: score at theta(k) (Sec. 5.1); tracin: also sum over the round's steps (Sec. 3.1)"""

    min_agreement: float = -1.0
    """the agreement guard (not in the paper): filter a round only where f_return's gradient agrees
    across 8 slices of B(k), their mean pairwise cosine at least this; -1: every round, as Alg. 1"""

    # The released code's choices (the defaults) and their alternatives (docs/method.md)
    adv_norm: Literal["minibatch", "buffer", "none"] = "minibatch"
    """A_hat in training: normalised per minibatch after filtering (the released code, SB3), once
    over the buffer before filtering, or raw"""
    target_adv: Literal["raw", "normalized"] = "raw"
    """f_return's weights: raw GAE estimates A_hat (the paper, the released code), or normalised"""
    influence_loss: Literal["policy", "full"] = "policy"
    """l_i inside the influence: its policy terms (the released code), or the full PPO loss"""
    score_log_std: bool = True
    """count a Gaussian policy's log-std in the influence (the released code has no Gaussian
    policy; its layer-wise scorer would leave a free parameter out)"""
    filter_ties: Literal["keep", "drop"] = "keep"
    """records tied with the cut: keep them (the released code), or drop exactly floor(p x n_neg)"""
    reseed_rounds: bool = False
    """start every round's rollout from env.reset(seed) and torch's seed, as the released
    LunarLander and MiniGrid IIF scripts do (a process per round); off: episodes run on"""

    # Beyond the paper
    reseed_from: int = -1
    """after round K's rollout, reseed torch and numpy: the same theta(0) and first buffers, other
    actions and minibatch orders from there (a run against its own reseeded copy is a noise floor
    of the comparisons, which share theta(0) and B(0) too); -1: never"""
    influence_precond: Literal["none", "adam"] = "none"
    """score a record's gradient (an SGD step, the paper's), or the step Adam takes (needs adam)"""
    target_kl: float = 0.0
    """SB3's early stop: end a round's update once a minibatch's KL(pi_theta(k) || pi_theta) passes
    1.5 x this; 0: off (the paper, the released code)"""
    hold_step: Literal["none", "exact", "grad-norm"] = "none"
    """the round's update held to another update's step: each round, the --hold-to update from
    theta(k) on a copy gives its KL on B(k) (kl_ref); the update on the records --filter-method
    keeps then runs with the policy's learning rate scaled until its KL lands within 10 % of it
    (exact: each try from theta(k)'s own state, at most 6 tries a round), or scaled by |sum of all
    records' gradients| / |sum of the kept ones'| (grad-norm: one update). The critic keeps its rate"""
    hold_to: Literal["standard", "influence"] = "standard"
    """--hold-step's reference update: standard PPO's on all of B(k), or IIF's on the records
    influence keeps (with --filter-method none: standard PPO lifted to IIF's step)"""
    critic_records: Literal["kept", "all"] = "kept"
    """the records the critic's loss runs over: the kept ones (Alg. 1, the released code), or all of
    B(k) in standard PPO's minibatches, so the filter acts on the policy's loss only and every arm's
    critic learns from the same data"""

    # Long runs
    resume: bool = False
    """continue <runs-dir>/<run-name> after its last finished round (checkpoint.pt), same flags"""
    save_states: int = 0
    """keep the state at the start of every N-th round (theta(k), the optimizer, the generators) in
    <run>/states/round_KKKK.pt, for results/one_round.py; 0: none"""
    eval_every: int = 1
    """test after every N-th round only (rounds N-1, 2N-1, ...; the others leave the test empty).
    Test episodes sample from the training's torch RNG, so N also changes the rounds after a test"""
    threads: int = 1
    """torch CPU threads (small networks run fastest on one), and envpool's threads"""
    async_envs: bool = False
    """step the environments in subprocesses (pays off only for slow envs such as highway)"""
    eval_envs: Optional[int] = None
    """parallel test environments (None: one per episode on envpool, 16 on gymnasium)"""

    # iif.py's TensorBoard, wandb, videos, saved model and device: not here (metrics.csv, checkpoint.pt
    # and agent.pt; the CPU)
    cuda: tyro.conf.Suppress[bool] = False
    torch_deterministic: tyro.conf.Suppress[bool] = True
    track: tyro.conf.Suppress[bool] = False
    wandb_project_name: tyro.conf.Suppress[str] = ""
    wandb_entity: tyro.conf.Suppress[Optional[str]] = None
    capture_video: tyro.conf.Suppress[bool] = False
    save_model: tyro.conf.Suppress[bool] = False
    eval_model: tyro.conf.Suppress[Optional[str]] = None

    # filled in by resolve_args (not flags): the preset's gym.make keyword arguments, f_action's
    # state and action as vectors
    env_kwargs: tyro.conf.Suppress[dict] = dataclasses.field(default_factory=dict)
    target_obs: tyro.conf.Suppress[Optional[list]] = None
    target_act: tyro.conf.Suppress[Optional[list]] = None


def make_vec(args, n, backend):
    if backend == "envpool":
        from iif_envpool import EnvpoolVec
        return EnvpoolVec(args.env_id, PRESETS[args.env_id]["envpool"], n, args.threads)
    vec = gym.vector.AsyncVectorEnv if args.async_envs else gym.vector.SyncVectorEnv
    return vec([make_env(args.env_id) for _ in range(n)],
               autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


# ---- Stage II with every switch: targets, influence, the filter ----
def make_target(agent, b, args):
    """The records and weights of the target (Sec. 3.1): f_return: every record of B(k), weighted by
    its A_hat (raw, or with --target-adv normalized); f_action: the one chosen (s, a), weight 1."""
    if args.target == "f_return":
        a_hat = b["advantages"]
        return b["obs"], b["actions"], a_hat if args.target_adv == "raw" else normalize(a_hat)
    t_obs = torch.tensor(args.target_obs, dtype=torch.float32).reshape(1, *b["obs"].shape[1:])
    if agent.continuous:
        return t_obs, torch.tensor(args.target_act).reshape(1, -1), torch.ones(1)
    return t_obs, torch.tensor([int(args.target_act[0])]), torch.ones(1)


def scoring_advantages(b, args):
    """The A_hat inside l_i when scored at theta(k). With --adv-norm minibatch, the buffer's
    normalisation: the expected statistics of the minibatches the record will meet (the released
    scorer used those of its first-epoch minibatch)."""
    return normalize(b["advantages"]) if args.adv_norm == "minibatch" else b["advantages"]


def influence(agent, b, idx, target, args, adv=None, precond=None):
    """iif.influence for records idx with any target (obs, actions, weights); adv: the A_hat inside
    l_i (default b["advantages"][idx]); --influence-loss full keeps l_i's value term,
    --no-score-log-std leaves the log-std out of g; precond: a diagonal P per parameter
    (adam_precond), giving I_i = <grad f, -P grad l_i>."""
    vf_coef = 0.0 if args.influence_loss == "policy" else args.vf_coef
    params = {k: v.detach().requires_grad_() for k, v in agent.named_parameters()}
    g = target_grad(agent, params, *target)
    if not args.score_log_std:
        g.pop("log_std", None)
    if precond is not None:  # <g, P grad l_i> = <P g, grad l_i> for a diagonal P
        g = {k: gk * precond[k] for k, gk in g.items()}
    primals = {k: params[k].detach() for k in g}
    frozen = {k: v.detach() for k, v in params.items() if k not in g}

    def losses(p):
        return ppo_losses(agent, b, idx, args, {**frozen, **p}, adv, vf_coef)

    _, dl = jvp(losses, (primals,), (g,))
    return -dl


def filter_records(scores, method, p, gen, ties="keep"):
    """iif.filter_records with --filter-ties: "keep" keeps the records tied with the first one kept
    (the released code, iif.py's only rule); "drop" drops exactly floor(p x n_negative), ties broken
    by buffer order. Methods other than influence and random drop nothing here."""
    n_neg = int((scores < 0).sum())
    if method not in ("influence", "random"):
        return torch.ones(len(scores), dtype=torch.bool), n_neg
    n_drop = math.floor(p * n_neg + 1e-9)
    order = torch.argsort(scores, stable=True)
    if ties == "keep" and n_drop < len(scores):
        n_drop = int((scores < scores[order[n_drop]]).sum())
    if method == "random":
        order = torch.randperm(len(scores), generator=gen)
    kept = torch.ones(len(scores), dtype=torch.bool)
    kept[order[:n_drop]] = False
    return kept, n_neg


def target_agreement(agent, b, n_slices=8):
    """The agreement guard's measure: mean cosine between f_return's gradients on n_slices
    consecutive slices of B(k). Near 0: grad f is noise, and so is a ranking of records by it."""
    params = {k: v.detach().requires_grad_() for k, v in agent.named_parameters()}
    grads = []
    for part in torch.arange(len(b["obs"])).tensor_split(n_slices):
        g = target_grad(agent, params, b["obs"][part], b["actions"][part], b["advantages"][part])
        grads.append(torch.cat([gi.flatten() for gi in g.values()]))
    g = nn.functional.normalize(torch.stack(grads), dim=1)
    return float(((g @ g.T).sum() - n_slices) / (n_slices * (n_slices - 1)))


def agreement_guard(agent, target, args):
    """--min-agreement: (f_return's agreement, None where not computed; this round's p)"""
    if args.target != "f_return" or args.min_agreement <= -1:
        return None, args.filter_p
    agreement = target_agreement(agent, dict(obs=target[0], actions=target[1],
                                             advantages=target[2]))
    return agreement, args.filter_p if agreement >= args.min_agreement else 0.0


def adam_precond(agent, optimizer):
    """--influence-precond adam: Adam moves theta by -lr m_hat / (sqrt(v_hat) + eps), so to first
    order a record's gradient g_i moves it along P g_i with P = 1 / (sqrt(v_hat) + eps), v_hat
    Adam's bias-corrected second moment (as LESS scores data for Adam). None before Adam's first
    step (round 0 then scores with the plain gradient, P = 1)."""
    beta2, eps = optimizer.param_groups[0]["betas"][1], optimizer.param_groups[0]["eps"]
    precond = {}
    for name, p in agent.named_parameters():
        state = optimizer.state.get(p)
        if not state:
            return None
        v_hat = state["exp_avg_sq"] / (1 - beta2 ** float(state["step"]))
        precond[name] = 1.0 / (v_hat.sqrt() + eps)
    return precond


def step_precond(agent, optimizer, args):
    return adam_precond(agent, optimizer) if args.influence_precond == "adam" else None


# ---- Stage III with every switch ----
def ppo_update(agent, optimizer, b, kept_idx, args, rng, target=None, sample_p=None, trunk_scale=1.0):
    """iif.ppo_update with --adv-norm, --target-kl and, with a target, the TracIn influence of
    Sec. 3.1: summed over every step whose minibatch holds the record, each step's scores weighted
    by the factor clipping scaled that step by, so they add up as the steps do. With sample_p
    (App. C.5), each epoch draws its records with these probabilities, with replacement.
    --critic-records all: the critic's loss runs over standard PPO's minibatches of all of B(k) (drawn
    from a copy of rng: those the unfiltered update draws), step j pairing the policy's j-th minibatch
    of kept records with the critic's j-th; the steps past the policy's last train the critic alone.
    trunk_scale: the factor on the policy loss's gradient into a shared CNN (--hold-step's multiple)."""
    mbs = args.minibatch_size
    tracin = None if target is None else torch.zeros_like(b["advantages"])
    n_updates, stats = 0, []
    critic_rng = copy.deepcopy(rng) if getattr(args, "critic_records", "kept") == "all" else None  # old configs: kept

    def done():  # the steps, the scores, and the means of the steps' DIAGNOSTICS for the row
        diagnostics.update(zip(DIAGNOSTICS, np.mean(stats, 0) if stats else [None] * len(DIAGNOSTICS)))
        return n_updates, tracin
    for epoch in range(args.update_epochs):
        if sample_p is None:
            order = rng.permutation(len(kept_idx))
        else:
            order = rng.choice(len(kept_idx), size=len(kept_idx), p=sample_p)
        perm = kept_idx[torch.as_tensor(order)]
        steps = [perm[start:start + mbs] for start in range(0, len(perm) - mbs + 1, mbs)]
        critic_steps = steps
        if critic_rng is not None:
            every = torch.as_tensor(critic_rng.permutation(len(b["advantages"])))
            critic_steps = [every[start:start + mbs] for start in range(0, len(every) - mbs + 1, mbs)]
        for j in range(len(critic_steps)):
            mb_inds, critic_inds = steps[j] if j < len(steps) else None, critic_steps[j]
            if args.target_kl > 0 and approx_kl(agent, slice_of(b, mb_inds)) > 1.5 * args.target_kl:
                return done()  # the policy left the trust region of theta(k)
            optimizer.zero_grad()
            parts = {}  # one minibatch for both: iif.ppo_update's loss; else the policy's terms first
            if mb_inds is not None:
                mb_adv = b["advantages"][mb_inds]
                if args.adv_norm == "minibatch":
                    mb_adv = normalize(mb_adv)
                if tracin is not None:  # this step's influence at its theta, timed as influence
                    with timed("t_influence", inside="t_optim"):
                        step_scores = influence(agent, b, mb_inds, target, args, mb_adv,
                                                step_precond(agent, optimizer, args))
                one = mb_inds is critic_inds or (torch.equal(mb_inds, critic_inds) and trunk_scale == 1.0)
                loss = ppo_losses(agent, b, mb_inds, args, adv=mb_adv, vf_coef=None if one else 0.0,
                                  parts=parts).mean()
                if not torch.isfinite(loss):
                    raise FloatingPointError(
                        f"non-finite PPO loss ({loss.item()}) at epoch {epoch}, step {n_updates}; "
                        "lower --learning-rate, or clip gradients with --max-grad-norm")
                loss.backward()
                if agent.image and trunk_scale != 1.0 and not one:
                    for p in agent.extractor.parameters():
                        p.grad.mul_(trunk_scale)
            if mb_inds is None or not one:  # the critic's loss on its minibatch of B(k)
                v_loss = (b["returns"][critic_inds] - agent.critic(agent.features(
                    b["obs"][critic_inds])).squeeze(-1)) ** 2
                (args.vf_coef * v_loss).mean().backward()
                parts["vf_loss"] = v_loss.detach()
            if mb_inds is not None:
                stats.append([float(parts[k].mean()) for k in DIAGNOSTICS])
            if args.max_grad_norm > 0:
                norm = nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            if tracin is not None:  # weighted by the factor clip_grad_norm_ scaled this step by
                scale = 1.0
                if args.max_grad_norm > 0:
                    scale = min(1.0, args.max_grad_norm / (norm.item() + 1e-6))
                tracin.index_add_(0, mb_inds, scale * step_scores)
            optimizer.step()
            n_updates += 1
    return done()


def slice_of(b, idx):
    return {k: b[k][idx] for k in ("obs", "actions", "logprobs")}


HOLD_TOLERANCE, HOLD_TRIES = 0.1, 6  # --hold-step exact: |KL / standard's - 1| <= 0.1, 6 tries


def held_update(agent, optimizer, b, kept, ref_kept, args, rng, scale, sample_p=None):
    """--hold-step: the update on the kept records held to the KL on B(k) that the reference update
    (on ref_kept, from theta(k)) takes. The policy's learning rate is rescaled rather than the
    update stopped early, so the update keeps its epochs and shape; the critic's is not (group 1 of
    held_optimizer). exact: from scale (the last round's), each try reruns the update from theta(k)'s
    own state at lr x scale, the next scale from the tries so far (log KL is near linear in log lr:
    KL ~ lr^2 for small steps); the try nearest the reference's KL stays. Returns (n_updates, the
    held step's record: kl_ref, lr_scale, n_tries)."""
    def state():  # copies: a restored optimizer must not share Adam's moments with the saved start
        return [copy.deepcopy(x.state_dict()) for x in (agent, optimizer)] + [
            copy.deepcopy(rng.bit_generator.state), torch.get_rng_state()]

    def restore(s):
        agent.load_state_dict(s[0])
        optimizer.load_state_dict(copy.deepcopy(s[1]))
        rng.bit_generator.state = copy.deepcopy(s[2])
        torch.set_rng_state(s[3])
    start = state()
    with timed("t_hold", inside="t_optim"):  # the reference update on a copy of the generator, undone
        ref_rng = copy.deepcopy(rng)
        n_ref, _ = ppo_update(agent, optimizer, b, torch.nonzero(ref_kept)[:, 0], args, ref_rng)
        kl_ref = approx_kl(agent, b)
    if torch.equal(kept, ref_kept) and sample_p is None:  # nothing to hold: the reference is the update
        seconds["t_optim"], seconds["t_hold"] = seconds["t_optim"] + seconds["t_hold"], 0.0
        rng.bit_generator.state = ref_rng.bit_generator.state
        return n_ref, dict(kl_ref=kl_ref, lr_scale=1.0, n_tries=0)
    with timed("t_hold", inside="t_optim"):
        restore(start)
        if args.hold_step == "grad-norm":
            scale = grad_sum_ratio(agent, b, kept, ref_kept, args)
    tries, best = [], None  # tries: (scale, KL, seconds); best: (miss, its index, its end state, ...)
    for _ in range(HOLD_TRIES if args.hold_step == "exact" else 1):
        t0 = time.perf_counter()
        restore(start)
        optimizer.param_groups[0]["lr"] = args.learning_rate * scale  # the policy's group only
        n_updates, _ = ppo_update(agent, optimizer, b, torch.nonzero(kept)[:, 0], args, rng,
                                  sample_p=sample_p, trunk_scale=scale)
        kl = approx_kl(agent, b)
        tries.append((scale, kl, time.perf_counter() - t0))
        miss = abs(math.log(kl / kl_ref)) if kl > 0 and kl_ref > 0 else math.inf
        if best is None or miss < best[0]:
            best = (miss, len(tries) - 1, state(), n_updates, dict(diagnostics))
        if n_updates == 0 or kl_ref <= 0 or abs(kl / kl_ref - 1) <= HOLD_TOLERANCE:
            break
        scale = next_scale(tries, kl_ref)
    _, i, end, n_updates, diagnostics_of_best = best
    restore(end)
    diagnostics.update(diagnostics_of_best)
    optimizer.param_groups[0]["lr"] = args.learning_rate
    for j, (_, _, t) in enumerate(tries):  # the tries not kept are the held step's cost
        if j != i:
            seconds["t_hold"] += t
            seconds["t_optim"] -= t
    return n_updates, dict(kl_ref=kl_ref, lr_scale=tries[i][0], n_tries=len(tries))


def held_optimizer(agent, args):
    """--hold-step's optimizer: iif.make_optimizer's, in two parameter groups, so that the hold
    scales the policy's rate (group 0) and not the critic's (group 1). A CNN shared by both (image
    envs) goes with the policy: the hold is on the policy's KL, which the CNN's step moves. With
    --critic-records all it goes with the critic, and ppo_update scales the policy loss's gradient
    into it instead: under SGD its step is then the policy's part held as the heads' and the critic's
    part at the critic's rate, so the hold no longer slows the critic's features. Each parameter is
    updated as in one group (tests/test_held_step.py: bit for bit)."""
    opt = make_optimizer(agent, args)
    critic = list(agent.critic.parameters())
    if agent.image and args.critic_records == "all":
        critic += list(agent.extractor.parameters())
    policy = [p for p in agent.parameters() if all(p is not c for c in critic)]
    return type(opt)([dict(params=policy), dict(params=critic)], **opt.defaults)


def next_scale(tries, kl_target):
    """The learning-rate multiple whose KL should land on kl_target: along the secant through the
    last two tries in log-log (its slope kept in [0.5, 4]), or slope 2 after one try"""
    s1, k1, _ = tries[-1]
    if k1 <= 0:
        return 4 * s1
    slope = 2.0
    if len(tries) > 1 and tries[-2][1] > 0 and tries[-2][0] != s1:
        s0, k0, _ = tries[-2]
        slope = min(4.0, max(0.5, math.log(k1 / k0) / math.log(s1 / s0)))
    return s1 * math.exp(math.log(kl_target / k1) / slope)


def grad_sum_ratio(agent, b, kept, ref_kept, args):
    """--hold-step grad-norm's multiple: an update moves theta by about lr x the sum of its
    records' policy gradients, so at |sum over the reference's records| / |sum over the kept ones|
    (at theta(k), A_hat normalised over the records trained on) the two updates move about as far"""
    norms = []
    for idx in (torch.nonzero(ref_kept)[:, 0], torch.nonzero(kept)[:, 0]):
        loss = ppo_losses(agent, b, idx, args, adv=normalize(b["advantages"][idx]), vf_coef=0.0)
        grads = torch.autograd.grad(loss.sum(), list(agent.parameters()), allow_unused=True)
        norms.append(math.sqrt(sum(float((g ** 2).sum()) for g in grads if g is not None)))
    return norms[0] / norms[1] if norms[1] > 0 else 1.0


def reseed_round(envs, ep_ret, args):
    """--reseed-rounds: the released code runs each IIF round as a new process seeded alike, so
    every round draws the same action noise and resets the envs to the same episodes (its
    standard PPO runs on). Returns the first observation."""
    torch.manual_seed(args.seed)
    ep_ret[:] = 0.0
    return envs.reset(seed=args.seed)[0]


# ---- Baselines of App. C.4 and C.5 ----
def baseline_filter(b, kept, args):
    """--filter-method adv-error, adv-product (App. C.4): their kept mask replaces the filter's;
    td-weight (App. C.5): minibatch sampling probabilities. Returns (kept, sample_p)."""
    if args.filter_method in ("adv-error", "adv-product"):
        T, N = args.num_steps, args.num_envs
        keys = np.array([o.tobytes() for o in b["obs"].numpy().reshape(T * N, -1)]).reshape(T, N)
        a_mc = mc_advantage(keys, b["actions"].numpy().reshape(T, N, -1)[..., 0],
                            b["rewards"].numpy().reshape(T, N), b["dones"].numpy().reshape(T, N),
                            args.gamma)
        a_hat = (b["returns"] - b["values"]).double()  # the GAE estimate before normalising
        return advantage_filter(torch.from_numpy(a_mc.reshape(-1)), a_hat, args.filter_method,
                                args.filter_p), None
    if args.filter_method == "td-weight":
        return kept, td_sampling_probs(b, args.gamma)
    return kept, None


def advantage_filter(a_mc, a_hat, method, p):
    """App. C.4: the candidates are the records whose Monte-Carlo advantage a_mc and estimate a_hat
    disagree in sign; drops floor(p x n_candidates) of them, largest |a_mc - a_hat| first
    ('adv-error') or most negative a_mc x a_hat first ('adv-product'). Returns the kept mask."""
    mismatch = a_mc * a_hat < 0  # False where a_mc is nan
    badness = (a_mc - a_hat).abs() if method == "adv-error" else -a_mc * a_hat
    order = torch.argsort(torch.where(mismatch, badness, -torch.inf), descending=True, stable=True)
    n_drop = math.floor(p * int(mismatch.sum()) + 1e-9)
    kept = torch.ones(len(a_mc), dtype=torch.bool)
    kept[order[:n_drop]] = False
    return kept


def td_sampling_probs(b, gamma, alpha=0.6):
    """App. C.5 (after prioritised replay): rank records by |TD error| r + gamma V(s') - V(s),
    priority P_i = 1 / rank(i), sampling probability P_i^alpha / sum_j P_j^alpha."""
    delta = b["rewards"] + gamma * b["next_values"] * (1 - b["terminations"]) - b["values"]
    rank = torch.empty(len(delta))
    order = torch.argsort(delta.abs(), descending=True, stable=True)
    rank[order] = torch.arange(1.0, len(delta) + 1)
    w = rank.double() ** -alpha
    return (w / w.sum()).numpy()


# ---- The loop of Alg. 1 with every switch ----
def main(args):
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)  # minibatch shuffling
    gen = torch.Generator().manual_seed(args.seed)  # random filtering
    envs = make_vec(args, args.num_envs, args.backends[0])
    eval_envs = make_vec(args, min(args.eval_envs, args.eval_episodes), args.backends[1])
    agent = Agent(envs.single_observation_space, envs.single_action_space)
    optimizer = make_optimizer(agent, args) if args.hold_step == "none" else held_optimizer(agent, args)
    run = Run(args, agent, optimizer, rng, gen)  # the run folder; --resume restores its last round
    next_obs, _ = envs.reset(seed=args.seed + 100_000 * run.start)  # a resumed run: new episodes
    ep_ret = np.zeros((2, args.num_envs))  # the returns and lengths of the episodes under way
    all_records = torch.arange(args.batch_size)
    try:
        for k in range(run.start, args.num_rounds):
            seconds.clear()
            run.save_state(k)
            if args.reseed_rounds:
                next_obs = reseed_round(envs, ep_ret, args)
            # Stage I (Alg. 1)
            with timed("t_rollout"):
                b, next_obs, episodes = collect_rollout(agent, envs, next_obs, ep_ret, args)
            if k == args.reseed_from:  # other randomness from here
                torch.manual_seed(args.seed + 1_000_003)
                rng.bit_generator.state = np.random.default_rng(args.seed + 1_000_003).bit_generator.state

            # Stage II (Alg. 1)
            with timed("t_influence"):
                target = make_target(agent, b, args)
                if args.adv_norm == "buffer":  # once over B(k): scoring and training see one A_hat
                    b["advantages"] = normalize(b["advantages"])
                precond = step_precond(agent, optimizer, args)
                scores = influence(agent, b, all_records, target, args, scoring_advantages(b, args),
                                   precond)
                if not torch.isfinite(scores).all():
                    raise FloatingPointError("non-finite influence scores; lower --learning-rate")
                agreement, p = agreement_guard(agent, target, args)
                kept, n_negative = filter_records(scores, args.filter_method, p, gen,
                                                  args.filter_ties)
                kept, sample_p = baseline_filter(b, kept, args)  # App. C replaces the filter

            # Stage III (Alg. 1)
            theta_k = None
            if args.save_rounds:
                theta_k = {key: v.clone() for key, v in agent.state_dict().items()}
            held = {}
            with timed("t_optim"):
                if args.hold_step != "none":  # held to the reference update's step from theta(k)
                    ref_kept = all_records >= 0
                    if args.hold_to == "influence":
                        ref_kept, _ = filter_records(scores, "influence", p, gen, args.filter_ties)
                    n_updates, held = held_update(agent, optimizer, b, kept, ref_kept, args, rng,
                                                  run.scale, sample_p)
                    tracin = None
                    if held["n_tries"]:  # the next round starts from this round's multiple
                        run.scale = held["lr_scale"]
                else:
                    n_updates, tracin = ppo_update(
                        agent, optimizer, b, torch.nonzero(kept)[:, 0], args, rng,
                        target if args.influence_mode == "tracin" else None, sample_p)

            with timed("t_eval"):
                test = (None, None)
                if (k + 1) % args.eval_every == 0:
                    test = evaluate(agent, eval_envs, args.eval_episodes, args.seed + 10_000)

            ended = episodes[:, :2].mean(0) if len(episodes) else (None, None)  # the training episodes'
            train_return, train_length = (None if x is None else float(x) for x in ended)
            row = dict(round=k, global_step=(k + 1) * args.batch_size,
                       train_return=train_return, train_length=train_length,
                       test_return_mean=test[0], test_return_std=test[1],
                       n_records=args.batch_size, n_kept=int(kept.sum()),
                       n_dropped=int((~kept).sum()), n_negative=n_negative, agreement=agreement,
                       n_updates=n_updates, kl=approx_kl(agent, b), **held, **seconds,
                       **diagnostics, explained_var=explained_variance(b))
            run.end_round(row, dict(b, round=k, global_step=row["global_step"], state_dict=theta_k,
                                    influence=scores, kept=kept, influence_tracin=tracin,
                                    target=args.target))
    except FloatingPointError as e:
        fail(f"round {k}: {e}")
    run.finish(agent)
    envs.close()
    eval_envs.close()


# ---- The flags ----
def resolve_args(args):
    """iif.resolve_args, then the flags of this file and f_action's state and action."""
    if args.run_name is None and args.resume:
        fail("--resume needs the --run-name of the run to continue")
    iif.resolve_args(args)
    args.env_kwargs = PRESETS.get(args.env_id, {}).get("env_kwargs", {})
    for key in ("eval_every", "threads"):
        if getattr(args, key) < 1:
            fail(f"--{key.replace('_', '-')} must be at least 1, got {getattr(args, key)}")
    if not -1 <= args.min_agreement <= 1:
        fail(f"--min-agreement must be in [-1, 1], got {args.min_agreement}")
    if args.target_kl < 0:
        fail(f"--target-kl must be 0 (off) or positive, got {args.target_kl}")
    if args.influence_precond == "adam" and args.optimizer != "adam":
        fail(f"--influence-precond adam scores the steps Adam takes; --optimizer is "
             f"{args.optimizer} (use --influence-precond none)")
    if args.hold_step != "none" and (args.influence_mode == "tracin" or args.target_kl > 0):
        fail(f"--hold-step {args.hold_step} sets the step by the learning rate: it takes neither "
             "--influence-mode tracin nor --target-kl")
    if args.critic_records == "all" and (args.influence_mode == "tracin" or args.target_kl > 0
                                          or args.filter_method == "td-weight"):
        fail("--critic-records all pairs the policy's minibatches of kept records with the critic's "
             "of all records: it takes neither --influence-mode tracin, --target-kl nor "
             "--filter-method td-weight")
    if args.save_states < 0:
        fail(f"--save-states must be 0 (none) or positive, got {args.save_states}")
    if args.hold_step == "grad-norm" and args.hold_to != "standard":
        fail("--hold-step grad-norm holds to standard PPO's step only: use --hold-step exact with "
             f"--hold-to {args.hold_to}")
    if args.hold_to != "standard" and args.hold_step == "none":
        fail(f"--hold-to {args.hold_to} names the update that --hold-step holds to: add --hold-step "
             "exact")
    if args.influence_mode == "tracin" and not args.save_rounds:
        fail("--influence-mode tracin writes its scores into the round files: add --save-rounds")
    if args.eval_envs is None:
        args.eval_envs = args.eval_episodes if args.backends[1] == "envpool" else 16
    if args.eval_envs < 1:
        fail(f"--eval-envs must be at least 1, got {args.eval_envs}")
    if args.filter_method not in ("adv-error", "adv-product") and args.target != "f_action":
        return args
    env = make_env(args.env_id)()
    raw_obs_space, obs_space, act_space = (env.unwrapped.observation_space, env.observation_space,
                                           env.action_space)
    env.close()
    discrete = isinstance(act_space, gym.spaces.Discrete)
    if args.filter_method in ("adv-error", "adv-product") and not discrete:
        fail(f"--filter-method {args.filter_method} needs a Discrete action space (App. C.4)")
    if args.target == "f_action":
        if args.target_state is None or args.target_action is None:
            fail("--target f_action needs --target-state and --target-action")
        s = parse_values("--target-state", args.target_state)
        if isinstance(raw_obs_space, gym.spaces.Discrete) and len(s) == 1:
            s = np.eye(int(raw_obs_space.n))[int(s[0])].tolist()
        if len(s) != int(np.prod(obs_space.shape)):
            fail(f"--target-state has {len(s)} values; an observation of shape {obs_space.shape} "
                 f"needs {int(np.prod(obs_space.shape))}")
        a = parse_values("--target-action", args.target_action)
        if len(a) != (1 if discrete else act_space.shape[0]) or (
                discrete and not 0 <= a[0] < act_space.n):
            fail(f"--target-action {args.target_action!r} is not an action of {act_space}")
        args.target_obs, args.target_act = s, a
    return args


def parse_values(flag, text):
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        fail(f"{flag} takes comma-separated numbers, got {text!r}")


# ---- The run folder (config.json, metrics.csv, round files, --resume) and timing ----
# --hold-step's columns of metrics.csv: the reference update's KL on B(k) from theta(k), the policy's
# learning-rate multiple the round's update took, its tries, and the seconds of the held step's extra work
HOLD_COLUMNS = ["kl_ref", "lr_scale", "n_tries", "t_hold"]
# iif.py's columns, and the agreement guard's measure (empty with --min-agreement -1)
METRICS = iif.METRICS[:iif.METRICS.index("n_negative") + 1] + ["agreement"] + iif.METRICS[
    iif.METRICS.index("n_negative") + 1:]
# flags a resumed run may change, and the values resolve_args derives from the others
NOT_COMPARED = ("resume", "save_states", "threads", "runs_dir", "backends", "exp_name", "batch_size",
                "num_rounds", "env_kwargs", "target_obs", "target_act", "cuda", "torch_deterministic", "track",
                "wandb_project_name", "wandb_entity", "capture_video", "save_model", "eval_model")
# flags newer than some saved runs: a config.json without them was made with them off
ADDED_FLAGS = dict(min_agreement=-1.0, influence_precond="none", target_kl=0.0, score_log_std=True,
                   reseed_rounds=False, hold_step="none", hold_to="standard", reseed_from=-1,
                   critic_records="kept", save_states=0)


class Run:
    """<runs-dir>/<run-name>/: config.json, metrics.csv (a row per round), rounds/round_KKKK.pt
    (--save-rounds), states/round_KKKK.pt (--save-states), checkpoint.pt (the state after the last
    finished round) and agent.pt."""

    def __init__(self, args, agent, optimizer, rng, gen):
        """Write config.json and open metrics.csv; with --resume, restore the state after the last
        finished round into the agent, the optimizer and the generators, and keep its rows."""
        self.args, self.dir = args, os.path.join(args.runs_dir, args.run_name)
        self.state = agent, optimizer, rng, gen
        ckpt = load_checkpoint(self.dir, args)
        os.makedirs(os.path.join(self.dir, "rounds") if args.save_rounds else self.dir,
                    exist_ok=True)
        with open(os.path.join(self.dir, "config.json"), "w") as f:
            json.dump(dataclasses.asdict(args), f, indent=1)
        self.start, rows = 0, []  # the first round to run
        self.scale = 1.0  # --hold-step: the learning-rate multiple the next round tries first
        if ckpt is not None:
            agent.load_state_dict(ckpt["agent"])
            optimizer.load_state_dict(ckpt["optimizer"])
            torch.set_rng_state(ckpt["torch_rng"])
            rng.bit_generator.state = ckpt["numpy_rng"]
            gen.set_state(ckpt["filter_rng"])
            self.scale = ckpt.get("hold_scale", 1.0)
            self.start = ckpt["round"] + 1
            with open(os.path.join(self.dir, "metrics.csv")) as f:  # rows after it are redone
                rows = [r for r in csv.DictReader(f) if int(r["round"]) < self.start]
        self.file = open(os.path.join(self.dir, "metrics.csv"), "w", newline="")
        columns = METRICS + (HOLD_COLUMNS if args.hold_step != "none" else [])
        self.writer = csv.DictWriter(self.file, fieldnames=columns)
        self.writer.writeheader()
        self.writer.writerows(rows)
        self.file.flush()
        print(f"{args.env_id} on {args.backends[0]}, tests on {args.backends[1]}: {args.num_rounds} rounds "
              f"of {args.batch_size} records, filter {args.filter_method} p={args.filter_p}, {args.optimizer} "
              f"lr={args.learning_rate}, {args.eval_episodes} test episodes every "
              f"{args.eval_every} round(s) -> {self.dir}"
              + (f" (resumed at round {self.start})" if self.start else ""))

    def end_round(self, row, round_file):
        """Write the round's row, its round file (--save-rounds), then the checkpoint (a run
        killed before this redoes the round), and print its line."""
        k, a, (agent, optimizer, rng, gen) = row["round"], self.args, self.state
        self.writer.writerow(row)
        self.file.flush()
        if a.save_rounds:
            torch.save(round_file, os.path.join(self.dir, "rounds", f"round_{k:04d}.pt"))
        save_checkpoint(os.path.join(self.dir, "checkpoint.pt"), self.checkpoint(k))
        test = "-"
        if row["test_return_mean"] is not None:
            test = f"{row['test_return_mean']:.3f} +- {row['test_return_std']:.3f}"
        train = "(no episode ended)"
        if row["train_return"] is not None:
            train = f"{row['train_return']:.3f}"
        agree = "" if row["agreement"] is None else f" agree {row['agreement']:+.2f}"
        held = ""
        if "kl_ref" in row:
            held = (f" | kl {row['kl']:.2g}, {a.hold_to}'s {row['kl_ref']:.2g} at lr x "
                    f"{row['lr_scale']:.2f} ({row['n_tries']} tries)")
        print(f"round {k} [{k + 1}/{a.num_rounds}] step {row['global_step']} "
              f"| train {train} test {test} "
              f"| kept {row['n_kept']}/{a.batch_size} (neg {row['n_negative']}{agree}){held} "
              f"| s: rollout {row['t_rollout']:.2f} influence {row['t_influence']:.2f} "
              f"optim {row['t_optim']:.2f} eval {row['t_eval']:.2f}", flush=True)

    def checkpoint(self, k):  # the state after round k: the next round starts from it
        agent, optimizer, rng, gen = self.state
        return dict(round=k, agent=agent.state_dict(), optimizer=optimizer.state_dict(),
                    torch_rng=torch.get_rng_state(), numpy_rng=rng.bit_generator.state,
                    filter_rng=gen.get_state(), hold_scale=self.scale)

    def save_state(self, k):
        """--save-states: the state at the start of round k, as results/one_round.py reads it"""
        if self.args.save_states and k % self.args.save_states == 0:
            os.makedirs(os.path.join(self.dir, "states"), exist_ok=True)
            save_checkpoint(os.path.join(self.dir, "states", f"round_{k:04d}.pt"), self.checkpoint(k - 1))

    def finish(self, agent):
        torch.save(agent.state_dict(), os.path.join(self.dir, "agent.pt"))
        self.file.close()


def save_checkpoint(path, state):
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)  # atomic: a run killed while saving keeps the previous one


def load_checkpoint(run_dir, args):
    """The state after the last finished round of run_dir, or None to start at round 0."""
    if not args.resume:
        if os.path.exists(os.path.join(run_dir, "metrics.csv")):
            fail(f"{run_dir}/metrics.csv exists: add --resume to continue it, "
                 "or choose another --run-name")
        return None
    path = os.path.join(run_dir, "checkpoint.pt")
    if not os.path.exists(path):
        return None
    with open(os.path.join(run_dir, "config.json")) as f:
        saved = {**ADDED_FLAGS, **json.load(f)}
    flags = [f.name for f in dataclasses.fields(Args) if f.name not in NOT_COMPARED]
    changed = [f"--{k.replace('_', '-')} {saved.get(k)} (now {getattr(args, k)})" for k in flags
               if saved.get(k) != getattr(args, k)]
    if changed:
        fail(f"--resume: {run_dir} was run with other flags: {'; '.join(changed)}")
    return torch.load(path, weights_only=False)


seconds = collections.defaultdict(float)  # metrics.csv's t_* columns of the round under way
diagnostics = {}  # its DIAGNOSTICS columns: the means over ppo_update's steps


@contextlib.contextmanager
def timed(column, inside=None):
    """Add the block's seconds to seconds[column], and take them off the column of the block it
    runs inside (TracIn's scores, computed inside the update, count as influence only)."""
    t0 = time.perf_counter()
    yield
    t = time.perf_counter() - t0
    seconds[column] += t
    if inside:
        seconds[inside] -= t


if __name__ == "__main__":
    torch.distributions.Distribution.set_default_validate_args(False)  # checks slow the rollout
    args = resolve_args(tyro.cli(Args, description=__doc__.split("\n\n")[0]))
    try:
        main(args)
    except KeyboardInterrupt:
        sys.exit(f"\ninterrupted: every finished round is in "
                 f"{os.path.join(args.runs_dir, args.run_name)}/metrics.csv; "
                 "the same command with --resume continues the run")
