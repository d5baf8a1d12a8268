"""PPO with local data attribution and Iterative Influence-based Filtering (IIF), in one file.

An annotated companion to "A Snapshot of Influence: A Local Data Attribution Framework for Online
Reinforcement Learning" (Hu, Wu et al., NeurIPS 2025). Each round k collects a rollout buffer B(k)
with the policy at theta(k), scores every record by its influence on a target function, drops the
most harmful records and runs the ordinary PPO update on the rest (Alg. 1).

    python iif.py --env-id FrozenLake-v1    # about a minute on one CPU core
    python iif.py --env-id Acrobot-v1 --filter-method none    # standard PPO

On an environment outside the paper, IIF filters only the rounds whose target gradient agrees
across the buffer (--min-agreement 0.5): filtering every round, as the paper does, slowed or
destabilised three of the four other environments we tried (docs/results.md).
"""
import csv
import dataclasses
import importlib.util
import json
import math
import os
import sys
import time
import warnings
from typing import Literal, Optional

os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")  # highway-env imports pygame
import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.distributions import Categorical, Normal
from torch.func import functional_call, jvp

# App. B.1-B.2: the paper's budget, optimizer, filter p and test episodes for each environment.
# envpool: the keyword arguments of its batched C++ port (without one: gymnasium only)
PRESETS = {
    "FrozenLake-v1": dict(
        total_timesteps=102_400, optimizer="sgd", learning_rate=5e-3, filter_p=0.5,
        eval_episodes=1000, env_kwargs=dict(map_name="4x4", is_slippery=False)),
    "MiniGrid-Empty-8x8-v0": dict(
        total_timesteps=81_920, optimizer="sgd", learning_rate=5e-3, filter_p=0.125,
        eval_episodes=1000, envpool={}),
    "Acrobot-v1": dict(
        total_timesteps=102_400, optimizer="sgd", learning_rate=5e-3, filter_p=0.5,
        eval_episodes=1000, envpool={}),
    "highway-v0": dict(
        total_timesteps=204_800, optimizer="sgd", learning_rate=5e-3, filter_p=0.5,
        eval_episodes=100, envpool=dict(vehicles_count=10),
        env_kwargs=dict(config=dict(  # a misspelt key is silently ignored
            vehicles_count=10, observation=dict(type="Kinematics"),
            action=dict(type="DiscreteMetaAction")))),
    "LunarLander-v3": dict(
        total_timesteps=307_200, optimizer="sgd", learning_rate=5e-3, filter_p=0.125,
        eval_episodes=1000, envpool={}),
    "BipedalWalker-v3": dict(
        total_timesteps=1_024_000, optimizer="adam", learning_rate=3e-4, filter_p=0.0625,
        eval_episodes=100, envpool={}),
}
# not the paper's task: 3 lanes, 5 Hz, 30-step episodes; highway-env's quick variant of highway-v0
PRESETS["highway-fast-v0"] = {k: v for k, v in PRESETS["highway-v0"].items() if k != "envpool"}
# any other env: SB3's PPO defaults, 50 rounds, and IIF only in rounds whose target is signal
# (--min-agreement; without it IIF slowed or destabilised envs outside the paper, docs/results.md)
DEFAULTS = dict(total_timesteps=102_400, optimizer="adam", learning_rate=3e-4, filter_p=0.5,
                eval_episodes=100, min_agreement=0.5)


@dataclasses.dataclass
class Args:
    env_id: str = "Acrobot-v1"
    """gymnasium id: a paper preset (FrozenLake-v1, MiniGrid-Empty-8x8-v0, Acrobot-v1, highway-v0,
    highway-fast-v0, LunarLander-v3, BipedalWalker-v3) or any env with Box/Discrete spaces (which
    filters only where the target agrees across the buffer: see --min-agreement)"""
    seed: int = 1
    """seed of torch, numpy, the environments and the filter"""
    run_name: Optional[str] = None
    """results go to <runs-dir>/<run-name>/ (default: env__method__seed__time)"""
    runs_dir: str = "runs"
    """parent folder of the run folders"""
    save_rounds: bool = False
    """also write <run>/rounds/round_KKKK.pt: theta(k) and the scored buffer B(k) of every round"""
    threads: int = 1
    """torch CPU threads (small networks run fastest and steadiest on one), and envpool's threads"""
    env_backend: Literal["auto", "gymnasium", "envpool"] = "auto"
    """environments of the rollouts and the test episodes: gymnasium (what the paper used), envpool
    (batched C++ ports, checked against gymnasium in docs/backends.md) or auto: envpool where a
    preset has a port and envpool is installed, gymnasium otherwise"""
    resume: bool = False
    """continue <runs-dir>/<run-name> from its last finished round (its checkpoint.pt) with the same
    flags; the environments start fresh episodes. Without a checkpoint the run starts at round 0"""

    # None: the env's value in PRESETS above (the paper's), or in DEFAULTS for any other env
    total_timesteps: Optional[int] = None
    """environment steps of training, a multiple of num-steps x num-envs (None: the preset's, e.g.
    102400 = 50 rounds on Acrobot)"""
    optimizer: Optional[Literal["sgd", "adam"]] = None
    """sgd or adam (None: the preset's: SGD, TracIn's setting, on the paper's envs except
    BipedalWalker; Adam on other envs)"""
    learning_rate: Optional[float] = None
    """optimizer learning rate (None: the preset's: 5e-3 with SGD, 3e-4 with Adam)"""
    filter_p: Optional[float] = None
    """fraction p in (0, 1] of the negative-influence records to drop each round (None: the
    preset's, e.g. 0.5 on Acrobot)"""
    eval_episodes: Optional[int] = None
    """test episodes after every tested round (None: the preset's, e.g. 1000 on Acrobot)"""
    eval_every: int = 1
    """test after every N-th round only (rounds N-1, 2N-1, ...; the others get an empty test return)
    """

    filter_method: Literal[
        "influence", "random", "none", "adv-error", "adv-product", "td-weight"] = "influence"
    """influence: IIF; random: drop as many records uniformly at random; none: standard PPO;
    baselines of App. C.4 (for discrete observations) adv-error, adv-product: drop records whose
    Monte-Carlo and GAE advantages disagree in sign; App. C.5 td-weight: sample minibatches by
    TD-error rank"""
    target: Literal["f_return", "f_action"] = "f_return"
    """target function the influence is measured on (Sec. 3.1)"""
    target_state: Optional[str] = None
    """f_action's state: comma-separated observation values (one index for a Discrete observation)
    """
    target_action: Optional[str] = None
    """f_action's action: an index, or comma-separated values for a Box action"""
    influence_mode: Literal["snapshot", "tracin"] = "snapshot"
    """snapshot: score at theta(k) only (Sec. 5.1); tracin: also sum the score over every optimizer
    step of the round (Sec. 3.1), saved in the --save-rounds files as influence_tracin"""

    num_envs: int = 1
    """parallel environments collecting the buffer"""
    async_envs: bool = False
    """step the environments in subprocesses (pays off only for slow envs such as highway)"""
    eval_envs: Optional[int] = None
    """parallel environments for the test episodes (None: one per episode on envpool, 16 on
    gymnasium)"""
    num_steps: int = 2048
    """steps per environment per round; the buffer holds num-steps x num-envs records"""
    minibatch_size: int = 64
    """records per optimizer step"""
    update_epochs: int = 10
    """passes over the (kept) buffer per round"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """GAE lambda"""
    clip_coef: float = 0.2
    """PPO clipping epsilon"""
    ent_coef: float = 0.0
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    target_kl: float = 0.0
    """stop a round's update once a minibatch's approximate KL(pi_theta(k) || pi_theta) passes 1.5 x
    this (SB3's early stop); 0 disables it (the paper, the released code and SB3's default)"""

    # The released code's choices, which produced the paper's numbers (docs/results.md)
    max_grad_norm: float = 0.0
    """global gradient-norm clip, 0 disables it (the released code: none, its clip line is
    commented out; App. B.2 and SB3: 0.5)"""
    adv_norm: Literal["minibatch", "buffer", "none"] = "minibatch"
    """how training normalises A_hat: minibatch: each minibatch by its own mean and std, after
    filtering (the released code and SB3); buffer: once over the whole buffer, before filtering;
    none: raw"""
    target_adv: Literal["raw", "normalized"] = "raw"
    """the A_hat weighting f_return: raw GAE estimates (the paper's definition and the released
    code) or normalised over the buffer"""
    influence_loss: Literal["policy", "full"] = "policy"
    """the per-record loss l_i inside the influence: policy: the clipped surrogate and entropy only
    (the released code); full: the PPO loss the update minimises, value term included. They differ
    only where policy and value share parameters (MiniGrid's CNN)"""
    score_log_std: bool = True
    """include a Gaussian policy's log-std in the influence (the released scorer hooked nn.Linear
    layers only, which leaves it out)"""
    influence_precond: Literal["none", "adam"] = "none"
    """the step a record's gradient makes, inside the influence: none: the gradient itself (an SGD
    step, the paper's and the released code's score); adam: the gradient divided by sqrt of Adam's
    second-moment estimate, the step Adam takes (needs --optimizer adam)"""
    min_agreement: Optional[float] = None
    """filter a round only if f_return's gradient agrees across 8 consecutive slices of the
    rollout's steps (mean cosine at least this); a round below it keeps every record (and random
    drops none). -1: always filter, agreement not computed (None: the preset's: -1, the paper,
    on the paper's envs; 0.5 on any other env)"""
    filter_ties: Literal["keep", "drop"] = "keep"
    """records tied with the score at the cut: keep: only records strictly below it are dropped
    (the released code); drop: exactly floor(p x negatives) are dropped, ties broken by buffer
    order"""

    # filled in by resolve_args (not flags)
    batch_size: tyro.conf.Suppress[int] = 0
    """records per buffer: num-steps x num-envs"""
    num_rounds: tyro.conf.Suppress[int] = 0
    """rounds of training: total-timesteps / batch-size"""
    env_kwargs: tyro.conf.Suppress[dict] = dataclasses.field(default_factory=dict)
    """the preset's gym.make keyword arguments"""
    target_obs: tyro.conf.Suppress[Optional[list]] = None
    """f_action's state as an observation vector"""
    target_act: tyro.conf.Suppress[Optional[list]] = None
    """f_action's action"""


def fail(msg):
    raise SystemExit(f"iif.py: error: {msg}")


def make_env(env_id, env_kwargs):
    """A thunk building one env whose observation is a flat float vector or an (H, W, C) image."""

    def thunk():
        if env_id.startswith("MiniGrid"):
            import minigrid  # noqa: F401  (registers the MiniGrid-* ids)
        if env_id.startswith("highway"):
            import highway_env  # noqa: F401  (registers the highway-* ids)
        env = gym.make(env_id, **env_kwargs)
        if env_id.startswith("MiniGrid"):
            from minigrid.wrappers import ImgObsWrapper
            env = ImgObsWrapper(env)  # the 7x7x3 egocentric view; the agent scales it by 1/255
        space = env.observation_space
        if isinstance(space, gym.spaces.Discrete):  # FrozenLake: state index -> one-hot vector
            n = int(space.n)
            one_hot = gym.spaces.Box(0.0, 1.0, (n,), np.float32)
            env = gym.wrappers.TransformObservation(
                env, lambda s: np.eye(n, dtype=np.float32)[s], one_hot)
        elif isinstance(space, gym.spaces.Box) and len(space.shape) == 2:
            # highway's (vehicles, features)
            env = gym.wrappers.FlattenObservation(env)
        return env

    return thunk


def make_vec(args, n):
    if args.env_backend == "envpool":
        kwargs = PRESETS.get(args.env_id, {}).get("envpool", {})
        return EnvpoolVec(args.env_id, kwargs, n, args.threads)
    env_fns = [make_env(args.env_id, args.env_kwargs) for _ in range(n)]
    vec = gym.vector.AsyncVectorEnv if args.async_envs else gym.vector.SyncVectorEnv
    # SAME_STEP: a finished episode's last observation comes in info["final_obs"] (needed to
    # bootstrap truncated episodes); the returned observation is already the next episode's first
    return vec(env_fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(n_in, n_out, out_std):
    return nn.Sequential(layer_init(nn.Linear(n_in, 64)), nn.Tanh(),
                         layer_init(nn.Linear(64, 64)), nn.Tanh(),
                         layer_init(nn.Linear(64, n_out), std=out_std))


class Agent(nn.Module):
    """SB3's default actor-critic (App. B.2): separate 64-64 tanh MLPs for policy and value; an
    image observation first goes through a CNN extractor shared by both (MiniGrid); a Box action is
    a diagonal Gaussian with a state-independent log-std."""

    def __init__(self, obs_space, act_space):
        super().__init__()
        self.image = len(obs_space.shape) == 3
        if self.image:
            h, w, c = obs_space.shape
            self.extractor = nn.Sequential(
                layer_init(nn.Conv2d(c, 16, 3)), nn.ReLU(),
                layer_init(nn.Conv2d(16, 32, 3)), nn.ReLU(),
                nn.Flatten(), layer_init(nn.Linear(32 * (h - 4) * (w - 4), 64)), nn.ReLU())
        n_in = 64 if self.image else int(np.prod(obs_space.shape))
        self.continuous = isinstance(act_space, gym.spaces.Box)
        n_act = act_space.shape[0] if self.continuous else int(act_space.n)
        self.actor = mlp(n_in, n_act, out_std=0.01)
        self.critic = mlp(n_in, 1, out_std=1.0)
        if self.continuous:
            self.log_std = nn.Parameter(torch.zeros(n_act))

    def features(self, obs):
        return self.extractor(obs.permute(0, 3, 1, 2) / 255.0) if self.image else obs

    def dist(self, h):
        if self.continuous:
            mean = self.actor(h)
            return Normal(mean, self.log_std.exp().expand_as(mean))
        return Categorical(logits=self.actor(h))

    def forward(self, obs, action, critic=True):
        """log pi(a|s), entropy and V(s) (None without the critic) of a batch of records."""
        h = self.features(obs)
        d = self.dist(h)
        logp, ent = d.log_prob(action), d.entropy()
        if self.continuous:
            logp, ent = logp.sum(-1), ent.sum(-1)
        return logp, ent, self.critic(h).squeeze(-1) if critic else None

    @torch.inference_mode()
    def act(self, obs):
        return self.dist(self.features(obs)).sample()

    @torch.inference_mode()
    def value(self, obs):
        return self.critic(self.features(obs)).squeeze(-1)


def compute_gae(rewards, values, next_values, terminations, dones, gamma, lam):
    """GAE over a (steps, envs) rollout. next_values[t] is V of the state after step t in the same
    episode: for a truncated episode the value of its final observation (bootstrapped, as SB3 does),
    ignored where the episode terminated."""
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0.0
    for t in reversed(range(len(rewards))):
        delta = rewards[t] + gamma * next_values[t] * (1.0 - terminations[t]) - values[t]
        # dones[t]: step t *ended* an episode (CleanRL's dones[t] says obs[t] *started* one), so
        # the recursion is cut after step t and step t's own delta still counts
        lastgaelam = delta + gamma * lam * (1.0 - dones[t]) * lastgaelam
        advantages[t] = lastgaelam
    return advantages, advantages + values


def normalize(x):
    return (x - x.mean()) / (x.std() + 1e-8)


def ppo_losses(agent, b, idx, args, params=None, adv=None, vf_coef=None):
    """Per-record PPO loss l_i (Sec. 2.1); an optimizer step minimises its mean over a minibatch.
    params: parameter tensors to evaluate the agent at (for torch.func), by default its own;
    adv: the records' advantages (default b["advantages"][idx]); vf_coef: default args.vf_coef."""
    obs, actions = b["obs"][idx], b["actions"][idx]
    if params is None:
        logp, entropy, value = agent(obs, actions)
    else:
        logp, entropy, value = functional_call(agent, params, (obs, actions))
    adv = b["advantages"][idx] if adv is None else adv
    vf_coef = args.vf_coef if vf_coef is None else vf_coef
    ratio = (logp - b["logprobs"][idx]).exp()
    clipped_ratio = ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)
    pg_loss = -torch.min(ratio * adv, clipped_ratio * adv)
    v_loss = (b["returns"][idx] - value) ** 2  # as SB3: no 1/2 and no value clipping
    return pg_loss + vf_coef * v_loss - args.ent_coef * entropy


def target_fn(agent, params, t_obs, t_actions, t_weights):
    """Target functions (Sec. 3.1) share one form, f(theta) = mean_j w_j log pi_theta(a_j | s_j):
    f_return is it over the round's buffer with w = A_hat (pi_ref = pi_theta(k)); f_action over one
    chosen (s, a) with w = 1."""
    logp, _, _ = functional_call(agent, params, (t_obs, t_actions), {"critic": False})
    return (logp * t_weights).mean()


def target_grad(agent, params, target):
    """grad f at params, {name: gradient}, for the parameters f reaches (a separate critic has none)
    """
    grads = torch.autograd.grad(target_fn(agent, params, *target), list(params.values()),
                                allow_unused=True)
    return {k: g for k, g in zip(params, grads) if g is not None}


def influence(agent, b, idx, target, args, adv=None, precond=None):
    """Influence of records idx (Sec. 3.1): I_i = <grad f(theta), -grad l_i(theta)>, at the agent's
    current parameters. Exact and batched: one backward pass gives g = grad f, one forward-mode pass
    (jvp) gives the directional derivatives dl_i/dtheta . g of all records at once.
    target: (obs, actions, weights) of target_fn; adv: the A_hat of the records inside l_i (default
    b["advantages"][idx]); --influence-loss policy drops l_i's value term; precond: a diagonal
    preconditioner P per parameter (adam_precond), giving I_i = <grad f, -P grad l_i>."""
    vf_coef = 0.0 if args.influence_loss == "policy" else args.vf_coef
    params = {k: v.detach().requires_grad_() for k, v in agent.named_parameters()}
    # 1. g = grad f(theta), one backward pass; 2. f never reaches a separate critic: those
    # parameters get no tangent and stay fixed
    g = target_grad(agent, params, target)
    if not args.score_log_std:  # --no-score-log-std: as if log-std were not a parameter
        g.pop("log_std", None)
    if precond is not None:  # <g, P grad l_i> = <P g, grad l_i> for a diagonal P
        g = {k: gk * precond[k] for k, gk in g.items()}
    primals = {k: params[k].detach() for k in g}
    frozen = {k: v.detach() for k, v in params.items() if k not in g}

    def losses(p):  # theta -> (l_1(theta), ..., l_n(theta)) of the records idx
        return ppo_losses(agent, b, idx, args, {**frozen, **p}, adv, vf_coef)

    # 3. one forward-mode pass: dl_i/dtheta . g for every record i at once
    _, dl = jvp(losses, (primals,), (g,))
    # 4. I_i = <g, -grad l_i>
    return -dl


def target_agreement(agent, target, n_slices=8):
    """Mean cosine between the gradients of f over n_slices consecutive slices of the target's
    records (B(k) in step order). Well above 0: the slices of the buffer point f the same way;
    near 0: grad f is this buffer's noise, and the scores made with it rank records by noise."""
    params = {k: v.detach().requires_grad_() for k, v in agent.named_parameters()}
    grads = []
    for part in torch.arange(len(target[0])).tensor_split(n_slices):
        g = target_grad(agent, params, [x[part] for x in target])
        grads.append(torch.cat([gi.flatten() for gi in g.values()]))
    g = nn.functional.normalize(torch.stack(grads), dim=1)
    return float(((g @ g.T).sum() - n_slices) / (n_slices * (n_slices - 1)))


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


def scoring_advantages(b, args):
    """The A_hat of each record inside l_i when it is scored at theta(k). With --adv-norm minibatch,
    the buffer's normalisation: the expected statistics of the minibatches the record will meet (the
    released scorer used those of its first-epoch minibatch)."""
    return normalize(b["advantages"]) if args.adv_norm == "minibatch" else b["advantages"]


def filter_records(scores, method, p, gen, ties="drop"):
    """Stage II of Alg. 1: returns (kept mask, n_negative). 'influence' drops floor(p x n_negative)
    records, most negative first, ties broken by buffer order (a buffer with no negative record is
    kept whole); with ties="keep", records whose score equals the first kept one's stay too (the
    released code). 'random' drops as many, uniformly at random. Other methods drop nothing here."""
    n_neg = int((scores < 0).sum())
    if method not in ("influence", "random"):
        return torch.ones(len(scores), dtype=torch.bool), n_neg
    n_drop = math.floor(p * n_neg + 1e-9)  # 1e-9: 0.29 * 100 = 28.999..
    order = torch.argsort(scores, stable=True)
    if ties == "keep" and n_drop < len(scores):
        n_drop = int((scores < scores[order[n_drop]]).sum())
    if method == "random":
        order = torch.randperm(len(scores), generator=gen)
    kept = torch.ones(len(scores), dtype=torch.bool)
    kept[order[:n_drop]] = False
    return kept, n_neg


@torch.no_grad()
def approx_kl(agent, b, idx):
    """KL(pi_theta(k) || pi_theta) estimated on records idx, whose actions pi_theta(k) sampled:
    the mean of (r - 1) - log r, r = pi_theta(a|s) / pi_theta(k)(a|s) (unbiased, never negative)."""
    logratio = agent(b["obs"][idx], b["actions"][idx], critic=False)[0] - b["logprobs"][idx]
    return float((logratio.exp() - 1 - logratio).mean())


def ppo_update(agent, optimizer, b, kept_idx, args, rng, target=None, sample_p=None):
    """Stage III of Alg. 1: the usual PPO epochs, over the kept records only. Minibatches keep their
    size; when it does not divide the kept count, each epoch's (reshuffled) remainder is skipped, as
    in the authors' code, so a filtered round takes fewer optimizer steps. With a target, also
    returns the TracIn influence of Sec. 3.1, summed over every step whose minibatch holds the
    record. Each step's scores are weighted by the factor clipping scaled that step by, so they add
    up as the steps do. With sample_p (App. C.5), each epoch draws its records with these
    probabilities, with replacement. --adv-norm minibatch normalises each minibatch's advantages
    here, after filtering."""
    mbs = args.minibatch_size
    tracin = None
    if target is not None:
        tracin = torch.zeros(len(b["advantages"]), dtype=b["advantages"].dtype)
    n_updates, t_tracin = 0, 0.0
    for epoch in range(args.update_epochs):
        if sample_p is None:
            order = rng.permutation(len(kept_idx))
        else:  # App. C.5 td-weight: records drawn by TD-error rank, with replacement
            order = rng.choice(len(kept_idx), size=len(kept_idx), p=sample_p)
        perm = kept_idx[torch.as_tensor(order)]
        for start in range(0, len(perm) - mbs + 1, mbs):
            mb_inds = perm[start:start + mbs]
            if args.target_kl > 0 and approx_kl(agent, b, mb_inds) > 1.5 * args.target_kl:
                return n_updates, tracin, t_tracin  # the policy left the trust region of theta(k)
            mb_adv = b["advantages"][mb_inds]
            if args.adv_norm == "minibatch":
                mb_adv = normalize(mb_adv)
            if tracin is not None:
                t0 = time.perf_counter()
                precond = None
                if args.influence_precond == "adam":
                    precond = adam_precond(agent, optimizer)
                step_scores = influence(agent, b, mb_inds, target, args, mb_adv, precond)
                t_tracin += time.perf_counter() - t0
            loss = ppo_losses(agent, b, mb_inds, args, adv=mb_adv).mean()
            if not torch.isfinite(loss):
                raise FloatingPointError(
                    f"non-finite PPO loss ({loss.item()}) at epoch {epoch}, step {n_updates}")
            optimizer.zero_grad()
            loss.backward()
            if args.max_grad_norm > 0:
                norm = nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            if tracin is not None:  # weighted by the factor clip_grad_norm_ scaled this step by
                scale = 1.0
                if args.max_grad_norm > 0:
                    scale = min(1.0, args.max_grad_norm / (norm.item() + 1e-6))
                tracin.index_add_(0, mb_inds, scale * step_scores)
            optimizer.step()
            n_updates += 1
    return n_updates, tracin, t_tracin


# ---- Baselines of App. C.4 and C.5, which IIF is compared with (IIF needs none of this) ----


def mc_advantage(states, actions, rewards, dones, gamma):
    """Monte-Carlo advantage from the buffer itself (Sec. 4.1, App. C.4; for discrete observations
    that recur): A_mc(s, a) = mean discounted return after the visits of (s, a) - mean after the
    visits of s. Arrays are (steps, envs); states hold hashable keys. Only finished episodes'
    returns count; a pair never seen in a finished episode gets nan."""
    T, N = rewards.shape
    returns = np.full((T, N), np.nan)
    for e in range(N):
        g, complete = 0.0, False
        for t in reversed(range(T)):
            if dones[t, e]:
                g, complete = 0.0, True
            g = rewards[t, e] + gamma * g
            returns[t, e] = g if complete else np.nan
    q, v = {}, {}
    for s, a, g in zip(states.ravel(), actions.ravel(), returns.ravel()):
        if not np.isnan(g):
            q.setdefault((s, a), []).append(g)
            v.setdefault(s, []).append(g)
    return np.array([np.mean(q[(s, a)]) - np.mean(v[s]) if (s, a) in q else np.nan
                     for s, a in zip(states.ravel(), actions.ravel())]).reshape(T, N)


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


def make_optimizer(agent, args):
    if args.optimizer == "sgd":
        return torch.optim.SGD(agent.parameters(), lr=args.learning_rate)
    return torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)  # SB3's eps


def env_action(agent, action, act_space):
    if agent.continuous:
        return np.clip(action.numpy(), act_space.low, act_space.high)
    return action.numpy()


def evaluate(agent, envs, n_episodes, seed):
    """Test return (App. B.2): mean and std of the undiscounted return of the stochastic policy over
    n_episodes, split evenly across the envs so that short episodes are not over-counted. envpool
    steps only the environments that still owe an episode; gymnasium steps them all."""
    n = envs.num_envs
    quota = np.array([n_episodes // n + (i < n_episodes % n) for i in range(n)])
    done_count, ep_ret, returns = np.zeros(n, dtype=int), np.zeros(n), []
    obs, _ = envs.reset(seed=seed)
    subset = isinstance(envs, EnvpoolVec)  # envpool can step only some of its environments
    while (done_count < quota).any():
        live = np.flatnonzero(done_count < quota) if subset else np.arange(n)
        action = agent.act(torch.as_tensor(obs[live], dtype=torch.float32))
        action = env_action(agent, action, envs.single_action_space)
        if subset:
            obs[live], reward, term, trunc, _ = envs.step(action, live)
        else:
            obs, reward, term, trunc, _ = envs.step(action)
        ep_ret[live] += reward
        for i in live[term | trunc]:
            if done_count[i] < quota[i]:
                returns.append(ep_ret[i])
                done_count[i] += 1
            ep_ret[i] = 0.0
    return float(np.mean(returns)), float(np.std(returns))


# ---- Plumbing: the envpool backend, flag checks and checkpoints ----


class EnvpoolVec:
    """envpool's batched C++ environments behind the gymnasium vector API used here. envpool resets
    a finished environment on its *next* step, which ignores the action and returns reward 0 and the
    first observation: a record that is no transition. This wrapper resets it at once instead, as
    gymnasium's SAME_STEP mode does, so both backends give the buffer the same records.
    reset(seed=s) rebuilds the pool (envpool fixes seeds at creation): environment i then runs on
    seed s + i, as on gymnasium."""

    def __init__(self, env_id, kwargs, num_envs, threads):
        self.env_id, self.kwargs, self.num_envs, self.threads = env_id, kwargs, num_envs, threads
        self.pool = self.make(0)
        space, self.single_action_space = self.pool.observation_space, self.pool.action_space
        # MiniGrid: keep the (7, 7, 3) view, as ImgObsWrapper does
        self.image = isinstance(space, gym.spaces.Dict)
        space = space["image"] if self.image else space
        if len(space.shape) == 2:  # highway's (vehicles, features), flattened as on gymnasium
            space = gym.spaces.Box(-np.inf, np.inf, (int(np.prod(space.shape)),), np.float32)
        self.single_observation_space = space

    def make(self, seed):
        import envpool
        pool = envpool.make(self.env_id, env_type="gymnasium", num_envs=self.num_envs, seed=seed,
                            num_threads=self.threads, **self.kwargs)
        # its spaces have float64 bounds, which gymnasium warns it casts
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pool.observation_space, pool.action_space  # built on first use, then kept
        return pool

    def obs(self, o):
        o = o["image"] if self.image else o
        return o.reshape(len(o), *self.single_observation_space.shape)

    def reset(self, seed=None):
        if seed is not None:
            self.pool = self.make(seed)
        o, info = self.pool.reset()
        return self.obs(o), info

    def step(self, action, env_id=None):
        """Step all environments, or only those in env_id (the returned arrays follow env_id's
        order)."""
        ids = np.arange(self.num_envs) if env_id is None else env_id
        ids = np.asarray(ids, dtype=np.int32)
        o, reward, term, trunc, info = self.pool.step(action, ids)
        o = self.obs(o)
        done = term | trunc
        # the final observation goes to info, the next episode's first one to the caller
        if done.any():
            info["final_obs"] = o.copy()
            o[done] = self.obs(self.pool.reset(ids[done])[0])
        return o, reward, term, trunc, info

    def close(self):
        self.pool.close()


def parse_values(flag, text):
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        fail(f"{flag} takes comma-separated numbers, got {text!r}")


def resolve_args(args):
    """Fill preset values, check every flag and the env's spaces; fail early with the flag's name.
    """
    from gymnasium.error import Error as GymError
    preset = PRESETS.get(args.env_id, DEFAULTS)
    for key in ("total_timesteps", "optimizer", "learning_rate", "filter_p", "eval_episodes"):
        if getattr(args, key) is None:
            setattr(args, key, preset[key])
    if args.min_agreement is None:
        args.min_agreement = preset.get("min_agreement", -1.0)
    args.env_kwargs = preset.get("env_kwargs", {})
    if not 0 < args.filter_p <= 1:
        fail(f"--filter-p must be in (0, 1], got {args.filter_p}")
    for key in ("num_envs", "num_steps", "minibatch_size", "update_epochs", "eval_episodes",
                "eval_every", "threads"):
        if getattr(args, key) < 1:
            fail(f"--{key.replace('_', '-')} must be at least 1, got {getattr(args, key)}")
    if args.target_kl < 0:
        fail(f"--target-kl must be 0 (off) or positive, got {args.target_kl}")
    if not args.learning_rate > 0:
        fail(f"--learning-rate must be positive, got {args.learning_rate}")
    args.batch_size = args.num_steps * args.num_envs
    if args.batch_size % args.minibatch_size:
        fail(f"--minibatch-size {args.minibatch_size} does not divide the buffer size "
             f"--num-steps x --num-envs = {args.batch_size}")
    if args.total_timesteps < args.batch_size or args.total_timesteps % args.batch_size:
        fail(f"--total-timesteps {args.total_timesteps} is not a positive multiple of the buffer "
             f"size --num-steps x --num-envs = {args.batch_size}")
    args.num_rounds = args.total_timesteps // args.batch_size
    if args.influence_precond == "adam" and args.optimizer != "adam":
        fail(f"--influence-precond adam scores the steps Adam takes; --optimizer is "
             f"{args.optimizer} (use --influence-precond none)")
    if not -1 <= args.min_agreement <= 1:
        fail(f"--min-agreement is a cosine in [-1, 1], got {args.min_agreement}")
    if args.influence_mode == "tracin" and not args.save_rounds:
        fail("--influence-mode tracin writes its scores into the round files: add --save-rounds")
    has_envpool = importlib.util.find_spec("envpool") is not None
    ported = "envpool" in PRESETS.get(args.env_id, {})
    if args.env_backend == "auto":
        args.env_backend = "envpool" if ported and has_envpool else "gymnasium"
    elif args.env_backend == "envpool":
        if not has_envpool:
            fail("--env-backend envpool needs the envpool package (pip install envpool), "
                 "or use gymnasium")
        import envpool
        if (args.env_id in PRESETS and not ported) or args.env_id not in envpool.list_all_envs():
            with_port = ", ".join(k for k, v in PRESETS.items() if "envpool" in v)
            fail(f"--env-backend envpool: {args.env_id} has no envpool port with this preset's "
                 f"settings (presets with one: {with_port}); use --env-backend gymnasium")
    if args.eval_envs is None:
        args.eval_envs = args.eval_episodes if args.env_backend == "envpool" else 16
    if args.eval_envs < 1:
        fail(f"--eval-envs must be at least 1, got {args.eval_envs}")
    try:
        if args.env_backend == "envpool":
            env = make_vec(args, 1)
            obs_space, act_space = env.single_observation_space, env.single_action_space
            raw_obs_space = obs_space
        else:
            env = make_env(args.env_id, args.env_kwargs)()
            obs_space, act_space = env.observation_space, env.action_space
            raw_obs_space = env.unwrapped.observation_space
    except (GymError, ImportError) as e:
        fail(f"--env-id {args.env_id!r} cannot be made ({type(e).__name__}: {e}). "
             f"Paper presets: {', '.join(PRESETS)}")
    env.close()
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) not in (1, 3):
        fail(f"--env-id {args.env_id}: observation space {obs_space} is not supported "
             "(Discrete, or a Box of 1 to 3 dimensions)")
    if not (isinstance(act_space, gym.spaces.Discrete) or
            (isinstance(act_space, gym.spaces.Box) and len(act_space.shape) == 1)):
        fail(f"--env-id {args.env_id}: action space {act_space} is not supported "
             "(Discrete, or a 1-D Box)")
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
        n_act = act_space.shape[0] if isinstance(act_space, gym.spaces.Box) else 1
        is_action = isinstance(act_space, gym.spaces.Box) or 0 <= a[0] < act_space.n
        if len(a) != n_act or not is_action:
            fail(f"--target-action {args.target_action!r} is not an action of {act_space}")
        args.target_obs, args.target_act = s, a
    if args.run_name is None:
        if args.resume:
            fail("--resume needs the --run-name of the run to continue")
        args.run_name = f"{args.env_id}__{args.filter_method}__{args.seed}__{int(time.time())}"
    return args


METRICS = ["round", "global_step", "train_return", "test_return_mean", "test_return_std",
           "n_records", "n_kept", "n_dropped", "n_negative", "agreement", "n_updates", "kl",
           "t_rollout", "t_influence", "t_optim", "t_eval"]


# flags a resumed run may change, and the values resolve_args derives from the others
NOT_COMPARED = ("resume", "threads", "runs_dir", "batch_size", "num_rounds", "env_kwargs",
                "target_obs", "target_act")


# flags newer than some saved runs: a config.json without them was made with them off
ADDED_FLAGS = dict(min_agreement=-1.0, influence_precond="none", target_kl=0.0, score_log_std=True)


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


def main(args):
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)  # minibatch shuffling
    gen = torch.Generator().manual_seed(args.seed)  # random filtering
    run_dir = os.path.join(args.runs_dir, args.run_name)
    ckpt = load_checkpoint(run_dir, args)
    os.makedirs(os.path.join(run_dir, "rounds") if args.save_rounds else run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "config.json"), "w") as f:
        json.dump(dataclasses.asdict(args), f, indent=1)

    envs = make_vec(args, args.num_envs)
    eval_envs = make_vec(args, min(args.eval_envs, args.eval_episodes))
    obs_space, act_space = envs.single_observation_space, envs.single_action_space
    agent = Agent(obs_space, act_space)
    optimizer = make_optimizer(agent, args)
    T, N = args.num_steps, args.num_envs

    # --resume: continue after the checkpoint's round; the envs start fresh episodes
    start, rows = 0, []
    if ckpt is not None:
        agent.load_state_dict(ckpt["agent"])
        optimizer.load_state_dict(ckpt["optimizer"])
        torch.set_rng_state(ckpt["torch_rng"])
        rng.bit_generator.state = ckpt["numpy_rng"]
        gen.set_state(ckpt["filter_rng"])
        start = ckpt["round"] + 1
        # rows written after the checkpoint are redone
        with open(os.path.join(run_dir, "metrics.csv")) as f:
            rows = [r for r in csv.DictReader(f) if int(r["round"]) < start]
    metrics_file = open(os.path.join(run_dir, "metrics.csv"), "w", newline="")
    writer = csv.DictWriter(metrics_file, fieldnames=METRICS)
    writer.writeheader()
    writer.writerows(rows)
    metrics_file.flush()
    next_obs, _ = envs.reset(seed=args.seed if start == 0 else args.seed + 100_000 * start)
    ep_ret = np.zeros(N)
    if args.target == "f_action":  # Sec. 3.1: log pi of one chosen (s, a), the same every round
        t_obs = torch.tensor(args.target_obs, dtype=torch.float32).reshape(1, *obs_space.shape)
        if agent.continuous:
            t_act = torch.tensor(args.target_act).reshape(1, -1)
        else:
            t_act = torch.tensor([int(args.target_act[0])])
        action_target = (t_obs, t_act, torch.ones(1))
    print(f"{args.env_id} on {args.env_backend}: {args.num_rounds} rounds of {args.batch_size} "
          f"records, filter {args.filter_method} p={args.filter_p}, {args.optimizer} "
          f"lr={args.learning_rate}, {args.eval_episodes} test episodes every {args.eval_every} "
          f"round(s) -> {run_dir}" + (f" (resumed at round {start})" if start else ""))

    for k in range(start, args.num_rounds):
        # Stage I (Alg. 1): collect the rollout buffer B(k) with the policy at theta(k)
        t0 = time.perf_counter()
        # numpy arrays of shape (steps, envs, ...): cheap per-step writes
        obs = np.zeros((T, N) + obs_space.shape, dtype=np.float32)
        act_dtype = np.float32 if agent.continuous else np.int64
        actions = np.zeros((T, N) + act_space.shape, dtype=act_dtype)
        rewards = np.zeros((T, N), dtype=np.float32)
        terminations = np.zeros((T, N), dtype=bool)
        truncations = np.zeros((T, N), dtype=bool)
        train_returns, truncated = [], []
        for step in range(T):
            obs[step] = next_obs
            action = agent.act(torch.as_tensor(next_obs, dtype=torch.float32))
            actions[step] = action
            next_obs, rewards[step], terminations[step], truncations[step], info = envs.step(
                env_action(agent, action, act_space))
            ep_ret += rewards[step]
            for i in np.flatnonzero(terminations[step] | truncations[step]):
                train_returns.append(ep_ret[i])
                ep_ret[i] = 0.0
                if truncations[step, i] and not terminations[step, i]:
                    truncated.append((step, i, info["final_obs"][i]))
        rollout = dict(obs=obs, actions=actions, rewards=rewards,
                       terminations=terminations.astype(np.float32),
                       dones=(terminations | truncations).astype(np.float32))
        rollout = {key: torch.from_numpy(v) for key, v in rollout.items()}
        # log pi(a|s) and V(s) at theta(k) of all records in one batched pass
        with torch.no_grad():
            logprobs, _, values = agent(rollout["obs"].flatten(0, 1),
                                        rollout["actions"].flatten(0, 1))
        rollout["logprobs"] = logprobs.view(T, N)
        rollout["values"] = values.view(T, N)
        # next_values[t]: V of the state after step t (of the final observation where an episode
        # was truncated)
        last_value = agent.value(torch.as_tensor(next_obs, dtype=torch.float32))
        rollout["next_values"] = torch.cat([rollout["values"][1:], last_value[None]])
        if truncated:
            steps, env_ids, final_obs = zip(*truncated)
            final_obs = torch.as_tensor(np.stack(final_obs), dtype=torch.float32)
            rollout["next_values"][steps, env_ids] = agent.value(final_obs)
        rollout["advantages"], rollout["returns"] = compute_gae(
            rollout["rewards"], rollout["values"], rollout["next_values"],
            rollout["terminations"], rollout["dones"], args.gamma, args.gae_lambda)
        # the buffer B(k): (steps, envs, ...) -> one record per row
        b = {key: v.flatten(0, 1) for key, v in rollout.items()}
        a_raw, a_norm = b["advantages"], normalize(b["advantages"])
        if args.adv_norm == "buffer":  # once over the buffer: scoring and training see one A_hat
            b["advantages"] = a_norm
        t_rollout = time.perf_counter() - t0

        # Stage II (Alg. 1): score every record at theta(k) (Sec. 5.1), filter the bottom records
        t0 = time.perf_counter()
        if args.target == "f_return":  # Sec. 3.1: log pi over B(k), weighted by A_hat
            target = (b["obs"], b["actions"], a_raw if args.target_adv == "raw" else a_norm)
        else:
            target = action_target
        all_records = torch.arange(args.batch_size)
        precond = adam_precond(agent, optimizer) if args.influence_precond == "adam" else None
        scores = influence(agent, b, all_records, target, args, scoring_advantages(b, args),
                           precond)
        if not torch.isfinite(scores).all():
            fail(f"round {k}: non-finite influence scores; lower --learning-rate")
        agreement, p = None, args.filter_p
        if args.target == "f_return" and args.min_agreement > -1:  # is grad f signal or noise?
            agreement = target_agreement(agent, target)
            p = args.filter_p if agreement >= args.min_agreement else 0.0
        kept, n_negative = filter_records(scores, args.filter_method, p, gen, args.filter_ties)
        sample_p = None  # the baselines (App. C.4, C.5) replace the filter
        if args.filter_method in ("adv-error", "adv-product"):
            keys = np.array([o.tobytes() for o in obs.reshape(T * N, -1)]).reshape(T, N)
            a_mc = mc_advantage(keys, actions.reshape(T, N, -1)[..., 0], rewards,
                                terminations | truncations, args.gamma)
            a_hat = (b["returns"] - b["values"]).double()  # the GAE estimate before normalising
            kept = advantage_filter(torch.from_numpy(a_mc.reshape(-1)), a_hat, args.filter_method,
                                    args.filter_p)
        elif args.filter_method == "td-weight":
            sample_p = td_sampling_probs(b, args.gamma)
        t_influence = time.perf_counter() - t0

        # Stage III (Alg. 1): the PPO update on the kept records
        t0 = time.perf_counter()
        theta_k = None
        if args.save_rounds:
            theta_k = {key: v.clone() for key, v in agent.state_dict().items()}
        tracin_target = target if args.influence_mode == "tracin" else None
        try:
            n_updates, tracin, t_tracin = ppo_update(agent, optimizer, b, torch.nonzero(kept)[:, 0],
                                                     args, rng, tracin_target, sample_p)
        except FloatingPointError as e:
            fail(f"round {k}: {e}; lower --learning-rate, or clip gradients with --max-grad-norm")
        t_optim = time.perf_counter() - t0 - t_tracin
        t_influence += t_tracin
        kl = approx_kl(agent, b, all_records)  # how far the round moved the policy, on all of B(k)

        # test the policy at theta(k+1) (App. B.2)
        t0 = time.perf_counter()
        test_mean = test_std = None  # an empty cell: not tested
        if (k + 1) % args.eval_every == 0:
            test_mean, test_std = evaluate(agent, eval_envs, args.eval_episodes, args.seed + 10_000)
        t_eval = time.perf_counter() - t0

        # log the round, save it, then checkpoint (a run killed before this redoes round k)
        train_return = float(np.mean(train_returns)) if train_returns else float("nan")
        row = dict(round=k, global_step=(k + 1) * args.batch_size, train_return=train_return,
                   test_return_mean=test_mean, test_return_std=test_std,
                   n_records=args.batch_size, n_kept=int(kept.sum()), n_dropped=int((~kept).sum()),
                   n_negative=n_negative, agreement=agreement, n_updates=n_updates, kl=kl,
                   t_rollout=t_rollout,
                   t_influence=t_influence, t_optim=t_optim, t_eval=t_eval)
        writer.writerow(row)
        metrics_file.flush()
        if args.save_rounds:
            torch.save(dict(b, round=k, global_step=row["global_step"], state_dict=theta_k,
                            influence=scores, kept=kept, influence_tracin=tracin,
                            target=args.target),
                       os.path.join(run_dir, "rounds", f"round_{k:04d}.pt"))
        save_checkpoint(os.path.join(run_dir, "checkpoint.pt"), dict(
            round=k, agent=agent.state_dict(), optimizer=optimizer.state_dict(),
            torch_rng=torch.get_rng_state(), numpy_rng=rng.bit_generator.state,
            filter_rng=gen.get_state()))
        test = "-" if test_mean is None else f"{test_mean:.3f} +- {test_std:.3f}"
        agree = "" if agreement is None else f" agree {agreement:+.2f}"
        print(f"round {k} [{k + 1}/{args.num_rounds}] step {row['global_step']} "
              f"| train {train_return:.3f} test {test} "
              f"| kept {row['n_kept']}/{args.batch_size} (neg {n_negative}{agree}) "
              f"| s: rollout {t_rollout:.2f} influence {t_influence:.2f} optim {t_optim:.2f} "
              f"eval {t_eval:.2f}", flush=True)
    torch.save(agent.state_dict(), os.path.join(run_dir, "agent.pt"))
    metrics_file.close()
    envs.close()
    eval_envs.close()


if __name__ == "__main__":
    torch.distributions.Distribution.set_default_validate_args(False)  # checks slow the rollout
    args = resolve_args(tyro.cli(Args))
    try:
        main(args)
    except KeyboardInterrupt:
        run_dir = os.path.join(args.runs_dir, args.run_name)
        sys.exit(f"\ninterrupted: every finished round is in {run_dir}/metrics.csv; "
                 "the same command with --resume continues the run")
