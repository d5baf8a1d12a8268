"""results/one_round.py: one round of held IIF and of held random from a saved theta(k), read on fresh data"""
import os
import sys

import pytest
import torch
import tyro

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results"))
import iif_variants as variants  # noqa: E402
import one_round  # noqa: E402

TINY = ["--env-id", "Acrobot-v1", "--env-backend", "gymnasium", "--num-steps", "256", "--update-epochs", "4",
        "--total-timesteps", "768", "--eval-episodes", "2", "--hold-step", "exact", "--critic-records", "all",
        "--save-states", "2"]


def state_row(tmp_path, *flags):
    variants.main(variants.resolve_args(tyro.cli(variants.Args, args=["--runs-dir", str(tmp_path), "--run-name", "r",
                                                                        *TINY, *flags])))
    args = one_round.load_args(tmp_path / "r")
    envs, eval_envs = (variants.make_vec(args, n, backend) for n, backend in zip((1, 2), args.backends))
    return args, one_round.one_state(args, tmp_path / "r" / "states" / "round_0002.pt", envs, eval_envs)


def test_both_rounds_start_from_the_state_and_are_held_to_standards_kl(tmp_path):
    args, row = state_row(tmp_path)
    assert row["round"] == 2 and row["n_dropped"] > 0 and set(row) == set(one_round.COLUMNS)
    for arm in ("iif", "random"):  # each held within 10 % of standard PPO's KL
        assert abs(row[f"kl_{arm}"] / row["kl_ref"] - 1) <= variants.HOLD_TOLERANCE
    assert row["gain_iif"] != row["gain_random"]


def test_when_nothing_is_dropped_the_two_arms_are_one_update(tmp_path):
    """The null check: p so small that floor(p n_negative) = 0: both rounds are standard PPO's, read alike"""
    _, row = state_row(tmp_path, "--filter-p", "0.001")
    assert row["n_dropped"] == 0 and row["kl_iif"] == row["kl_random"] == row["kl_ref"]
    assert row["gain_iif"] == row["gain_random"] and row["test_iif"] == row["test_random"]


def test_the_surrogate_gain_of_the_buffers_own_policy_is_zero():
    agent = variants.Agent(variants.gym.spaces.Box(-1, 1, (3,)), variants.gym.spaces.Discrete(2))
    obs, actions = torch.randn(64, 3), torch.randint(0, 2, (64,))
    with torch.no_grad():
        logprobs = agent(obs, actions, critic=False)[0]
    fresh = dict(obs=obs, actions=actions, logprobs=logprobs, advantages=torch.randn(64))
    assert one_round.surrogate_gain(agent, fresh) == 0.0
    fresh["logprobs"] = logprobs - 0.1  # a policy that raised every taken action's probability by e^0.1
    assert one_round.surrogate_gain(agent, fresh) == pytest.approx(
        float((torch.exp(torch.tensor(0.1)) - 1) * fresh["advantages"].mean() / fresh["advantages"].std()), rel=1e-5)
