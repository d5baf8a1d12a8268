"""PPO with local data attribution and Iterative Influence-based Filtering (IIF), in one file.

An annotated companion to "A Snapshot of Influence: A Local Data Attribution Framework for Online
Reinforcement Learning" (Hu, Wu et al., NeurIPS 2025). Each round k collects a rollout buffer B(k)
with the policy at theta(k), scores every record by its influence on a target function, drops the
most harmful records and runs the ordinary PPO update on the rest (Alg. 1).

    python iif.py --env-id FrozenLake-v1    # about a minute on one CPU core
    python iif.py --env-id Acrobot-v1 --filter-method none    # standard PPO

On an environment outside the paper, IIF filters only the rounds whose target gradient agrees
across the buffer (--min-agreement 0.5): filtering every round, as the paper does, slowed or
destabilised three of the four other environments we tried. With the guard, IIF stays close to
standard PPO there, and on one (MiniGrid-DoorKey-5x5) still slightly behind (docs/results.md).

Read top to bottom: the config, the environment and the agent, the pieces of Alg. 1 in the order
it uses them, and main, its loop; below a marked line, what a first reading may skip.
"""
import collections
import contextlib
import csv
import dataclasses
import importlib.util
import json
import math
import os
import sys
import time
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
    "highway-v0": dict(  # clipped at 0.5, as App. B.2 says: the released code has no highway-v0
        total_timesteps=204_800, optimizer="sgd", learning_rate=5e-3, filter_p=0.5,
        eval_episodes=100, max_grad_norm=0.5, envpool=dict(vehicles_count=10),
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
    # The paper's settings (App. B.2). None: the env's preset (listed by --help), or DEFAULTS
    env_id: str = "Acrobot-v1"
    """gymnasium id: a paper preset, or any env with Box/Discrete spaces (see --min-agreement)"""
    total_timesteps: Optional[int] = None
    """environment steps of training, a multiple of num-steps x num-envs (None: the preset's)"""
    optimizer: Optional[Literal["sgd", "adam"]] = None
    """sgd (TracIn's setting) or adam (None: the preset's)"""
    learning_rate: Optional[float] = None
    """optimizer learning rate (None: the preset's)"""
    filter_p: Optional[float] = None
    """fraction p in (0, 1] of the negative-influence records dropped each round (None: preset's)"""
    eval_episodes: Optional[int] = None
    """test episodes after every tested round (None: the preset's)"""
    filter_method: Literal[
        "influence", "random", "none", "adv-error", "adv-product", "td-weight"] = "influence"
    """influence: IIF; random: drop as many records at random; none: standard PPO; the baselines
    adv-error, adv-product (App. C.4, for discrete observations) and td-weight (App. C.5)"""
    target: Literal["f_return", "f_action"] = "f_return"
    """target function the influence is measured on (Sec. 3.1)"""
    target_state: Optional[str] = None
    """f_action's state: comma-separated observation values (an index for a Discrete observation)"""
    target_action: Optional[str] = None
    """f_action's action: an index, or comma-separated values for a Box action"""
    influence_mode: Literal["snapshot", "tracin"] = "snapshot"
    """snapshot: score at theta(k) (Sec. 5.1); tracin: also sum over the round's steps (Sec. 3.1)"""
    num_envs: int = 1
    """parallel environments collecting the buffer"""
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

    # The released code's choices where the paper is silent or differs (docs/method.md)
    max_grad_norm: Optional[float] = None
    """gradient-norm clip, 0: none (None: the preset's: 0, the released code, on every env but
    highway-v0, where it is App. B.2's 0.5; docs/method.md)"""
    adv_norm: Literal["minibatch", "buffer", "none"] = "minibatch"
    """A_hat in training: normalised per minibatch after filtering (the released code, SB3), once
    over the buffer before filtering, or raw"""
    target_adv: Literal["raw", "normalized"] = "raw"
    """f_return's weights: raw GAE estimates A_hat (the paper, the released code), or normalised"""
    influence_loss: Literal["policy", "full"] = "policy"
    """l_i inside the influence: its policy terms (the released code), or the full PPO loss"""
    score_log_std: bool = True
    """include a Gaussian policy's log-std in the influence (the released scorer left it out)"""
    filter_ties: Literal["keep", "drop"] = "keep"
    """records tied with the cut: keep them (the released code), or drop exactly floor(p x n_neg)"""
    reseed_rounds: bool = False
    """start every round's rollout from env.reset(seed) and torch's seed, as the released
    LunarLander and MiniGrid IIF scripts do (a process per round); off: episodes run on"""

    # Beyond the paper (off on its presets; docs/usage.md)
    min_agreement: Optional[float] = None
    """filter a round only if f_return's gradient agrees across 8 slices of B(k) (mean cosine at
    least this); -1: always, as the paper (None: the preset's: -1 on its envs; 0.5 on others,
    where filtering every round slowed IIF: README, "On your own environment")"""
    influence_precond: Literal["none", "adam"] = "none"
    """score a record's gradient (an SGD step, the paper's), or the step Adam takes (needs adam)"""
    target_kl: float = 0.0
    """SB3's early stop: end a round's update once a minibatch's KL(pi_theta(k) || pi_theta) passes
    1.5 x this; 0: off (the paper, the released code)"""

    # Run options
    seed: int = 1
    """seed of torch, numpy, the environments and the filter"""
    run_name: Optional[str] = None
    """results go to <runs-dir>/<run-name>/ (default: env__method__seed__time)"""
    runs_dir: str = "runs"
    """parent folder of the run folders"""
    save_rounds: bool = False
    """also write <run>/rounds/round_KKKK.pt: theta(k) and the scored buffer B(k) of every round"""
    resume: bool = False
    """continue <runs-dir>/<run-name> after its last finished round (checkpoint.pt), same flags"""
    eval_every: int = 1
    """test after every N-th round only (rounds N-1, 2N-1, ...; the others leave the test empty).
    Test episodes sample from the training's torch RNG, so N also changes the rounds after a test"""
    threads: int = 1
    """torch CPU threads (small networks run fastest on one), and envpool's threads"""
    env_backend: Literal["auto", "gymnasium", "envpool"] = "auto"
    """gymnasium (the paper's), envpool (C++ ports, iif_envpool.py) or auto: envpool where ported"""
    async_envs: bool = False
    """step the environments in subprocesses (pays off only for slow envs such as highway)"""
    eval_envs: Optional[int] = None
    """parallel test environments (None: one per episode on envpool, 16 on gymnasium)"""

    # filled in by resolve_args (not flags): num-steps x num-envs, total-timesteps / batch-size,
    # the preset's gym.make keyword arguments, f_action's state and action as vectors
    batch_size: tyro.conf.Suppress[int] = 0
    num_rounds: tyro.conf.Suppress[int] = 0
    env_kwargs: tyro.conf.Suppress[dict] = dataclasses.field(default_factory=dict)
    target_obs: tyro.conf.Suppress[Optional[list]] = None
    target_act: tyro.conf.Suppress[Optional[list]] = None


# ---- The environment and the agent (App. B.2) ----
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
    if args.env_backend == "envpool":  # batched C++ ports, in the optional iif_envpool.py
        from iif_envpool import EnvpoolVec
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


def env_action(agent, action, act_space):
    if agent.continuous:
        return np.clip(action.numpy(), act_space.low, act_space.high)
    return action.numpy()


# ---- Stage I of Alg. 1: the rollout buffer B(k) and its advantages (Sec. 2.1) ----
def collect_rollout(agent, envs, next_obs, ep_ret, args):
    """num-steps steps of every env with the policy at theta(k); then log pi(a|s), V(s) and the GAE
    advantages of the records. Returns B(k), one record per row (record t * num_envs + e is step t
    of env e), the next observation, and the mean return of the episodes that ended (nan if none);
    ep_ret carries the returns of the episodes under way into the next round."""
    T, N, act_space = args.num_steps, args.num_envs, envs.single_action_space
    # numpy arrays of shape (steps, envs, ...): cheap per-step writes
    obs = np.zeros((T, N) + envs.single_observation_space.shape, dtype=np.float32)
    actions = np.zeros((T, N) + act_space.shape, dtype=np.float32 if agent.continuous else np.int64)
    rewards = np.zeros((T, N), dtype=np.float32)
    terminations, truncations = np.zeros((T, N), dtype=bool), np.zeros((T, N), dtype=bool)
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
    r = dict(obs=obs, actions=actions, rewards=rewards,
             terminations=terminations.astype(np.float32),
             dones=(terminations | truncations).astype(np.float32))
    r = {key: torch.from_numpy(v) for key, v in r.items()}
    # log pi(a|s) and V(s) at theta(k) of all records in one batched pass
    with torch.no_grad():
        logprobs, _, values = agent(r["obs"].flatten(0, 1), r["actions"].flatten(0, 1))
    r["logprobs"], r["values"] = logprobs.view(T, N), values.view(T, N)
    # next_values[t]: V of the state after step t (of the final observation where an episode was
    # truncated)
    last_value = agent.value(torch.as_tensor(next_obs, dtype=torch.float32))
    r["next_values"] = torch.cat([r["values"][1:], last_value[None]])
    if truncated:
        steps, env_ids, final_obs = zip(*truncated)
        final_obs = torch.as_tensor(np.stack(final_obs), dtype=torch.float32)
        r["next_values"][steps, env_ids] = agent.value(final_obs)
    r["advantages"], r["returns"] = compute_gae(
        r["rewards"], r["values"], r["next_values"], r["terminations"], r["dones"], args.gamma,
        args.gae_lambda)
    train_return = float(np.mean(train_returns)) if train_returns else float("nan")
    return {key: v.flatten(0, 1) for key, v in r.items()}, next_obs, train_return


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


# ---- Stage II of Alg. 1: the target function, the influence of every record, the filter ----
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


def make_target(agent, b, args):
    """The records and weights of the target function (Sec. 3.1): f_return: every record of B(k),
    weighted by its A_hat (pi_ref = pi_theta(k)); f_action: the one chosen (s, a), weight 1."""
    if args.target == "f_return":
        a_hat = b["advantages"]  # the raw GAE estimates, before any normalisation
        return b["obs"], b["actions"], a_hat if args.target_adv == "raw" else normalize(a_hat)
    t_obs = torch.tensor(args.target_obs, dtype=torch.float32).reshape(1, *b["obs"].shape[1:])
    if agent.continuous:
        return t_obs, torch.tensor(args.target_act).reshape(1, -1), torch.ones(1)
    return t_obs, torch.tensor([int(args.target_act[0])]), torch.ones(1)


def target_fn(agent, params, t_obs, t_actions, t_weights):
    """Target functions (Sec. 3.1) share one form, f(theta) = mean_j w_j log pi_theta(a_j | s_j)."""
    logp, _, _ = functional_call(agent, params, (t_obs, t_actions), {"critic": False})
    return (logp * t_weights).mean()


def target_grad(agent, params, target):
    """grad f at params, {name: gradient}, for the parameters f reaches (a separate critic has none)
    """
    grads = torch.autograd.grad(target_fn(agent, params, *target), list(params.values()),
                                allow_unused=True)
    return {k: g for k, g in zip(params, grads) if g is not None}


def scoring_advantages(b, args):
    """The A_hat of each record inside l_i when it is scored at theta(k). With --adv-norm minibatch,
    the buffer's normalisation: the expected statistics of the minibatches the record will meet (the
    released scorer used those of its first-epoch minibatch)."""
    return normalize(b["advantages"]) if args.adv_norm == "minibatch" else b["advantages"]


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


# ---- Stage III of Alg. 1: the ordinary PPO update on the kept records ----
def make_optimizer(agent, args):
    if args.optimizer == "sgd":
        return torch.optim.SGD(agent.parameters(), lr=args.learning_rate)
    return torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)  # SB3's eps


def ppo_update(agent, optimizer, b, kept_idx, args, rng, target=None, sample_p=None):
    """The usual PPO epochs, over the kept records only. Minibatches keep their size; when it does
    not divide the kept count, each epoch's (reshuffled) remainder is skipped, as in the authors'
    code, so a filtered round takes fewer optimizer steps. --adv-norm minibatch normalises each
    minibatch's advantages here, after filtering. Returns the optimizer steps taken and, with a
    target, the TracIn influence of Sec. 3.1, summed over every step whose minibatch holds the
    record, each step's scores weighted by the factor clipping scaled that step by, so they add up
    as the steps do. With sample_p (App. C.5), each epoch draws its records with these
    probabilities, with replacement."""
    mbs = args.minibatch_size
    tracin = None if target is None else torch.zeros_like(b["advantages"])
    n_updates = 0
    for epoch in range(args.update_epochs):
        if sample_p is None:
            order = rng.permutation(len(kept_idx))
        else:  # App. C.5 td-weight: records drawn by TD-error rank, with replacement
            order = rng.choice(len(kept_idx), size=len(kept_idx), p=sample_p)
        perm = kept_idx[torch.as_tensor(order)]
        for start in range(0, len(perm) - mbs + 1, mbs):
            mb_inds = perm[start:start + mbs]
            if args.target_kl > 0 and approx_kl(agent, b, mb_inds) > 1.5 * args.target_kl:
                return n_updates, tracin  # the policy left the trust region of theta(k)
            mb_adv = b["advantages"][mb_inds]
            if args.adv_norm == "minibatch":
                mb_adv = normalize(mb_adv)
            if tracin is not None:  # this step's influence at its theta, timed as influence
                with timed("t_influence", inside="t_optim"):
                    step_scores = influence(agent, b, mb_inds, target, args, mb_adv,
                                            step_precond(agent, optimizer, args))
            loss = ppo_losses(agent, b, mb_inds, args, adv=mb_adv).mean()
            if not torch.isfinite(loss):
                raise FloatingPointError(
                    f"non-finite PPO loss ({loss.item()}) at epoch {epoch}, step {n_updates}; "
                    "lower --learning-rate, or clip gradients with --max-grad-norm")
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
    return n_updates, tracin


def evaluate(agent, envs, n_episodes, seed):
    """Test return (App. B.2): mean and std of the undiscounted return of the stochastic policy over
    n_episodes, split evenly across the envs so that short episodes are not over-counted. envpool
    steps only the environments that still owe an episode; gymnasium steps them all."""
    n = envs.num_envs
    quota = np.array([n_episodes // n + (i < n_episodes % n) for i in range(n)])
    done_count, ep_ret, returns = np.zeros(n, dtype=int), np.zeros(n), []
    obs, _ = envs.reset(seed=seed)
    subset = not isinstance(envs, gym.vector.VectorEnv)  # envpool's can step only some envs
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


# ---- The loop of Alg. 1 ----
def main(args):
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)  # minibatch shuffling
    gen = torch.Generator().manual_seed(args.seed)  # random filtering
    envs = make_vec(args, args.num_envs)
    eval_envs = make_vec(args, min(args.eval_envs, args.eval_episodes))
    agent = Agent(envs.single_observation_space, envs.single_action_space)
    optimizer = make_optimizer(agent, args)
    run = Run(args, agent, optimizer, rng, gen)  # the run folder; --resume restores its last round
    next_obs, _ = envs.reset(seed=args.seed + 100_000 * run.start)  # a resumed run: new episodes
    ep_ret = np.zeros(args.num_envs)  # the returns of the episodes under way
    all_records = torch.arange(args.batch_size)
    try:
        for k in range(run.start, args.num_rounds):
            seconds.clear()  # the round's t_* columns
            if args.reseed_rounds:  # --reseed-rounds: the released scripts' fresh start
                next_obs = reseed_round(envs, ep_ret, args)
            # Stage I (Alg. 1): collect the rollout buffer B(k) with the policy at theta(k)
            with timed("t_rollout"):
                b, next_obs, train_return = collect_rollout(agent, envs, next_obs, ep_ret, args)

            # Stage II (Alg. 1): score every record at theta(k) (Sec. 5.1), filter the bottom ones
            with timed("t_influence"):
                target = make_target(agent, b, args)
                if args.adv_norm == "buffer":  # once over B(k): scoring and training see one A_hat
                    b["advantages"] = normalize(b["advantages"])
                precond = step_precond(agent, optimizer, args)
                scores = influence(agent, b, all_records, target, args, scoring_advantages(b, args),
                                   precond)
                if not torch.isfinite(scores).all():
                    raise FloatingPointError("non-finite influence scores; lower --learning-rate")
                agreement, p = agreement_guard(agent, target, args)  # --min-agreement
                kept, n_negative = filter_records(scores, args.filter_method, p, gen,
                                                  args.filter_ties)
                kept, sample_p = baseline_filter(b, kept, args)  # App. C replaces the filter

            # Stage III (Alg. 1): the ordinary PPO update on the kept records
            theta_k = None  # theta(k), kept for the round file of --save-rounds
            if args.save_rounds:
                theta_k = {key: v.clone() for key, v in agent.state_dict().items()}
            with timed("t_optim"):
                n_updates, tracin = ppo_update(
                    agent, optimizer, b, torch.nonzero(kept)[:, 0], args, rng,
                    target if args.influence_mode == "tracin" else None, sample_p)

            # test the policy at theta(k+1) (App. B.2); the rounds not tested leave it empty
            with timed("t_eval"):
                test = (None, None)
                if (k + 1) % args.eval_every == 0:
                    test = evaluate(agent, eval_envs, args.eval_episodes, args.seed + 10_000)

            row = dict(round=k, global_step=(k + 1) * args.batch_size, train_return=train_return,
                       test_return_mean=test[0], test_return_std=test[1],
                       n_records=args.batch_size, n_kept=int(kept.sum()),
                       n_dropped=int((~kept).sum()), n_negative=n_negative, agreement=agreement,
                       n_updates=n_updates, kl=approx_kl(agent, b, all_records), **seconds)
            run.end_round(row, dict(b, round=k, global_step=row["global_step"], state_dict=theta_k,
                                    influence=scores, kept=kept, influence_tracin=tracin,
                                    target=args.target))
    except FloatingPointError as e:
        fail(f"round {k}: {e}")
    run.finish(agent)
    envs.close()
    eval_envs.close()


# =================================================================================================
# Everything Alg. 1 needs stands above. Below, what a first reading may skip: options beyond the
# paper, the baselines of App. C, and the plumbing (flag checks; the run folder with metrics.csv,
# --save-rounds and --resume). The envpool backend is in iif_envpool.py.
# =================================================================================================


# ---- Options beyond the paper: --min-agreement, --influence-precond adam, --target-kl ----
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


def agreement_guard(agent, target, args):
    """--min-agreement: (f_return's agreement, None where not computed; this round's p, 0 where
    grad f is noise)"""
    if args.target != "f_return" or args.min_agreement <= -1:
        return None, args.filter_p
    agreement = target_agreement(agent, target)
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


def reseed_round(envs, ep_ret, args):
    """--reseed-rounds: the released code runs each IIF round as a new process seeded alike, so
    every round draws the same action noise and resets the envs to the same episodes (its
    standard PPO runs on). Returns the first observation."""
    torch.manual_seed(args.seed)
    ep_ret[:] = 0.0
    return envs.reset(seed=args.seed)[0]


@torch.no_grad()
def approx_kl(agent, b, idx):
    """KL(pi_theta(k) || pi_theta) estimated on records idx, whose actions pi_theta(k) sampled:
    the mean of (r - 1) - log r, r = pi_theta(a|s) / pi_theta(k)(a|s) (unbiased, never negative)."""
    logratio = agent(b["obs"][idx], b["actions"][idx], critic=False)[0] - b["logprobs"][idx]
    return float((logratio.exp() - 1 - logratio).mean())


# ---- Baselines of App. C.4 and C.5, which IIF is compared with (IIF needs none of this) ----
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


# ---- Plumbing: the flags ----
def fail(msg):
    raise SystemExit(f"iif.py: error: {msg}")


def resolve_args(args):
    """Fill in the env's preset and the sizes, and check every flag and the env's spaces: bad input
    stops here, before anything is written, with the flag's name."""
    preset = PRESETS.get(args.env_id, DEFAULTS)
    for key in ("total_timesteps", "optimizer", "learning_rate", "filter_p", "eval_episodes"):
        if getattr(args, key) is None:
            setattr(args, key, preset[key])
    if args.min_agreement is None:
        args.min_agreement = preset.get("min_agreement", -1.0)
    if args.max_grad_norm is None:
        args.max_grad_norm = preset.get("max_grad_norm", 0.0)
    args.env_kwargs = preset.get("env_kwargs", {})
    if not 0 < args.filter_p <= 1:
        fail(f"--filter-p must be in (0, 1], got {args.filter_p}")
    for key in ("num_envs", "num_steps", "minibatch_size", "update_epochs", "eval_episodes",
                "eval_every", "threads"):
        if getattr(args, key) < 1:
            fail(f"--{key.replace('_', '-')} must be at least 1, got {getattr(args, key)}")
    if args.max_grad_norm < 0:
        fail(f"--max-grad-norm must be 0 (no clipping) or positive, got {args.max_grad_norm}")
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
    choose_backend(args)
    check_env(args)
    if args.run_name is None:
        if args.resume:
            fail("--resume needs the --run-name of the run to continue")
        args.run_name = f"{args.env_id}__{args.filter_method}__{args.seed}__{int(time.time())}"
    return args


def choose_backend(args):
    """envpool needs its package, iif_envpool.py beside iif.py and a port of the env with the
    preset's settings; auto takes it where a preset has one"""
    has_envpool = all(importlib.util.find_spec(m) for m in ("envpool", "iif_envpool"))
    ported = "envpool" in PRESETS.get(args.env_id, {})
    if args.env_backend == "auto":
        args.env_backend = "envpool" if ported and has_envpool else "gymnasium"
    elif args.env_backend == "envpool":
        if not has_envpool:
            fail("--env-backend envpool needs the envpool package (pip install envpool) and "
                 "iif_envpool.py beside iif.py, or use gymnasium")
        import envpool
        if (args.env_id in PRESETS and not ported) or args.env_id not in envpool.list_all_envs():
            with_port = ", ".join(k for k, v in PRESETS.items() if "envpool" in v)
            fail(f"--env-backend envpool: {args.env_id} has no envpool port with this preset's "
                 f"settings (presets with one: {with_port}); use --env-backend gymnasium")
    if args.eval_envs is None:
        args.eval_envs = args.eval_episodes if args.env_backend == "envpool" else 16
    if args.eval_envs < 1:
        fail(f"--eval-envs must be at least 1, got {args.eval_envs}")


def check_env(args):
    """One env of --env-id: its spaces must suit the agent, f_action's state and action them."""
    from gymnasium.error import Error as GymError
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
    discrete = isinstance(act_space, gym.spaces.Discrete)
    if not (discrete or (isinstance(act_space, gym.spaces.Box) and len(act_space.shape) == 1)):
        fail(f"--env-id {args.env_id}: action space {act_space} is not supported "
             "(Discrete, or a 1-D Box)")
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


def parse_values(flag, text):
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        fail(f"{flag} takes comma-separated numbers, got {text!r}")


def presets_help():
    """--help's opening: the values each preset gives the flags left at None"""
    presets = {**PRESETS, "other envs": DEFAULTS}
    lines = [f"- {env}: {p['total_timesteps']} steps, {p['optimizer']} lr {p['learning_rate']}, "
             f"p {p['filter_p']}, {p['eval_episodes']} test episodes, min-agreement "
             f"{p.get('min_agreement', -1)}, max-grad-norm {p.get('max_grad_norm', 0)}"
             for env, p in presets.items()]
    head = [__doc__.split("\n")[0], "", "Presets (App. B.1-B.2) of the flags left at None:"]
    return "\n".join(head + lines)


# ---- Plumbing: the run folder (config.json, metrics.csv, round files, --resume) and timing ----
METRICS = ["round", "global_step", "train_return", "test_return_mean", "test_return_std",
           "n_records", "n_kept", "n_dropped", "n_negative", "agreement", "n_updates", "kl",
           "t_rollout", "t_influence", "t_optim", "t_eval"]


# flags a resumed run may change, and the values resolve_args derives from the others
NOT_COMPARED = ("resume", "threads", "runs_dir", "batch_size", "num_rounds", "env_kwargs",
                "target_obs", "target_act")


# flags newer than some saved runs: a config.json without them was made with them off
ADDED_FLAGS = dict(min_agreement=-1.0, influence_precond="none", target_kl=0.0, score_log_std=True,
                   reseed_rounds=False)


class Run:
    """<runs-dir>/<run-name>/: config.json, metrics.csv (a row per round), rounds/round_KKKK.pt
    (--save-rounds), checkpoint.pt (the state after the last finished round) and agent.pt."""

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
        if ckpt is not None:
            agent.load_state_dict(ckpt["agent"])
            optimizer.load_state_dict(ckpt["optimizer"])
            torch.set_rng_state(ckpt["torch_rng"])
            rng.bit_generator.state = ckpt["numpy_rng"]
            gen.set_state(ckpt["filter_rng"])
            self.start = ckpt["round"] + 1
            with open(os.path.join(self.dir, "metrics.csv")) as f:  # rows after it are redone
                rows = [r for r in csv.DictReader(f) if int(r["round"]) < self.start]
        self.file = open(os.path.join(self.dir, "metrics.csv"), "w", newline="")
        self.writer = csv.DictWriter(self.file, fieldnames=METRICS)
        self.writer.writeheader()
        self.writer.writerows(rows)
        self.file.flush()
        print(f"{args.env_id} on {args.env_backend}: {args.num_rounds} rounds of {args.batch_size} "
              f"records, filter {args.filter_method} p={args.filter_p}, {args.optimizer} "
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
        save_checkpoint(os.path.join(self.dir, "checkpoint.pt"), dict(
            round=k, agent=agent.state_dict(), optimizer=optimizer.state_dict(),
            torch_rng=torch.get_rng_state(), numpy_rng=rng.bit_generator.state,
            filter_rng=gen.get_state()))
        test = "-"
        if row["test_return_mean"] is not None:
            test = f"{row['test_return_mean']:.3f} +- {row['test_return_std']:.3f}"
        agree = "" if row["agreement"] is None else f" agree {row['agreement']:+.2f}"
        print(f"round {k} [{k + 1}/{a.num_rounds}] step {row['global_step']} "
              f"| train {row['train_return']:.3f} test {test} "
              f"| kept {row['n_kept']}/{a.batch_size} (neg {row['n_negative']}{agree}) "
              f"| s: rollout {row['t_rollout']:.2f} influence {row['t_influence']:.2f} "
              f"optim {row['t_optim']:.2f} eval {row['t_eval']:.2f}", flush=True)

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
    args = resolve_args(tyro.cli(Args, description=presets_help()))
    try:
        main(args)
    except KeyboardInterrupt:
        run_dir = os.path.join(args.runs_dir, args.run_name)
        sys.exit(f"\ninterrupted: every finished round is in {run_dir}/metrics.csv; "
                 "the same command with --resume continues the run")
