"""Influence, TracIn, filtering and GAE of iif.py and iif_variants.py against plain reference computations."""
import copy
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch

import iif
import iif_variants as variants

ARGS = SimpleNamespace(clip_coef=0.2, vf_coef=0.5, ent_coef=0.01, minibatch_size=8, update_epochs=2, max_grad_norm=0.5,
                       adv_norm="buffer", influence_loss="full", influence_precond="none", target_kl=0.0,
                       score_log_std=True)

SPACES = {
    "mlp": (gym.spaces.Box(-1, 1, (6,)), gym.spaces.Discrete(3)),
    "cnn_shared": (gym.spaces.Box(0, 255, (7, 7, 3), np.uint8), gym.spaces.Discrete(7)),
    "gaussian": (gym.spaces.Box(-1, 1, (5,)), gym.spaces.Box(-1, 1, (2,))),
}


def make_agent_and_buffer(kind, n=40, seed=0):
    torch.manual_seed(seed)
    obs_space, act_space = SPACES[kind]
    agent = iif.Agent(obs_space, act_space).double()
    if agent.continuous:
        with torch.no_grad():
            agent.log_std.copy_(torch.randn(agent.log_std.shape) * 0.3)  # not all equal, so its gradient matters
    if agent.image:
        obs = torch.randint(0, 11, (n, 7, 7, 3)).double() * 20
    else:
        obs = torch.randn(n, *obs_space.shape, dtype=torch.float64)
    actions = torch.randn(n, *act_space.shape, dtype=torch.float64) if agent.continuous else \
        torch.randint(0, act_space.n, (n,))
    with torch.no_grad():
        logp, _, v = agent(obs, actions)
    # old log-probs a little off the current ones, so ratios differ from 1 and some records are clipped
    b = dict(obs=obs, actions=actions, logprobs=logp + 0.3 * torch.randn(n, dtype=torch.float64),
             advantages=torch.randn(n, dtype=torch.float64), returns=v + torch.randn(n, dtype=torch.float64))
    return agent, b


def reference_loss(agent, b, i, args):
    """One record's PPO loss, written out independently of iif.ppo_losses."""
    logp, ent, v = agent(b["obs"][i:i + 1], b["actions"][i:i + 1])
    ratio = torch.exp(logp - b["logprobs"][i])
    a = b["advantages"][i]
    surrogate = torch.minimum(ratio * a, torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef) * a)
    return (-surrogate + args.vf_coef * (v - b["returns"][i]) ** 2 - args.ent_coef * ent).sum()


def flat_grad(scalar, agent):
    grads = torch.autograd.grad(scalar, list(agent.parameters()), allow_unused=True)
    return torch.cat([(torch.zeros_like(p) if g is None else g).flatten() for p, g in zip(agent.parameters(), grads)])


def reference_influence(agent, b, idx, target, args):
    t_obs, t_act, t_w = target
    logp, _, _ = agent(t_obs, t_act)
    g = flat_grad((logp * t_w).mean(), agent)
    return torch.stack([-(g @ flat_grad(reference_loss(agent, b, int(i), args), agent)) for i in idx])


def targets(agent, b):
    return {
        "f_return": (b["obs"], b["actions"], b["advantages"]),
        "f_action": (b["obs"][3:4], b["actions"][3:4], torch.ones(1, dtype=torch.float64)),
    }


@pytest.mark.parametrize("kind", list(SPACES))
@pytest.mark.parametrize("target_name", ["f_return", "f_action"])
def test_influence_equals_per_record_autograd(kind, target_name):
    agent, b = make_agent_and_buffer(kind)
    target = targets(agent, b)[target_name]
    idx = torch.arange(len(b["advantages"]))
    ours = variants.influence(agent, b, idx, target, ARGS)
    ref = reference_influence(agent, b, idx, target, ARGS)
    assert ref.abs().max() > 1e-6 and (ref > 0).any() and (ref < 0).any()
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-10 * ref.abs().max().item())


@pytest.mark.parametrize("kind", list(SPACES))
def test_iif_py_influence_scores_the_policy_loss_with_buffer_normalised_advantages(kind):
    """iif.py's only scoring: g from f_return with the raw A_hat; l_i its policy terms, with A_hat normalised over
    B(k); the same as iif_variants.py's default flags"""
    agent, b = make_agent_and_buffer(kind)
    ours = iif.influence(agent, b, ARGS)
    target = (b["obs"], b["actions"], b["advantages"])
    no_value = SimpleNamespace(**{**vars(ARGS), "vf_coef": 0.0})
    idx = torch.arange(len(b["advantages"]))
    ref = reference_influence(agent, dict(b, advantages=iif.normalize(b["advantages"])), idx, target, no_value)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-10 * ref.abs().max().item())
    defaults = SimpleNamespace(**{**vars(ARGS), "adv_norm": "minibatch", "influence_loss": "policy"})
    assert torch.equal(ours, variants.influence(agent, b, idx, target, defaults, variants.scoring_advantages(b, defaults)))


def test_value_term_enters_influence_only_through_shared_parameters():
    # MLP: f_return does not depend on the critic, so the value coefficient cannot change the scores;
    # CNN: the value loss moves the shared extractor, so it must.
    for kind, should_change in (("mlp", False), ("cnn_shared", True)):
        agent, b = make_agent_and_buffer(kind)
        target = targets(agent, b)["f_return"]
        idx = torch.arange(len(b["advantages"]))
        a = variants.influence(agent, b, idx, target, ARGS)
        c = variants.influence(agent, b, idx, target, SimpleNamespace(**{**vars(ARGS), "vf_coef": 5.0}))
        assert (not torch.allclose(a, c, rtol=1e-6, atol=0)) == should_change, kind


@pytest.mark.parametrize("kind", ["mlp", "cnn_shared", "gaussian"])
def test_tracin_equals_explicit_step_by_step_sum(kind):
    agent, b = make_agent_and_buffer(kind, n=32)
    target = targets(agent, b)["f_return"]
    ref_agent = copy.deepcopy(agent)
    kept = torch.arange(32)[torch.arange(32) % 5 != 0]  # 25 kept records: 3 minibatches of 8, remainder 1
    optimizer = torch.optim.SGD(agent.parameters(), lr=0.05)
    n_updates, tracin = variants.ppo_update(agent, optimizer, b, kept, ARGS, np.random.default_rng(7), target)
    assert n_updates == 2 * 3

    rng = np.random.default_rng(7)
    ref = torch.zeros(32, dtype=torch.float64)
    params = list(ref_agent.parameters())
    scales = []
    for _ in range(ARGS.update_epochs):
        perm = kept[torch.as_tensor(rng.permutation(len(kept)))]
        for start in range(0, 24, 8):
            mb = perm[start:start + 8]
            step_scores = reference_influence(ref_agent, b, mb, target, ARGS)
            loss = sum(reference_loss(ref_agent, b, int(i), ARGS) for i in mb) / len(mb)
            grads = torch.autograd.grad(loss, params)
            norm = torch.sqrt(sum((g ** 2).sum() for g in grads))
            scales.append(min(1.0, ARGS.max_grad_norm / (norm.item() + 1e-6)))
            ref[mb] += scales[-1] * step_scores  # the step moved theta scale x as far as the unclipped gradient
            with torch.no_grad():
                for p, g in zip(params, grads):
                    p -= 0.05 * scales[-1] * g
    assert min(scales) < 0.9  # clipping is active in this test
    assert (ref[torch.arange(32) % 5 == 0] == 0).all()
    torch.testing.assert_close(tracin, ref, rtol=1e-5, atol=1e-10 * ref.abs().max().item())
    for p, q in zip(agent.parameters(), params):
        torch.testing.assert_close(p, q)


def test_snapshot_is_the_first_tracin_term():
    # one optimizer step on the whole buffer: TracIn reduces to the snapshot score at theta(k)
    agent, b = make_agent_and_buffer("mlp", n=8)
    target = targets(agent, b)["f_return"]
    snapshot = variants.influence(agent, b, torch.arange(8), target, ARGS)
    for max_grad_norm in (0.0, 0.5):
        one_step = SimpleNamespace(**{**vars(ARGS), "update_epochs": 1, "minibatch_size": 8,
                                      "max_grad_norm": max_grad_norm})
        _, tracin = variants.ppo_update(copy.deepcopy(agent), torch.optim.SGD(agent.parameters(), lr=0.1), b,
                                   torch.arange(8), one_step, np.random.default_rng(0), target)
        scale = tracin / snapshot  # clipping scales the step, and so its scores, by one factor
        torch.testing.assert_close(scale, scale[0].expand(8))
        assert (scale[0] == 1.0) if max_grad_norm == 0 else (scale[0] < 1.0)


# ---- filtering (Alg. 1, Stage II) ----

def test_influence_filter_drops_floor_p_of_negatives_most_negative_first():
    scores = torch.tensor([0.5, -3.0, -1.0, 2.0, -2.0, -0.5, 0.0, -4.0])  # 5 negatives
    kept, n_neg = variants.filter_records(scores, "influence", 0.5, torch.Generator().manual_seed(0), ties="drop")
    assert n_neg == 5
    assert sorted(torch.nonzero(~kept).flatten().tolist()) == [1, 7]  # floor(2.5) = 2: -4 and -3
    kept, _ = variants.filter_records(scores, "influence", 1.0, torch.Generator(), ties="drop")
    assert sorted(torch.nonzero(~kept).flatten().tolist()) == [1, 2, 4, 5, 7]  # p = 1: every negative, 0.0 kept
    kept, _ = variants.filter_records(scores, "influence", 0.1, torch.Generator(), ties="drop")
    assert kept.all()  # floor(0.5) = 0


def test_filter_ties_by_buffer_order_and_no_negatives():
    scores = torch.tensor([-1.0, 3.0, -1.0, -1.0, -1.0])
    kept, _ = variants.filter_records(scores, "influence", 0.5, torch.Generator(), ties="drop")
    assert torch.nonzero(~kept).flatten().tolist() == [0, 2]
    for method in ("influence", "random"):
        kept, n_neg = variants.filter_records(torch.tensor([0.0, 1.0, 2.0]), method, 1.0, torch.Generator(),
                                              ties="drop")
        assert n_neg == 0 and kept.all()
    kept, n_neg = variants.filter_records(torch.tensor([-1.0, -2.0]), "none", 1.0, torch.Generator(), ties="drop")
    assert n_neg == 2 and kept.all()


def test_random_filter_drops_the_same_count_uniformly():
    scores = torch.linspace(-1, 1, 101)  # 50 negatives
    gen = torch.Generator().manual_seed(0)
    drops = torch.zeros(101)
    for _ in range(400):
        kept, n_neg = variants.filter_records(scores, "random", 0.5, gen)
        assert n_neg == 50 and int((~kept).sum()) == 25
        drops += (~kept).float()
    # positive and negative records are dropped alike (each with probability 25/101)
    assert abs(drops[:50].mean() - drops[51:].mean()) < 0.1 * drops.mean()
    assert drops.min() > 0


def test_keep_ties_drops_only_records_strictly_below_the_cut():
    scores = torch.tensor([-2.0, 1.0, -3.0, -2.0, -1.0, -2.0, 0.5])  # 5 negatives: floor(0.5 x 5) = 2 to drop
    kept, _ = variants.filter_records(scores, "influence", 0.5, torch.Generator(), ties="drop")
    assert torch.nonzero(~kept).flatten().tolist() == [0, 2]  # -3, then the first -2 in buffer order
    for keep_ties in (iif.filter_records, variants.filter_records):
        kept, _ = keep_ties(scores, "influence", 0.5, torch.Generator())
        assert torch.nonzero(~kept).flatten().tolist() == [2]  # the cut's score is -2: every -2 stays
        kept, _ = keep_ties(scores, "random", 0.5, torch.Generator().manual_seed(0))
        assert int((~kept).sum()) == 1  # random drops as many as influence does under the same rule
        kept, _ = keep_ties(scores, "influence", 1.0, torch.Generator())
        assert torch.nonzero(~kept).flatten().tolist() == [0, 2, 3, 4, 5]  # p = 1: every negative either way
        kept, _ = keep_ties(-torch.ones(4), "influence", 1.0, torch.Generator())
        assert not kept.any()  # all negative and p = 1: no score left to cut at
        kept, n_neg = keep_ties(torch.tensor([-1.0, -2.0]), "none", 1.0, torch.Generator())
        assert n_neg == 2 and kept.all()


def test_ppo_diagnostics_are_cleanrls():
    """Each record's policy and value loss, entropy, approx KL (r - 1) - log r and clipped-or-not, as CleanRL's
    ppo.py computes them (it averages them over a minibatch), away from theta(k) so that ratios leave 1"""
    agent, b = make_agent_and_buffer("mlp", n=40)
    with torch.no_grad():
        for p in agent.parameters():
            p.add_(0.3 * torch.randn_like(p))
    args, parts = SimpleNamespace(clip_coef=0.1, vf_coef=0.5, ent_coef=0.01), {}
    iif.ppo_losses(agent, b, torch.arange(40), args, parts=parts)
    logp, ent, v = agent(b["obs"], b["actions"])
    logratio = (logp - b["logprobs"]).detach()
    ratio, adv = logratio.exp(), b["advantages"]
    expected = dict(pg_loss=torch.max(-adv * ratio, -adv * ratio.clamp(0.9, 1.1)), vf_loss=(v - b["returns"]) ** 2,
                    entropy=ent, approx_kl=(ratio - 1) - logratio, clip_frac=((ratio - 1).abs() > 0.1).double())
    for k, x in expected.items():
        torch.testing.assert_close(parts[k].double(), x.detach().double(), msg=k)
    assert 0 < float(parts["clip_frac"].mean()) < 1
    b["values"] = b["returns"] - b["advantages"]  # V(s) at theta(k), as GAE leaves it
    r, vals = b["returns"].numpy(), b["values"].numpy()
    assert iif.explained_variance(b) == pytest.approx(1 - np.var(r - vals, ddof=1) / np.var(r, ddof=1))


@pytest.mark.parametrize("kind", list(SPACES))
@pytest.mark.parametrize("n", [1, 40])
def test_act_draws_what_the_distributions_sample_draws(kind, n, monkeypatch):
    agent, b = make_agent_and_buffer(kind, n)
    agent.float()
    with torch.no_grad():
        agent.actor[-1].weight.mul_(300.0)  # far from uniform, as a trained policy: a wrong row or head draws otherwise
    obs = b["obs"].float()
    probs, multinomial = [], torch.multinomial  # a Categorical's draw: the same probabilities, bit for bit
    monkeypatch.setattr(torch, "multinomial", lambda p, *a: probs.append(p.clone()) or multinomial(p, *a))
    torch.manual_seed(1)
    drawn, after = agent.act(obs), torch.get_rng_state()
    torch.manual_seed(1)
    with torch.no_grad():
        expected = agent.dist(agent.features(obs)).sample()
    assert drawn.shape == expected.shape and drawn.dtype == expected.dtype
    assert torch.equal(drawn, expected) and torch.equal(after, torch.get_rng_state())  # and the same numbers used
    assert len(probs) == (0 if agent.continuous else 2) and all(torch.equal(p, probs[-1]) for p in probs)


def test_a_zero_score_is_not_negative():
    """n_negative counts the scores below 0; p = 1 drops those, and a record that scores exactly 0 stays"""
    scores = torch.tensor([0.0, -1.0, 0.0, -2.0, 1.0])
    for filter_records in (iif.filter_records, lambda *a: variants.filter_records(*a, ties="drop")):
        kept, n_neg = filter_records(scores, "influence", 1.0, torch.Generator())
        assert n_neg == 2 and kept.tolist() == [True, False, True, False, True]


@pytest.mark.parametrize("p", [0.29, 0.57, 0.58])
def test_floor_is_robust_to_float_rounding(p):
    """p x 100 negatives in floating point is 28.999.., 56.999.., 57.999..: the count must still be floor(100 p)"""
    scores = -torch.ones(100) - torch.arange(100) / 1000  # no ties
    assert p * 100 < round(p * 100)
    for drop in (lambda: iif.filter_records(scores, "influence", p, torch.Generator())[0],
                 lambda: variants.filter_records(scores, "influence", p, torch.Generator(), ties="drop")[0]):
        assert int((~drop()).sum()) == round(p * 100)


# ---- GAE ----

def reference_gae(rewards, values, next_values, terms, dones, gamma, lam):
    """A_t = sum_l (gamma lam)^l delta_{t+l}, summed explicitly up to the end of t's episode."""
    T, N = rewards.shape
    adv = torch.zeros(T, N, dtype=torch.float64)
    for e in range(N):
        delta = [rewards[t, e] + gamma * next_values[t, e] * (1 - terms[t, e]) - values[t, e] for t in range(T)]
        for t in range(T):
            total, u = 0.0, t
            while u < T:
                total += (gamma * lam) ** (u - t) * delta[u]
                if dones[u, e]:
                    break
                u += 1
            adv[t, e] = total
    return adv


@pytest.mark.parametrize("gamma, lam", [(0.99, 0.95), (0.9, 0.5)])
def test_gae_with_termination_and_truncation(gamma, lam):
    torch.manual_seed(0)
    T, N = 12, 2
    rewards, values = torch.randn(T, N, dtype=torch.float64), torch.randn(T, N, dtype=torch.float64)
    terms, truncs = torch.zeros(T, N, dtype=torch.float64), torch.zeros(T, N, dtype=torch.float64)
    terms[3, 0] = terms[9, 1] = 1
    truncs[7, 0] = truncs[4, 1] = 1
    dones = torch.clamp(terms + truncs, max=1)
    next_values = torch.cat([values[1:], torch.randn(1, N, dtype=torch.float64)])
    next_values[7, 0], next_values[4, 1] = 5.0, -5.0  # V(final observation) of the truncated episodes
    adv, ret = iif.compute_gae(rewards, values, next_values, terms, dones, gamma, lam)
    ref = reference_gae(rewards, values, next_values, terms, dones, gamma, lam)
    torch.testing.assert_close(adv, ref)
    torch.testing.assert_close(ret, ref + values)
    # the truncated step bootstraps from its final observation, the terminated one from nothing
    torch.testing.assert_close(adv[7, 0], rewards[7, 0] + gamma * 5.0 - values[7, 0])
    torch.testing.assert_close(adv[3, 0], rewards[3, 0] - values[3, 0])


def test_the_rollout_uses_the_flags_gamma_and_lambda():
    """collect_rollout's advantages are the GAE of its own rewards, values and episode ends at --gamma and
    --gae-lambda (not the defaults)"""
    args = iif.resolve_args(iif.Args(env_id="CartPole-v1", num_steps=64, num_envs=2, minibatch_size=64,
                                           total_timesteps=128, gamma=0.9, gae_lambda=0.5, env_backend="gymnasium"))
    torch.manual_seed(0)
    envs = iif.make_vec(args, 2, "gymnasium")
    agent = iif.Agent(envs.single_observation_space, envs.single_action_space)
    obs, _ = envs.reset(seed=0)
    b = iif.collect_rollout(agent, envs, obs, np.zeros((2, 2)), args)[0]
    assert b["dones"].sum() > 0  # episodes end inside the buffer: the cut matters
    shape = lambda k: b[k].view(64, 2).double()  # noqa: E731  record t * num_envs + e
    ref = reference_gae(*(shape(k) for k in ("rewards", "values", "next_values", "terminations", "dones")), 0.9, 0.5)
    torch.testing.assert_close(b["advantages"].view(64, 2).double(), ref, rtol=1e-5, atol=1e-5)


# ---- the baselines of App. C.4 and C.5 ----

def test_advantage_heuristics_drop_sign_mismatches_by_error_or_product():
    a_mc = torch.tensor([0.5, -0.2, 0.3, float("nan"), -0.4, 0.1], dtype=torch.float64)
    a_hat = torch.tensor([-0.1, 0.6, 0.2, -1.0, 0.1, -0.9], dtype=torch.float64)
    # mismatches: 0 (err .6, prod -.05), 1 (err .8, prod -.12), 4 (err .5, prod -.04), 5 (err 1.0, prod -.09)
    kept = variants.advantage_filter(a_mc, a_hat, "adv-error", 0.5)
    assert torch.nonzero(~kept).flatten().tolist() == [1, 5]
    kept = variants.advantage_filter(a_mc, a_hat, "adv-product", 0.5)
    assert sorted(torch.nonzero(~kept).flatten().tolist()) == [1, 5]
    kept = variants.advantage_filter(a_mc, a_hat, "adv-product", 0.25)
    assert torch.nonzero(~kept).flatten().tolist() == [1]  # -0.12 is the most negative product
    kept = variants.advantage_filter(a_mc, a_hat, "adv-error", 1.0)
    assert sorted(torch.nonzero(~kept).flatten().tolist()) == [0, 1, 4, 5]  # never the nan or the agreeing ones


def test_td_sampling_probabilities_follow_the_rank_of_the_td_error():
    b = dict(rewards=torch.tensor([1.0, 0.0, 0.0]), values=torch.tensor([0.0, 0.0, 1.0]),
             next_values=torch.tensor([5.0, 0.1, 0.0]), terminations=torch.tensor([1.0, 0.0, 0.0]))
    # TD errors: 1 (terminal: no bootstrap), 0.099, -1.0; ties broken by buffer order: ranks 1, 3, 2
    p = variants.td_sampling_probs(b, 0.99, alpha=0.6)
    w = np.array([1.0, 3.0 ** -0.6, 2.0 ** -0.6])
    np.testing.assert_allclose(p, w / w.sum())


def test_sampled_minibatches_follow_the_given_probabilities():
    agent, b = make_agent_and_buffer("mlp", n=16)
    target = targets(agent, b)["f_return"]
    p = np.zeros(16)
    p[[2, 9]] = 0.5
    no_clip = SimpleNamespace(**{**vars(ARGS), "max_grad_norm": 0.0})  # unscaled steps: scores count draws
    _, tracin = variants.ppo_update(agent, torch.optim.SGD(agent.parameters(), lr=0.0), b, torch.arange(16), no_clip,
                               np.random.default_rng(0), target, sample_p=p)
    assert set(torch.nonzero(tracin).flatten().tolist()) == {2, 9}
    # with lr 0 every step scores at theta(k): the summed TracIn counts each draw of a record
    snapshot = variants.influence(agent, b, torch.arange(16), target, ARGS)
    draws = tracin[[2, 9]] / snapshot[[2, 9]]
    assert torch.allclose(draws, draws.round()) and draws.round().sum().item() == ARGS.update_epochs * 16


# ---- the released code's choices (README, "What changes the numbers") ----

def test_policy_only_influence_equals_per_record_autograd_without_the_value_term():
    policy = SimpleNamespace(**{**vars(ARGS), "influence_loss": "policy"})
    for kind in ("mlp", "cnn_shared"):
        agent, b = make_agent_and_buffer(kind)
        target = targets(agent, b)["f_return"]
        idx = torch.arange(len(b["advantages"]))
        ours = variants.influence(agent, b, idx, target, policy)
        ref = reference_influence(agent, b, idx, target, SimpleNamespace(**{**vars(ARGS), "vf_coef": 0.0}))
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-10 * ref.abs().max().item())
        full = variants.influence(agent, b, idx, target, ARGS)
        # separate networks: the value term cannot reach f's parameters; the shared CNN: it does
        assert torch.allclose(ours, full, rtol=1e-9, atol=0) == (kind == "mlp"), kind


def test_minibatch_normalisation_after_filtering(monkeypatch):
    agent, b = make_agent_and_buffer("mlp", n=40)
    b["advantages"] = 5.0 + 3.0 * b["advantages"]  # raw GAE estimates: far from mean 0, std 1
    kept = torch.arange(40)[torch.arange(40) % 4 != 0]  # 30 kept: 3 minibatches of 8 per epoch
    seen, losses = [], iif.ppo_losses

    def spy(agent, b, idx, args, params=None, adv=None, vf_coef=None, parts=None):
        seen.append((idx.clone(), adv.clone()))
        return losses(agent, b, idx, args, params, adv, vf_coef, parts)

    monkeypatch.setattr(variants, "ppo_losses", spy)
    mb_args = SimpleNamespace(**{**vars(ARGS), "adv_norm": "minibatch"})
    variants.ppo_update(agent, torch.optim.SGD(agent.parameters(), lr=0.01), b, kept, mb_args, np.random.default_rng(0))
    assert len(seen) == 2 * 3
    for idx, adv in seen:
        assert set(idx.tolist()) <= set(kept.tolist())
        assert abs(adv.mean().item()) < 1e-9 and abs(adv.std().item() - 1) < 1e-6
        torch.testing.assert_close(adv, iif.normalize(b["advantages"][idx]))
    seen.clear()
    variants.ppo_update(agent, torch.optim.SGD(agent.parameters(), lr=0.01), b, kept, ARGS, np.random.default_rng(0))
    assert all(torch.equal(adv, b["advantages"][idx]) for idx, adv in seen)  # buffer mode: as stored


@pytest.mark.parametrize("adv_norm", ["buffer", "minibatch"])
@pytest.mark.parametrize("target_adv", ["raw", "normalized"])
def test_main_passes_the_chosen_advantages_to_target_and_scoring(tmp_path, monkeypatch, adv_norm, target_adv):
    import tyro
    calls, scorer = [], variants.influence

    def spy(agent, b, idx, target, args, adv=None, precond=None):
        calls.append((dict(b), target, adv))
        return scorer(agent, b, idx, target, args, adv, precond)

    monkeypatch.setattr(variants, "influence", spy)
    args = variants.resolve_args(tyro.cli(variants.Args, args=[
        "--env-id", "Acrobot-v1", "--num-steps", "256", "--total-timesteps", "256", "--update-epochs", "1",
        "--eval-episodes", "1", "--runs-dir", str(tmp_path), "--run-name", "r", "--adv-norm", adv_norm,
        "--target-adv", target_adv]))
    variants.main(args)
    (b, (t_obs, t_actions, t_weights), adv), = calls
    raw = b["returns"] - b["values"]  # the GAE estimate A_hat
    assert raw.mean().abs() > 0.5 * raw.std()  # Acrobot's early A_hat is far from mean 0: the choice matters
    torch.testing.assert_close(t_weights, raw if target_adv == "raw" else iif.normalize(raw), rtol=1e-4, atol=1e-4)
    assert torch.equal(t_obs, b["obs"]) and torch.equal(t_actions, b["actions"])
    torch.testing.assert_close(adv, iif.normalize(raw), rtol=1e-4, atol=1e-4)  # l_i sees normalised A_hat in both
    torch.testing.assert_close(b["advantages"], iif.normalize(raw) if adv_norm == "buffer" else raw,
                               rtol=1e-4, atol=1e-4)  # what training starts from


@pytest.mark.parametrize("kind", list(SPACES))
def test_adam_preconditioned_influence_equals_per_record_autograd(kind):
    """<grad f, -P grad l_i> with P = 1 / (sqrt(v_hat) + eps) from the optimizer's state, record by record"""
    agent, b = make_agent_and_buffer(kind)
    optimizer = torch.optim.Adam(agent.parameters(), lr=1e-3, eps=1e-5)
    assert variants.adam_precond(agent, optimizer) is None  # no second moment before the first step
    for _ in range(3):
        optimizer.zero_grad()
        iif.ppo_losses(agent, b, torch.arange(40), ARGS).mean().backward()
        optimizer.step()
    precond = variants.adam_precond(agent, optimizer)
    state = optimizer.state[agent.actor[0].weight]
    v_hat = state["exp_avg_sq"] / (1 - 0.999 ** 3)
    torch.testing.assert_close(precond["actor.0.weight"], 1 / (v_hat.sqrt() + 1e-5))
    idx = torch.arange(10)
    target = targets(agent, b)["f_return"]
    ours = variants.influence(agent, b, idx, target, ARGS, precond=precond)
    logp, _, _ = agent(*target[:2])
    g = flat_grad((logp * target[2]).mean(), agent)
    p = torch.cat([precond[name].flatten() for name, _ in agent.named_parameters()])
    ref = torch.stack([-(g @ (p * flat_grad(reference_loss(agent, b, int(i), ARGS), agent))) for i in idx])
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)
    assert not torch.allclose(ours, variants.influence(agent, b, idx, target, ARGS))  # P changes the scores


def test_target_agreement_is_the_mean_pairwise_cosine_of_slices():
    agent, b = make_agent_and_buffer("mlp", n=40)
    target = targets(agent, b)["f_return"]
    grads = []
    for part in torch.arange(40).tensor_split(4):
        logp, _, _ = agent(target[0][part], target[1][part])
        grads.append(flat_grad((logp * target[2][part]).mean(), agent))
    cos = [torch.nn.functional.cosine_similarity(grads[i], grads[j], dim=0) for i in range(4) for j in range(4) if i < j]
    def agreement(obs, actions, weights):
        return variants.target_agreement(agent, dict(obs=obs, actions=actions, advantages=weights), 4)

    assert agreement(*target) == pytest.approx(float(torch.stack(cos).mean()), rel=1e-10)
    same = tuple(x[:10].repeat(4, *[1] * (x.dim() - 1)) for x in target)  # four copies of one slice
    assert agreement(*same) == pytest.approx(1.0, rel=1e-10)
    flipped = (same[0], same[1], torch.cat([same[2][:20], -same[2][20:]]))  # two slices point the other way
    assert agreement(*flipped) == pytest.approx((2 * 1 + 4 * -1) / 6, rel=1e-10)


def test_target_kl_stops_the_update_early():
    agent, b = make_agent_and_buffer("mlp", n=64)
    b["logprobs"] = agent(b["obs"], b["actions"])[0].detach()  # pi_theta(k) sampled the buffer

    def update(target_kl):
        moved = copy.deepcopy(agent)
        args = SimpleNamespace(**{**vars(ARGS), "max_grad_norm": 0.0, "update_epochs": 10, "target_kl": target_kl})
        n, _ = variants.ppo_update(moved, torch.optim.Adam(moved.parameters(), lr=1e-2), b, torch.arange(64), args,
                              np.random.default_rng(0))
        return n, iif.approx_kl(moved, b)

    n_full, kl_full = update(0.0)
    assert n_full == 10 * 8 and update(1e9)[0] == n_full  # 0 disables the check; a loose bound never stops
    n, kl = update(1e-3)
    assert 0 < n < n_full and 0 < kl < kl_full  # cut short, nearer theta(k)


def test_no_score_log_std_leaves_the_gaussian_log_std_out():
    agent, b = make_agent_and_buffer("gaussian")
    idx, target = torch.arange(10), targets(agent, b)["f_return"]
    without = SimpleNamespace(**{**vars(ARGS), "score_log_std": False})
    logp, _, _ = agent(*target[:2])
    g = flat_grad((logp * target[2]).mean(), agent)
    g[[name == "log_std" for name, p in agent.named_parameters() for _ in range(p.numel())]] = 0
    ref = torch.stack([-(g @ flat_grad(reference_loss(agent, b, int(i), ARGS), agent)) for i in idx])
    torch.testing.assert_close(variants.influence(agent, b, idx, target, without), ref, rtol=1e-10, atol=1e-12)
    assert not torch.allclose(variants.influence(agent, b, idx, target, ARGS), ref)  # log-std does count by default


def test_iif_py_update_is_the_variants_update_with_the_released_choices():
    agent, b = make_agent_and_buffer("gaussian", n=40)
    kept = torch.arange(40)[torch.arange(40) % 4 != 0]  # 30 kept: 3 minibatches of 8 and a remainder
    paper, variant = copy.deepcopy(agent), copy.deepcopy(agent)
    args = SimpleNamespace(**{**vars(ARGS), "adv_norm": "minibatch"})
    n, _ = iif.ppo_update(paper, torch.optim.SGD(paper.parameters(), lr=0.05), b, kept, args, np.random.default_rng(3))
    m, _ = variants.ppo_update(variant, torch.optim.SGD(variant.parameters(), lr=0.05), b, kept, args,
                               np.random.default_rng(3))
    assert n == m == 2 * 3
    for p, q, r in zip(paper.parameters(), variant.parameters(), agent.parameters()):
        assert torch.equal(p, q) and not torch.equal(p, r)
