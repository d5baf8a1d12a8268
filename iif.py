"""PPO with local data attribution and Iterative Influence-based Filtering (IIF), in one file.

A companion to "A Snapshot of Influence: A Local Data Attribution Framework for Online Reinforcement
Learning" (Hu, Wu et al., NeurIPS 2025). Alg. 1, in rounds k = 0, 1, ...: (I) collect a rollout
buffer B(k) with the policy at theta(k); (II) score every record by its influence on the target f_return
at theta(k) and drop the bottom p of the negatively scored ones; (III) run the ordinary PPO update on the
rest. Read top to bottom: presets and flags, env and agent, Stages I-III, the test, and main, the loop.

    python iif.py --env-id Acrobot-v1                         # IIF with the paper's preset
    python iif.py --env-id Acrobot-v1 --filter-method none    # standard PPO

research/iif_variants.py adds the released code's switches, App. C's baselines, TracIn, f_action, --resume.
"""
import csv
import dataclasses
import importlib.util
import json
import math
import os
import re
import sys
import time
from typing import Annotated, Literal, Optional

os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")  # highway-env imports pygame
import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.distributions import Categorical, Independent, Normal
from torch.func import functional_call, jvp

torch.distributions.Distribution.set_default_validate_args(False)  # faster steps; losses, scores are checked
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "research"))  # iif_envpool.py, optional
SGD = dict(optimizer="sgd", learning_rate=5e-3)  # TracIn's setting, on all but BipedalWalker
PORT = dict(envpool={}, auto=("gymnasium", "envpool"))  # port's kwargs; auto: Stage I's, test's fastest backend
PRESETS = {  # App. B.2: each env's budget, optimizer, test episodes; App. C.6: the filter p
    "FrozenLake-v1": dict(**SGD, total_timesteps=102_400, filter_p=0.5, eval_episodes=1000,
                          env_kwargs=dict(map_name="4x4", is_slippery=False)),
    "MiniGrid-Empty-8x8-v0": dict(**SGD, **PORT, total_timesteps=81_920, filter_p=0.125, eval_episodes=1000),
    "Acrobot-v1": dict(**SGD, **PORT, total_timesteps=102_400, filter_p=0.5, eval_episodes=1000),
    "highway-v0": dict(  # App. B.2 clips at 0.5 everywhere, the release (no highway) nowhere: here only
        **SGD, total_timesteps=204_800, filter_p=0.5, eval_episodes=100, max_grad_norm=0.5, auto=("envpool",) * 2,
        envpool=dict(vehicles_count=10), env_kwargs=dict(config=dict(  # a misspelt key is silently ignored
            vehicles_count=10, observation=dict(type="Kinematics"), action=dict(type="DiscreteMetaAction")))),
    "LunarLander-v3": dict(**SGD, **PORT, total_timesteps=307_200, filter_p=0.125, eval_episodes=1000),
    "BipedalWalker-v3": dict(**PORT, total_timesteps=1_024_000, optimizer="adam", learning_rate=3e-4,
                             filter_p=0.0625, eval_episodes=100),
}
# any other env: SB3's PPO defaults, 50 rounds, no filter (filtering every round slowed DoorKey: docs/usage.md)
DEFAULTS = dict(total_timesteps=102_400, optimizer="adam", learning_rate=3e-4, filter_p=0.5,
                eval_episodes=100, filter_method="none")
OUTSIDE = dict(  # what an env without a preset prints (docs/usage.md, "Your own environment")
    none="not a paper env: standard PPO (--filter-method influence filters)", random="not a paper env: random filter",
    influence="not a paper env: IIF filters every round, as Alg. 1 (what it did on CartPole, DoorKey: docs/usage.md)")


def preset_of(env_id):
    return {"filter_method": "influence", "max_grad_norm": 0.0, **PRESETS.get(env_id, DEFAULTS)}


def by_preset(key):  # --help's default of a flag each env's preset sets
    values = ", ".join(f"{env.split('-')[0]} {preset_of(env)[key]}" for env in PRESETS)
    return tyro.conf.arg(help_behavior_hint=f"(default: {values}; other envs {preset_of(None)[key]})")


@dataclasses.dataclass
class Args:
    env_id: str = "Acrobot-v1"
    """gymnasium id (or module:id): a paper preset or any Box/Discrete env; 1000 steps if it has no time limit"""
    total_timesteps: Annotated[Optional[int], by_preset("total_timesteps")] = None
    """environment steps of training, a multiple of num-steps x num-envs"""
    optimizer: Annotated[Optional[Literal["sgd", "adam"]], by_preset("optimizer")] = None
    """sgd (TracIn's setting) or adam"""
    learning_rate: Annotated[Optional[float], by_preset("learning_rate")] = None
    """optimizer learning rate"""
    filter_p: Annotated[Optional[float], by_preset("filter_p")] = None
    """fraction p in (0, 1] of the negative-influence records dropped each round"""
    eval_episodes: Annotated[Optional[int], by_preset("eval_episodes")] = None
    """test episodes after every round"""
    filter_method: Annotated[Optional[Literal["influence", "random", "none"]], by_preset("filter_method")] = None
    """influence: IIF; random: drop as many records at random; none: standard PPO (scored, none dropped)"""
    max_grad_norm: Annotated[Optional[float], by_preset("max_grad_norm")] = None
    """gradient-norm clip; 0: none (App. B.2 lists 0.5, the released code clips none; here 0.5 on highway only)"""
    num_envs: int = 1
    """parallel environments collecting the buffer"""
    num_steps: int = 2048
    """steps per environment per round; the buffer holds num-steps x num-envs records"""
    minibatch_size: int = 64
    """records per optimizer step"""
    update_epochs: int = 10
    """passes over the kept records per round"""
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
    seed: int = 1
    """seed of torch, numpy, the environments and the random filter"""
    exp_name: Annotated[Optional[str], tyro.conf.arg(help_behavior_hint="(default: the filter method)")] = None
    """the experiment's name, in the run's (CleanRL's pattern)"""
    run_name: Annotated[Optional[str], tyro.conf.arg(
        help_behavior_hint="(default: <env-id>__<exp-name>__<seed>__<time>)")] = None
    """results go to <runs-dir>/<run-name>/"""
    runs_dir: str = "runs"
    """parent folder of the run folders"""
    save_rounds: bool = False
    """also write <run>/rounds/round_KKKK.pt: theta(k) and the scored buffer B(k) of every round"""
    env_backend: Literal["auto", "gymnasium", "envpool"] = "auto"
    """both stages on gymnasium (the paper's envs) or envpool (C++ ports, research/iif_envpool.py); auto: Stage I on
    the paper's env (but highway's port), the test episodes on envpool where ported (docs/backends.md)"""
    cuda: bool = True
    """run the agent on CUDA where there is a GPU (else the CPU)"""
    torch_deterministic: bool = True
    """torch.backends.cudnn.deterministic"""
    track: bool = False
    """also log to Weights & Biases, syncing the TensorBoard scalars (pip install wandb)"""
    wandb_project_name: str = "iif"
    """the wandb project"""
    wandb_entity: Annotated[Optional[str], tyro.conf.arg(help_behavior_hint="(default: yours)")] = None
    """the wandb entity (team)"""
    capture_video: bool = False
    """record a test episode to videos/<run-name>/ every tenth of the rounds (pip install moviepy)"""
    save_model: bool = False
    """save the agent's state_dict to <run>/iif.cleanrl_model, as CleanRL (so does --save-rounds), and test it"""
    eval_model: Annotated[Optional[str], tyro.conf.arg(help_behavior_hint="(default: train)")] = None
    """no training: test a saved iif.cleanrl_model on its run's env (--eval-episodes, --capture-video)"""
    batch_size: tyro.conf.Suppress[int] = 0  # this, num_rounds and backends (Stage I's, the test's): filled in by
    num_rounds: tyro.conf.Suppress[int] = 0  # resolve_args, not flags
    backends: tyro.conf.Suppress[tuple] = ()


# ---- The environment and the agent (App. B.1, B.2) ----
def make_env(env_id, render_mode=None):  # a thunk: an env observing a flat float vector or an (H, W, C) image
    def thunk():
        for module in ("minigrid", "highway_env"):  # they register their ids on import
            if env_id not in gym.registry and importlib.util.find_spec(module):
                importlib.import_module(module)
        frames = {"render_mode": render_mode} if render_mode else {}  # not every env takes the keyword
        env = gym.make(env_id, **frames, **PRESETS.get(env_id, {}).get("env_kwargs", {}))
        if env.spec is None or env.spec.max_episode_steps is None:  # else a policy may never stop
            env = gym.wrappers.TimeLimit(env, 1000)
        if env_id.startswith("MiniGrid"):
            from minigrid.wrappers import ImgObsWrapper
            env = ImgObsWrapper(env)  # the 7x7x3 egocentric view; the agent scales it by 1/255
        space = env.observation_space
        if isinstance(space, gym.spaces.Discrete):  # FrozenLake: state index -> one-hot vector
            one_hot = gym.spaces.Box(0.0, 1.0, (int(space.n),), np.float32)
            env = gym.wrappers.TransformObservation(env, lambda s: np.eye(int(space.n), dtype=np.float32)[s], one_hot)
        elif isinstance(space, gym.spaces.Box) and len(space.shape) == 2:
            env = gym.wrappers.FlattenObservation(env)  # highway's (vehicles, features)
        return env

    return thunk


def make_vec(args, n, backend):
    if backend == "envpool":  # batched C++ ports, in the optional research/iif_envpool.py
        from iif_envpool import EnvpoolVec
        return EnvpoolVec(args.env_id, PRESETS[args.env_id]["envpool"], n, 1)
    # SAME_STEP: an episode's last obs in info["final_obs"], the next one's first returned; copy=False: no copy
    return gym.vector.SyncVectorEnv([make_env(args.env_id) for _ in range(n)], copy=False,
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(n_in, n_out, out_std):
    return nn.Sequential(layer_init(nn.Linear(n_in, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)), nn.Tanh(),
                         layer_init(nn.Linear(64, n_out), std=out_std))


class Agent(nn.Module):  # App. B.2: SB3's default actor-critic, separate 64-64 tanh MLPs, a shared CNN for images
    def __init__(self, obs_space, act_space):
        super().__init__()
        self.image = len(obs_space.shape) == 3
        if self.image:
            h, w, c = obs_space.shape
            self.extractor = nn.Sequential(
                layer_init(nn.Conv2d(c, 16, 3)), nn.ReLU(), layer_init(nn.Conv2d(16, 32, 3)), nn.ReLU(),
                nn.Flatten(), layer_init(nn.Linear(32 * (h - 4) * (w - 4), 64)), nn.ReLU())
        n_in = 64 if self.image else int(np.prod(obs_space.shape))
        self.continuous = isinstance(act_space, gym.spaces.Box)
        n_act = act_space.shape[0] if self.continuous else int(act_space.n)
        self.actor = mlp(n_in, n_act, out_std=0.01)
        self.critic = mlp(n_in, 1, out_std=1.0)
        if self.continuous:
            self.log_std = nn.Parameter(torch.zeros(n_act))  # the Gaussian's state-free log-std

    def features(self, obs):
        return self.extractor(obs.permute(0, 3, 1, 2) / 255.0) if self.image else obs

    def dist(self, h):  # a Box action: a diagonal Gaussian, log-probs and entropies summed over its dimensions
        out = self.actor(h)  # the Gaussian's mean or the logits
        return Independent(Normal(out, self.log_std.exp()), 1) if self.continuous else Categorical(logits=out)

    def forward(self, obs, action, critic=True):  # log pi(a|s), entropy and V(s) (None without the critic)
        h = self.features(obs)
        d = self.dist(h)
        return d.log_prob(action), d.entropy(), self.critic(h).squeeze(-1) if critic else None

    @torch.inference_mode()
    def act(self, obs):  # = dist(h).sample(), bit for bit; a Categorical's drawn without building the object (faster)
        if self.continuous:
            return self.dist(self.features(obs)).sample()
        logits = self.actor(self.features(obs))
        return torch.multinomial((logits - logits.logsumexp(-1, keepdim=True)).softmax(-1), 1, True)[:, 0]

    @torch.inference_mode()
    def value(self, obs):
        return self.critic(self.features(obs)).squeeze(-1)


def env_action(agent, action, act_space):  # a sampled action (numpy) as the env takes it
    return np.clip(action, act_space.low, act_space.high) if agent.continuous else action


def as_tensor(x, device):  # observations, on the agent's device
    return torch.as_tensor(x, dtype=torch.float32, device=device)


# ---- Stage I of Alg. 1: the rollout buffer B(k) and its advantages (Sec. 2.1) ----
def collect_rollout(agent, envs, next_obs, ep, args):
    """B(k) at theta(k) with log pi(a|s), V(s) and GAE advantages; record t * num_envs + e is step t of env e.
    Also the next obs and the episodes ended (rows: return, length, the step t that ended it); ep: those under way."""
    T, N, act_space = args.num_steps, args.num_envs, envs.single_action_space
    device = next(agent.parameters()).device
    obs = np.zeros((T, N) + envs.single_observation_space.shape, dtype=np.float32)
    actions = np.zeros((T, N) + act_space.shape, dtype=np.float32 if agent.continuous else np.int64)
    rewards, terminations, truncations = (np.zeros((T, N), dtype) for dtype in (np.float32, bool, bool))
    ended, truncated = [], []
    for step in range(T):
        obs[step] = next_obs
        actions[step] = action = agent.act(as_tensor(next_obs, device)).cpu().numpy()
        next_obs, rewards[step], terminations[step], truncations[step], info = envs.step(
            env_action(agent, action, act_space))
        ep += [rewards[step], np.ones(N)]
        for i in np.flatnonzero(terminations[step] | truncations[step]):
            ended.append((*ep[:, i], step))
            ep[:, i] = 0.0
            if truncations[step, i] and not terminations[step, i]:
                truncated.append((step, i, info["final_obs"][i]))
    r = {key: torch.from_numpy(v).to(device) for key, v in dict(
        obs=obs, actions=actions, rewards=rewards, terminations=terminations.astype(np.float32),
        dones=(terminations | truncations).astype(np.float32)).items()}
    with torch.no_grad():  # log pi(a|s) and V(s) at theta(k) of all records in one batched pass
        logprobs, _, values = agent(r["obs"].flatten(0, 1), r["actions"].flatten(0, 1))
    r["logprobs"], r["values"] = logprobs.view(T, N), values.view(T, N)
    # next_values[t]: V of the state after step t; of the final obs where truncated (bootstrapped, as SB3)
    r["next_values"] = torch.cat([r["values"][1:], agent.value(as_tensor(next_obs, device))[None]])
    if truncated:
        steps, env_ids, final_obs = zip(*truncated)
        r["next_values"][steps, env_ids] = agent.value(as_tensor(np.stack(final_obs), device))
    r["advantages"], r["returns"] = compute_gae(r["rewards"], r["values"], r["next_values"], r["terminations"],
                                                r["dones"], args.gamma, args.gae_lambda)
    return {key: v.flatten(0, 1) for key, v in r.items()}, next_obs, np.array(ended).reshape(-1, 3)


def compute_gae(rewards, values, next_values, terminations, dones, gamma, lam):
    """GAE over a (steps, envs) rollout; next_values[t]: V of the state after step t, ignored if it terminated"""
    r, v, v_next, term, done = (x.cpu().numpy() for x in (rewards, values, next_values, terminations, dones))
    advantages, lastgaelam = np.zeros_like(r), 0.0  # on numpy: 10x faster than torch here, the same float32 steps
    for t in reversed(range(len(r))):
        delta = r[t] + gamma * v_next[t] * (1.0 - term[t]) - v[t]
        # done[t]: step t *ended* an episode (CleanRL's dones: obs[t] *started* one), so step t's delta still counts
        lastgaelam = delta + gamma * lam * (1.0 - done[t]) * lastgaelam
        advantages[t] = lastgaelam
    advantages = torch.from_numpy(advantages).to(values.device)
    return advantages, advantages + values


def normalize(x):
    return (x - x.mean()) / (x.std() + 1e-8)


# ---- Stage II of Alg. 1: the target function, the influence of every record, the filter ----
DIAGNOSTICS = ("pg_loss", "vf_loss", "entropy", "old_approx_kl", "approx_kl", "clip_frac")  # per update
def ppo_losses(agent, b, idx, args, params=None, adv=None, vf_coef=None, parts=None):
    """Per-record PPO loss l_i (Sec. 2.1) of records idx; a step minimises its mean. params: the agent's, for
    torch.func; adv, vf_coef: default b's, args'; parts: a dict that gets each record's DIAGNOSTICS (no grad)."""
    records = (b["obs"][idx], b["actions"][idx])
    logp, entropy, value = agent(*records) if params is None else functional_call(agent, params, records)
    adv = b["advantages"][idx] if adv is None else adv
    vf_coef = args.vf_coef if vf_coef is None else vf_coef
    ratio = (logp - b["logprobs"][idx]).exp()
    clipped_ratio = ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)
    pg_loss = -torch.min(ratio * adv, clipped_ratio * adv)
    v_loss = (b["returns"][idx] - value) ** 2  # as SB3: no 1/2 and no value clipping
    if parts is not None:  # CleanRL's approx KLs, -log r and (r - 1) - log r, and clip fraction
        r = ratio.detach()
        parts.update(zip(DIAGNOSTICS, (pg_loss.detach(), v_loss.detach(), entropy.detach(), -r.log(),
                                       r - 1 - r.log(), ((r - 1).abs() > args.clip_coef).float())))
    return pg_loss + vf_coef * v_loss - args.ent_coef * entropy


def f_return(agent, params, obs, actions, a_hat):
    """Sec. 3.1's f_return: mean log pi_theta(a|s) x raw GAE A_hat over B(k), a sample of pi_ref = pi_theta(k);
    raw as the paper and the release (rlhf_iif.py whitens A_hat, as its TRL training does: one A_hat for both)"""
    logp, _, _ = functional_call(agent, params, (obs, actions), {"critic": False})
    return (logp * a_hat).mean()


def target_grad(agent, params, obs, actions, a_hat):  # {name: grad f_return at params}, none for the critic
    grads = torch.autograd.grad(f_return(agent, params, obs, actions, a_hat),
                                list(params.values()), allow_unused=True)
    return {k: g for k, g in zip(params, grads) if g is not None}


def influence(agent, b, args, target=None):
    """I_i = <grad f(theta(k)), -grad l_i(theta(k))> of every record (Sec. 3.1, 5.1), exact and batched: one
    backward pass gives g = grad f, one forward-mode pass (jvp) every dl_i . g. target: f's (obs, actions,
    weights); default B(k) with its A_hat, f_return (one (s, a) with weight 1 is f_action, Sec. 3.1, 4.2)."""
    params = {k: v.detach().requires_grad_() for k, v in agent.named_parameters()}
    g = target_grad(agent, params, *(target or (b["obs"], b["actions"], b["advantages"])))
    primals = {k: params[k].detach() for k in g}
    frozen = {k: v.detach() for k, v in params.items() if k not in g}  # the separate critic
    adv = normalize(b["advantages"])  # l_i's A_hat normalised over B(k), as its minibatches will be on average

    # the policy terms of l_i only, as released (rlhf_iif.py scores the value term: its value head shares the LM)
    def losses(p):  # theta -> (l_1(theta), ..., l_n(theta))
        return ppo_losses(agent, b, slice(None), args, {**frozen, **p}, adv, vf_coef=0.0)
    _, dl = jvp(losses, (primals,), (g,))
    return -dl


def filter_records(scores, method, p, gen):
    """Stage II of Alg. 1: (kept mask, n_negative); drop the bottom floor(p x n_negative), or as many at random"""
    n_neg = int((scores < 0).sum())
    kept = torch.ones(len(scores), dtype=torch.bool, device=scores.device)
    if method == "none":
        return kept, n_neg
    n_drop = math.floor(p * n_neg + 1e-9)  # 1e-9: 0.29 * 100 = 28.999..
    order = torch.argsort(scores, stable=True)
    if n_drop < len(scores):  # records tied with the first one kept stay too (the released code)
        n_drop = int((scores < scores[order[n_drop]]).sum())
    if method == "random":
        order = torch.randperm(len(scores), generator=gen).to(scores.device)
    kept[order[:n_drop]] = False
    return kept, n_neg


# ---- Stage III of Alg. 1: the ordinary PPO update on the kept records ----
def make_optimizer(agent, args):
    if args.optimizer == "sgd":
        return torch.optim.SGD(agent.parameters(), lr=args.learning_rate)
    return torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)  # SB3's eps


def ppo_update(agent, optimizer, b, kept_idx, args, rng):
    """PPO epochs on the kept records; full minibatches only (as released), so filtered rounds take fewer steps"""
    n_updates, stats = 0, []
    for epoch in range(args.update_epochs):
        perm = kept_idx[torch.as_tensor(rng.permutation(len(kept_idx)), device=kept_idx.device)]
        for start in range(0, len(perm) - args.minibatch_size + 1, args.minibatch_size):
            mb_inds = perm[start:start + args.minibatch_size]
            mb_adv = normalize(b["advantages"][mb_inds])  # per minibatch, after filtering (SB3)
            parts = {}
            loss = ppo_losses(agent, b, mb_inds, args, adv=mb_adv, parts=parts).mean()
            stats.append(torch.stack([parts[k].mean() for k in DIAGNOSTICS]))  # to floats once, at the end
            if not torch.isfinite(loss):
                raise FloatingPointError(f"non-finite PPO loss at epoch {epoch}, step {n_updates}; "
                                         "lower --learning-rate or set --max-grad-norm")
            optimizer.zero_grad()
            loss.backward()
            if args.max_grad_norm > 0:
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            optimizer.step()
            n_updates += 1
    means = np.mean(torch.stack(stats).tolist(), 0) if stats else [None] * len(DIAGNOSTICS)
    return n_updates, dict(zip(DIAGNOSTICS, means))


def explained_variance(b):  # 1 - Var(R - V) / Var(R) on B(k): how much of the returns V(s) at theta(k) explained
    return float(1 - (b["returns"] - b["values"]).var() / b["returns"].var())


@torch.no_grad()
def approx_kl(agent, b):  # KL(pi_theta(k) || pi_theta), B(k) its sample: mean (r - 1) - log r, unbiased, >= 0
    logratio = agent(b["obs"], b["actions"], critic=False)[0] - b["logprobs"]
    return float((logratio.exp() - 1 - logratio).mean())


def evaluate(agent, envs, n_episodes, seed):
    """Test return (App. B.2): mean and std over n_episodes of the stochastic policy"""
    n = envs.num_envs
    quota = n_episodes // n + (np.arange(n) < n_episodes % n)  # split evenly: short episodes not over-counted
    done_count, ep_ret, returns = np.zeros(n, dtype=int), np.zeros(n), []
    obs, _ = envs.reset(seed=seed)
    subset = not isinstance(envs, gym.vector.VectorEnv)  # envpool: steps owing envs, resets if any owes 2
    device = next(agent.parameters()).device
    while (done_count < quota).any():
        live = np.flatnonzero(done_count < quota) if subset else np.arange(n)
        action = env_action(agent, agent.act(as_tensor(obs[live], device)).cpu().numpy(), envs.single_action_space)
        obs[live], reward, term, trunc, _ = envs.step(action, live, (quota > 1).any()) if subset else envs.step(action)
        ep_ret[live] += reward
        for i in live[term | trunc]:
            if done_count[i] < quota[i]:
                returns.append(ep_ret[i])
                done_count[i] += 1
            ep_ret[i] = 0.0
    return float(np.mean(returns)), float(np.std(returns))


METRICS = ["round", "global_step", "train_return", "train_length", "test_return_mean", "test_return_std",
           "n_records", "n_kept", "n_dropped", "n_negative", "n_updates", "kl",
           "t_rollout", "t_influence", "t_optim", "t_eval", *DIAGNOSTICS, "explained_var"]
# TensorBoard, a point a round: CleanRL's scalar names, and IIF's under iif/ (metrics.csv's columns)
SCALARS = {"charts/SPS": "sps", "losses/value_loss": "vf_loss", "losses/policy_loss": "pg_loss",
           "losses/entropy": "entropy", "losses/old_approx_kl": "old_approx_kl", "losses/approx_kl": "approx_kl",
           "losses/clipfrac": "clip_frac", "losses/explained_variance": "explained_var",
           "iif/test_return": "test_return_mean", "iif/n_kept": "n_kept", "iif/n_negative": "n_negative",
           "iif/n_dropped": "n_dropped", "iif/kl": "kl", "iif/influence_seconds": "t_influence"}


# ---- The loop of Alg. 1 ----
def main(args):
    torch.set_num_threads(1)  # small networks run fastest on one thread
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    rng, gen = np.random.default_rng(args.seed), torch.Generator().manual_seed(args.seed)  # minibatches, filter
    envs = make_vec(args, args.num_envs, args.backends[0])
    n_eval = args.eval_episodes if args.backends[1] == "envpool" else min(16, args.eval_episodes)
    eval_envs = make_vec(args, n_eval, args.backends[1])  # test episodes: one env each on envpool, 16 on gymnasium
    agent = Agent(envs.single_observation_space, envs.single_action_space).to(device)
    if args.eval_model:  # no training: the saved agent's test return (and a video)
        agent.load_state_dict(torch.load(args.eval_model, map_location=device))
        test = evaluate(agent, eval_envs, args.eval_episodes, args.seed + 10_000)
        print(f"{args.eval_model}: test return {test[0]:.3f} +- {test[1]:.3f} over {args.eval_episodes} episodes")
        if args.capture_video:
            record_video(agent, args, 0)
        return
    optimizer = make_optimizer(agent, args)
    run_dir = os.path.join(args.runs_dir, args.run_name)
    if os.path.exists(os.path.join(run_dir, "metrics.csv")):
        fail(f"{run_dir} holds a run already: choose another --run-name")
    os.makedirs(os.path.join(run_dir, "rounds") if args.save_rounds else run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "config.json"), "w") as f:
        json.dump(dataclasses.asdict(args), f, indent=1)
    metrics_file = open(os.path.join(run_dir, "metrics.csv"), "w", newline="")
    metrics = csv.DictWriter(metrics_file, fieldnames=METRICS)
    metrics.writeheader()
    if args.track:  # wandb, syncing TensorBoard's scalars
        import wandb
        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True,
                   config=dataclasses.asdict(args), name=args.run_name, save_code=True)
    from torch.utils.tensorboard import SummaryWriter
    writer = SummaryWriter(run_dir)  # CleanRL's, with the flags as a table
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(
        f"|{key}|{value}|" for key, value in dataclasses.asdict(args).items()))
    print(f"{args.env_id} on {args.backends[0]}, tests on {args.backends[1]}, {device}: {args.num_rounds} rounds of "
          f"{args.batch_size} records, filter {args.filter_method} p={args.filter_p}, {args.optimizer}"
          f" lr={args.learning_rate}, {args.eval_episodes} test episodes a round -> {run_dir}")
    next_obs, _ = envs.reset(seed=args.seed)
    ep = np.zeros((2, args.num_envs))  # the returns and lengths of the episodes under way
    start = time.perf_counter()
    for k in range(args.num_rounds):
        t0 = time.perf_counter()
        # Stage I (Alg. 1): collect the rollout buffer B(k) with the policy at theta(k)
        b, next_obs, episodes = collect_rollout(agent, envs, next_obs, ep, args)
        t1 = time.perf_counter()
        # Stage II (Alg. 1): score every record at theta(k) (Sec. 5.1), drop the bottom ones
        scores = influence(agent, b, args)
        if not torch.isfinite(scores).all():
            fail(f"round {k}: non-finite influence scores; lower --learning-rate")
        kept, n_negative = filter_records(scores, args.filter_method, args.filter_p, gen)
        t2 = time.perf_counter()
        # Stage III (Alg. 1): the ordinary PPO update on the kept records
        theta_k = {key: v.clone() for key, v in agent.state_dict().items()} if args.save_rounds else None
        try:
            n_updates, stats = ppo_update(agent, optimizer, b, torch.nonzero(kept)[:, 0], args, rng)
        except FloatingPointError as e:
            fail(f"round {k}: {e}")
        t3 = time.perf_counter()
        test_mean, test_std = evaluate(agent, eval_envs, args.eval_episodes, args.seed + 10_000)
        t4 = time.perf_counter()
        if args.capture_video and k % max(1, args.num_rounds // 10) == 0:
            record_video(agent, args, k)
        ended = len(episodes) > 0  # the training episodes that ended: their mean return and length
        train_return, train_length = (float(x) for x in episodes[:, :2].mean(0)) if ended else (None, None)
        row = dict(round=k, global_step=(k + 1) * args.batch_size, train_return=train_return,
                   train_length=train_length, test_return_mean=test_mean, test_return_std=test_std,
                   n_records=args.batch_size, n_kept=int(kept.sum()), n_dropped=int((~kept).sum()),
                   n_negative=n_negative, n_updates=n_updates, kl=approx_kl(agent, b), t_rollout=t1 - t0,
                   t_influence=t2 - t1, t_optim=t3 - t2, t_eval=t4 - t3, **stats, explained_var=explained_variance(b))
        metrics.writerow(row)
        metrics_file.flush()  # an interrupted run keeps every finished round
        logged = {**row, "sps": int(row["global_step"] / (time.perf_counter() - start))}
        for tag, key in SCALARS.items():
            if logged[key] is not None:
                writer.add_scalar(tag, logged[key], row["global_step"])
        for ret, length, t in episodes:  # as CleanRL: each training episode at the global step that ended it
            writer.add_scalar("charts/episodic_return", ret, k * args.batch_size + (t + 1) * args.num_envs)
            writer.add_scalar("charts/episodic_length", length, k * args.batch_size + (t + 1) * args.num_envs)
        writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], row["global_step"])
        writer.add_histogram("iif/influence", scores, row["global_step"])  # Stage II's scores
        if args.save_rounds:
            torch.save(dict(b, round=k, global_step=row["global_step"], state_dict=theta_k,
                            influence=scores, kept=kept, influence_tracin=None, target="f_return"),
                       os.path.join(run_dir, "rounds", f"round_{k:04d}.pt"))
        print(f"round {k} [{k + 1}/{args.num_rounds}] step {row['global_step']} SPS {logged['sps']} | train "
              f"{f'{train_return:.3f}' if ended else '(no episode ended)'} test {test_mean:.3f} +- "
              f"{test_std:.3f} | kept {row['n_kept']}/{args.batch_size} (neg {n_negative}) | s: rollout "
              f"{t1 - t0:.2f} influence {t2 - t1:.2f} optim {t3 - t2:.2f} eval {t4 - t3:.2f}", flush=True)
    if args.save_model or args.save_rounds:  # as CleanRL: the state_dict (its flags: config.json), 10 test episodes
        torch.save(agent.state_dict(), os.path.join(run_dir, "iif.cleanrl_model"))  # more: --eval-model <that file>
        for idx in range(10):
            writer.add_scalar("eval/episodic_return", evaluate(agent, eval_envs, 1, args.seed + 30_000 + idx)[0], idx)
    for resource in (writer, metrics_file, envs, eval_envs):
        resource.close()


def record_video(agent, args, k):  # --capture-video: a test episode to videos/<run-name>/, with its own RNG
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # frames without a screen
    env = gym.vector.SyncVectorEnv([lambda: gym.wrappers.RecordVideo(make_env(args.env_id, "rgb_array")(),
                                    f"videos/{args.run_name}", name_prefix=f"round-{k}", disable_logger=True)])
    device = next(agent.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(args.seed + 20_000 + k)
        evaluate(agent, env, 1, args.seed + 20_000 + k)
    env.close()


def fail(msg):
    raise SystemExit(f"{os.path.basename(sys.argv[0])}: error: {msg}")


def resolve_args(args):  # fill in preset and sizes, check flags and env: bad input stops here, naming the flag
    if args.eval_model:  # the saved run's env, from the config.json beside it; the test's flags from this command
        config = os.path.join(os.path.dirname(args.eval_model), "config.json")
        if not (os.path.isfile(args.eval_model) and os.path.isfile(config)):
            fail(f"--eval-model {args.eval_model!r}: no such file, or no config.json of its run beside it")
        with open(config) as f:
            saved = json.load(f)
        args.env_id, args.run_name = saved["env_id"], args.run_name or saved["run_name"] + "-eval"
    for flag, package in [("track", "wandb"), ("capture_video", "moviepy")]:
        if getattr(args, flag) and not importlib.util.find_spec(package):
            fail(f"--{flag.replace('_', '-')} needs {package}: pip install {package}")
    for key, value in preset_of(args.env_id).items():  # the preset's values of the flags not given
        if key in preset_of(None) and getattr(args, key) is None:
            setattr(args, key, value)
    if args.env_id not in PRESETS and args.filter_method in OUTSIDE:
        print(OUTSIDE[args.filter_method], file=sys.stderr)
    for key, ok, allowed in [(k, getattr(args, k) >= 1, "at least 1") for k in (
            "num_envs", "num_steps", "minibatch_size", "update_epochs", "eval_episodes")] + [
            ("filter_p", 0 < args.filter_p <= 1, "in (0, 1]"),
            ("learning_rate", args.learning_rate > 0, "positive"),
            ("max_grad_norm", args.max_grad_norm >= 0, "0 (no clipping) or positive")]:
        if not ok:
            fail(f"--{key.replace('_', '-')} must be {allowed}, got {getattr(args, key)}")
    args.batch_size = args.num_steps * args.num_envs
    args.num_rounds = args.total_timesteps // args.batch_size
    buffer = f"the buffer size --num-steps x --num-envs = {args.batch_size}"
    if args.batch_size % args.minibatch_size:
        fail(f"--minibatch-size {args.minibatch_size} does not divide {buffer}")
    if args.num_rounds < 1 or args.total_timesteps % args.batch_size:
        fail(f"--total-timesteps {args.total_timesteps} is not a positive multiple of {buffer}")
    ported = "envpool" in PRESETS.get(args.env_id, {}) and all(
        importlib.util.find_spec(m) for m in ("envpool", "iif_envpool"))
    if args.env_backend == "envpool" and not ported:
        fail("--env-backend envpool needs the envpool package, research/iif_envpool.py and a "
             f"preset with a port ({', '.join(k for k, v in PRESETS.items() if 'envpool' in v)})")
    auto = PRESETS[args.env_id]["auto"] if ported else ("gymnasium",) * 2  # (Stage I's backend, the test's)
    args.backends = auto if args.env_backend == "auto" else (args.env_backend,) * 2
    try:
        env = make_vec(args, 1, args.backends[0])
    except (gym.error.Error, ImportError) as e:
        fail(f"--env-id {args.env_id!r} cannot be made ({type(e).__name__}: {e})")
    obs_space, act_space = env.single_observation_space, env.single_action_space
    if args.capture_video and "rgb_array" not in env.metadata.get("render_modes", []):
        fail(f"--capture-video: {args.env_id} does not render rgb_array frames "
             f"(render modes {env.metadata.get('render_modes', [])})")
    env.close()
    if not (isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) in (1, 3)) or not (
            isinstance(act_space, gym.spaces.Discrete) or isinstance(act_space, gym.spaces.Box)
            and len(act_space.shape) == 1):
        fail(f"--env-id {args.env_id}: spaces {obs_space}, {act_space} are not supported (observa"
             "tion: Discrete or a Box of 1 to 3 dimensions; action: Discrete or a 1-D Box)")
    args.exp_name = args.exp_name or args.filter_method
    safe_id = re.sub(r"[^\w.-]", "_", args.env_id)  # no ":" or "/" of a module:id in the folder's name
    args.run_name = args.run_name or f"{safe_id}__{args.exp_name}__{args.seed}__{int(time.time())}"  # CleanRL's
    return args


if __name__ == "__main__":
    args = resolve_args(tyro.cli(Args, description=f"{__doc__.splitlines()[0]} Presets: {', '.join(PRESETS)}."))
    try:
        main(args)
    except KeyboardInterrupt:
        fail(f"interrupted: every finished round is in {args.runs_dir}/{args.run_name}/metrics.csv")
