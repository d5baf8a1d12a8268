"""docs/usage.md's "IIF in your own PPO loop": its blocks, run in loops written with the names of CleanRL's ppo.py and
ppo_continuous_action.py, keep the records iif.py keeps, log the counts, never run an epoch without a minibatch, and
with --filter-p 0 train CleanRL's weights bit for bit."""
import contextlib
import copy
import dataclasses
import io
import os
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.distributions.categorical import Categorical
from torch.distributions.normal import Normal

import iif

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def blocks():
    """The section's Python blocks: Args's fields, iif_filter, ppo.py's iif_actor, ppo_continuous_action.py's, the
    loop's lines (a reading of the measured runs may follow)"""
    text = open(os.path.join(ROOT, "docs", "usage.md")).read()
    section = text[text.index("## IIF in your own PPO loop"):]
    section = section[:section.index("\n## ", 5)]
    found = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(found) >= 5 and "def iif_filter" in found[1] and "agent.actor_mean" in found[3], found
    return found


# CleanRL's Agents, as ppo.py and ppo_continuous_action.py define them: iif.py's layer_init and 64-64 tanh MLP
# are CleanRL's own
mlp = iif.mlp


class CategoricalAgent(nn.Module):  # ppo.py's
    def __init__(self, n_obs, n_act):
        super().__init__()
        self.critic = mlp(n_obs, 1, 1.0)
        self.actor = mlp(n_obs, n_act, 0.01)

    def get_action_and_value(self, x, action=None):
        probs = Categorical(logits=self.actor(x))
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


class GaussianAgent(nn.Module):  # ppo_continuous_action.py's
    def __init__(self, n_obs, n_act):
        super().__init__()
        self.critic = mlp(n_obs, 1, 1.0)
        self.actor_mean = mlp(n_obs, n_act, 0.01)
        self.actor_logstd = nn.Parameter(torch.zeros(1, n_act))

    def get_action_and_value(self, x, action=None):
        action_mean = self.actor_mean(x)
        probs = Normal(action_mean, torch.exp(self.actor_logstd.expand_as(action_mean)))
        return action, probs.log_prob(action).sum(1), probs.entropy().sum(1), self.critic(x)


# ppo.py's update, the lines after the ones the page replaces (the value loss clipped, as its default)
CLEANRL_HEAD = """        # Optimizing the policy and value network
        b_inds = np.arange(args.batch_size)
        clipfracs = []
        for epoch in range(args.update_epochs):
            np.random.shuffle(b_inds)
            for start in range(0, args.batch_size, args.minibatch_size):
"""
CLEANRL_BODY = """                end = start + args.minibatch_size
                mb_inds = b_inds[start:end]
                trained.append(mb_inds)

                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], B_ACTIONS[mb_inds])
                logratio = newlogprob - b_logprobs[mb_inds]
                ratio = logratio.exp()

                with torch.no_grad():
                    old_approx_kl = (-logratio).mean()
                    approx_kl = ((ratio - 1) - logratio).mean()
                    clipfracs += [((ratio - 1.0).abs() > args.clip_coef).float().mean().item()]

                mb_advantages = b_advantages[mb_inds]
                if args.norm_adv:
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

                pg_loss1 = -mb_advantages * ratio
                pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                pg_loss = torch.max(pg_loss1, pg_loss2).mean()

                newvalue = newvalue.view(-1)
                if args.clip_vloss:
                    v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                    v_clipped = b_values[mb_inds] + torch.clamp(newvalue - b_values[mb_inds], -args.clip_coef,
                                                                args.clip_coef)
                    v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
                    v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
                else:
                    v_loss = 0.5 * ((newvalue - b_returns[mb_inds]) ** 2).mean()

                entropy_loss = entropy.mean()
                loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

            if args.target_kl is not None and approx_kl > args.target_kl:
                break

        writer.add_scalar("losses/value_loss", v_loss.item(), global_step)
        writer.add_scalar("losses/approx_kl", approx_kl.item(), global_step)
"""


class Writer:  # SummaryWriter's add_scalar, kept
    def __init__(self):
        self.scalars = {}

    def add_scalar(self, tag, value, step):
        self.scalars[tag] = (value, step)


def cleanrl_args(**kw):
    a = dict(num_envs=4, num_steps=128, num_minibatches=4, update_epochs=4, norm_adv=True, clip_coef=0.2,
             clip_vloss=True, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5, target_kl=None, filter_p=0.5,
             filter_random=False)
    a.update(kw)
    a["batch_size"] = a["num_envs"] * a["num_steps"]
    a["minibatch_size"] = a["batch_size"] // a["num_minibatches"]
    return SimpleNamespace(**a)


def buffer(env_id, ent_coef, seed=0):
    """A 512-record buffer B(k) collected by iif.py, the iif.py agent that collected it and iif.py's args"""
    args = iif.resolve_args(iif.Args(env_id=env_id, num_steps=512, total_timesteps=512, eval_episodes=1,
                                     ent_coef=ent_coef, filter_p=0.5, env_backend="gymnasium"))
    torch.manual_seed(seed)
    envs = iif.make_vec(args, 1, "gymnasium")
    agent = iif.Agent(envs.single_observation_space, envs.single_action_space)
    agent.actor[-1].weight.data.mul_(100)  # a policy away from its initial uniform one, where grad H = 0
    if agent.continuous:  # and a log-std away from its initial 0
        agent.log_std.data.fill_(-0.7)
    b = iif.collect_rollout(agent, envs, envs.reset(seed=seed)[0], np.zeros((2, 1)), args)[0]
    envs.close()
    return b, agent, args


def cleanrl_agent(iif_agent):
    """CleanRL's agent with iif.py's agent's weights (the same 64-64 tanh MLPs)"""
    state = iif_agent.state_dict()
    n_obs, n_act = state["actor.0.weight"].shape[1], state["actor.4.weight"].shape[0]
    if not iif_agent.continuous:
        agent = CategoricalAgent(n_obs, n_act)
        agent.load_state_dict(state)
        return agent
    agent = GaussianAgent(n_obs, n_act)
    agent.load_state_dict({**{k.replace("actor.", "actor_mean.", 1): v for k, v in state.items() if k != "log_std"},
                           "actor_logstd": state["log_std"][None]})
    return agent


def pasted(continuous):
    """The names the pasted blocks define, in a namespace with ppo.py's imports"""
    args_fields, filter_block, categorical, gaussian, _ = blocks()[:5]
    space = {"torch": torch, "nn": nn, "np": np, "Categorical": Categorical, "Normal": Normal}
    exec(filter_block, space)
    exec(gaussian if continuous else categorical, space)
    fields = {}
    exec("class Args:\n" + args_fields, {}, fields)  # the fields parse as a class body, with CleanRL's names
    assert fields["Args"].filter_p == 0.5 and fields["Args"].filter_random is False
    return space


ACTORS = [("CartPole-v1", False, 0.01), ("Pendulum-v1", True, 0.0)]  # CleanRL's defaults


@pytest.mark.parametrize("env_id, continuous, ent_coef", ACTORS)
def test_the_scores_and_the_kept_records_are_iif_pys(env_id, continuous, ent_coef):
    space = pasted(continuous)
    b, iif_agent, args = buffer(env_id, ent_coef)
    agent = cleanrl_agent(iif_agent)
    b_actions = b["actions"].float()  # CleanRL's buffer stores actions as floats
    for ent_coef, p in [(ent_coef, 0.21), (ent_coef, 0.5), (ent_coef, 1.0), (0.5, 0.21), (0.5, 0.5)]:
        scores = iif.influence(iif_agent, b, dataclasses.replace(args, ent_coef=ent_coef))  # 0.5: H's term counts
        expected, n_neg = iif.filter_records(scores, "influence", p, None)
        kept, n_negative, n_dropped = space["iif_filter"](*space["iif_actor"](agent, b["obs"], b_actions),
                                                          b["advantages"], ent_coef, p)
        assert n_negative == n_neg and 0 < n_dropped == int((~kept).sum()), p
        assert torch.equal(kept, expected), p
        torch.manual_seed(1)
        kept_random, _, n_random = space["iif_filter"](*space["iif_actor"](agent, b["obs"], b_actions),
                                                       b["advantages"], ent_coef, p, at_random=True)
        assert n_random == n_dropped == int((~kept_random).sum()) and not torch.equal(kept_random, kept), p


def scored(scores):
    """logp_and_entropy and an actor whose iif_filter scores are `scores` / n after a first record that is kept: the
    first record alone carries grad f; the others' scores come from their entropy, ent_coef 1"""
    n = len(scores) + 1
    x = torch.zeros(n, dtype=torch.float64)
    x[0] = 1.0
    e = torch.cat([torch.zeros(1, dtype=torch.float64), torch.as_tensor(scores, dtype=torch.float64)])
    advantages = x.clone()  # g = 1 / n

    def logp_and_entropy(actor):
        return actor["w"] * x, actor["w"] * e
    return logp_and_entropy, {"w": torch.tensor(1.0, dtype=torch.float64)}, advantages


def test_the_count_is_the_exact_floor_and_ties_at_the_cut_stay():
    space = pasted(False)
    rng = np.random.default_rng(0)
    scores = np.concatenate([-rng.permutation(300) - 1.0, rng.permutation(211) + 1.0])  # 300 negative of 511
    for p in [0.21, 0.29] + [k / 100 for k in range(1, 100)]:
        logp_and_entropy, actor, advantages = scored(scores)
        kept, n_negative, n_dropped = space["iif_filter"](logp_and_entropy, actor, advantages, 1.0, p)
        expected, _ = iif.filter_records(torch.as_tensor(np.concatenate([[1.0], scores])), "influence", p, None)
        assert n_negative == 300 and n_dropped == round(p * 100) * 300 // 100, p  # 0.21: 63, not float32's 62
        assert torch.equal(kept, expected), p
    ties = np.array([-3.0, -2.0, -2.0, -2.0, -1.0, 1.0])  # floor(0.5 x 5) = 2 cuts the -2s: all three stay
    kept, n_negative, n_dropped = space["iif_filter"](*scored(ties), 1.0, 0.5)
    expected, _ = iif.filter_records(torch.as_tensor(np.concatenate([[1.0], ties])), "influence", 0.5, None)
    assert (n_negative, n_dropped) == (5, 1) and torch.equal(kept, expected) and kept.tolist()[1:3] == [False, True]


def run_update(continuous, head, args, b, agent, seed=0):
    """One iteration of CleanRL's update on B(k) with the given first lines; returns the trained minibatches, the
    writer's scalars and the agent's weights after it"""
    space = pasted(continuous)
    agent = copy.deepcopy(agent)
    ns = {**space, "args": args, "agent": agent, "writer": Writer(), "global_step": args.batch_size, "trained": [],
          "optimizer": torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5),
          "b_obs": b["obs"], "b_actions": b["actions"].float(), "b_logprobs": b["logprobs"],
          "b_advantages": b["advantages"], "b_returns": b["returns"], "b_values": b["values"]}
    body = CLEANRL_BODY.replace("B_ACTIONS", "b_actions" if continuous else "b_actions.long()")
    np.random.seed(seed)
    exec("if True:\n    for iteration in range(1, 2):\n" + head + body, ns)
    return ns["trained"], ns["writer"].scalars, agent.state_dict()


@pytest.mark.parametrize("env_id, continuous, ent_coef", ACTORS)
def test_the_loop_trains_on_whole_minibatches_of_kept_records_and_never_none(env_id, continuous, ent_coef):
    loop = blocks()[4]
    b, iif_agent, iif_args = buffer(env_id, ent_coef)
    agent = cleanrl_agent(iif_agent)
    scores = iif.influence(iif_agent, b, iif_args)
    for p, num_minibatches, target_kl in [(0.5, 4, None), (0.21, 4, 0.01), (0.5, 1, None), (0.21, 1, 0.01)]:
        args = cleanrl_args(filter_p=p, num_minibatches=num_minibatches, target_kl=target_kl, ent_coef=ent_coef)
        trained, scalars, _ = run_update(continuous, loop, args, b, agent)  # CleanRL's body would raise a NameError
        kept, n_neg = iif.filter_records(scores, "influence", p, None)  # without a minibatch (v_loss, approx_kl)
        n_kept = int(kept.sum())
        assert {t: v for t, (v, _) in scalars.items() if t.startswith("iif/")} == \
            {"iif/n_negative": n_neg, "iif/n_dropped": 512 - n_kept, "iif/n_kept": n_kept}
        assert all(step == 512 for _, step in scalars.values()) and "losses/approx_kl" in scalars
        per_epoch = max(n_kept // args.minibatch_size, 1)
        assert len(trained) == 4 * per_epoch if target_kl is None else len(trained) % per_epoch == 0, p
        assert all(len(m) == min(args.minibatch_size, n_kept) and kept[torch.as_tensor(m)].all() for m in trained)
        assert num_minibatches > 1 or len(trained[0]) == n_kept < 512  # one minibatch: all the kept records
    args = cleanrl_args(filter_p=0.5, filter_random=True, ent_coef=ent_coef)
    trained, scalars, _ = run_update(continuous, loop, args, b, agent)
    assert scalars["iif/n_kept"][0] == int(iif.filter_records(scores, "influence", 0.5, None)[0].sum())


@pytest.mark.parametrize("env_id, continuous, ent_coef", ACTORS)
def test_with_filter_p_0_the_file_trains_cleanrls_weights_bit_for_bit(env_id, continuous, ent_coef):
    loop = blocks()[4]
    b, iif_agent, _ = buffer(env_id, ent_coef)
    agent = cleanrl_agent(iif_agent)
    args = cleanrl_args(filter_p=0.0, ent_coef=ent_coef)
    trained, scalars, weights = run_update(continuous, loop, args, b, agent)
    trained_cleanrl, scalars_cleanrl, weights_cleanrl = run_update(continuous, CLEANRL_HEAD, args, b, agent)
    assert len(trained) == 16 and all(np.array_equal(a, c) for a, c in zip(trained, trained_cleanrl))
    assert scalars == scalars_cleanrl and not any(t.startswith("iif/") for t in scalars)
    assert all(torch.equal(weights[k], weights_cleanrl[k]) for k in weights)
    assert not torch.equal(weights["critic.0.weight"], agent.state_dict()["critic.0.weight"])  # it trained
    with_filter = run_update(continuous, loop, cleanrl_args(filter_p=0.5, ent_coef=ent_coef), b, agent)[2]
    assert not all(torch.equal(with_filter[k], weights_cleanrl[k]) for k in weights)  # and filtering changes that


def test_the_reading_of_the_measured_runs_counts_whole_minibatches(tmp_path, monkeypatch):
    """The page's reading of its CleanRL runs, on runs written here: 2 iterations, 2 seeds an arm"""
    reading = blocks()[5]
    from torch.utils.tensorboard import SummaryWriter
    for arm, kept, returns, spread in [("ppo", None, [10.0, 30.0], 1), ("iif", [384, 256], [10.0, 20.0], 3),
                                       ("random", [384, 384], [10.0, 26.0], 6)]:
        for seed in (1, 2):
            writer = SummaryWriter(str(tmp_path / "runs" / f"CartPole-v1__{arm}__{seed}__0"))
            for it in range(2):
                writer.add_scalar("charts/SPS", 1000, 512 * (it + 1))
                writer.add_scalar("charts/episodic_return", returns[it] + seed * spread, 512 * (it + 1))
                if kept:
                    writer.add_scalar("iif/n_kept", kept[it], 512 * (it + 1))
            writer.close()
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(reading, {})
    lines = out.getvalue().splitlines()
    assert lines[:3] == [  # (12 + 8) / 32 and 24 / 32 of the steps; the last tenth: the last iteration's episodes
        "ppo: 2 seeds, dropped 0.0 records an iteration, 1.00 of PPO's optimizer steps, return 21.5 over the run, "
        "31.5 over its last tenth",
        "iif: 2 seeds, dropped 192.0 records an iteration, 0.62 of PPO's optimizer steps, return 19.5 over the run, "
        "24.5 over its last tenth",
        "random: 2 seeds, dropped 128.0 records an iteration, 0.75 of PPO's optimizer steps, return 27.0 over the "
        "run, 35.0 over its last tenth"]
    assert lines[3] == "iif - random, return over the run: -7.5 [-26.6, 11.6]"  # -6 and -9: 12.71 x 1.5 either side
