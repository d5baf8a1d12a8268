"""docs/usage.md's "IIF in your own PPO loop": its lines, run as CleanRL's ppo.py would run them, keep the records
iif.py keeps."""
import os
import re
import textwrap
from types import SimpleNamespace

import numpy as np
import torch
from torch.distributions.categorical import Categorical

import iif

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def blocks():
    text = open(os.path.join(ROOT, "docs", "usage.md")).read()
    section = text[text.index("## IIF in your own PPO loop"):]
    section = section[:section.index("\n## ", 5)]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_pasted_lines_keep_iif_pys_records_and_train_on_full_minibatches():
    define, loop = blocks()
    space = {"torch": torch, "np": np, "Categorical": Categorical}
    exec(define, space)  # above class Agent in ppo.py, whose imports it uses
    args = iif.resolve_args(iif.Args(env_id="CartPole-v1", num_steps=256, minibatch_size=64, update_epochs=2,
                                     total_timesteps=256, eval_episodes=1, ent_coef=0.01, filter_p=0.5))
    torch.manual_seed(0)
    envs = iif.make_vec(args, 1)
    agent = iif.Agent(envs.single_observation_space, envs.single_action_space)  # ppo.py's actor: the same MLP
    b = iif.collect_rollout(agent, envs, envs.reset(seed=0)[0], np.zeros((2, 1)), args)[0]
    expected, _ = iif.filter_records(iif.influence(agent, b, args), "influence", 0.5, None)
    kept = space["iif_kept"](agent.actor, b["obs"], b["actions"], b["advantages"], args.ent_coef)
    assert 0 < int((~kept).sum()) < 256 and torch.equal(kept, expected)
    # the loop's lines, with ppo.py's names, and a body that records the minibatches
    body = "\n        mb_inds = b_inds[start:start + args.minibatch_size]\n        seen.append(mb_inds)\n"
    ns = {**space, "agent": SimpleNamespace(actor=agent.actor), "b_obs": b["obs"], "b_actions": b["actions"],
          "b_advantages": b["advantages"], "seen": [],
          "args": SimpleNamespace(ent_coef=args.ent_coef, batch_size=256, minibatch_size=64, update_epochs=2)}
    exec(textwrap.dedent(loop) + body, ns)
    n_kept = int(kept.sum())
    assert len(ns["seen"]) == 2 * (n_kept // 64) > 0
    assert all(len(m) == 64 and kept[torch.as_tensor(m)].all() for m in ns["seen"])
