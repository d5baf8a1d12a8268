"""iif_variants.py --hold-step: the round's update held to the KL that a reference update (--hold-to: standard
PPO's, or IIF's) takes from theta(k) on B(k); each try from theta(k)'s own state, only the policy's rate scaled."""
import copy
import csv
import dataclasses

import numpy as np
import pytest
import torch
import tyro

import iif
import iif_variants as variants
from test_backend import CORRIDOR, Killed, kill_at

SHORT = ["--env-id", "Acrobot-v1", "--env-backend", "gymnasium", "--num-steps", "256", "--minibatch-size", "64",
         "--update-epochs", "4", "--total-timesteps", "768", "--eval-episodes", "2"]


def run(tmp_path, *flags, name="r"):
    variants.main(variants.resolve_args(tyro.cli(variants.Args, args=["--runs-dir", str(tmp_path), "--run-name",
                                                                        name, *SHORT, *flags])))
    with open(tmp_path / name / "metrics.csv") as f:
        return list(csv.DictReader(f))


def untimed(rows, drop=()):
    return [{k: v for k, v in r.items() if not k.startswith("t_") and k not in drop} for r in rows]


def setup(tmp_path, *flags):
    """args, an agent and its held_optimizer, the numpy generator and one rollout buffer B(0)"""
    args = variants.resolve_args(tyro.cli(variants.Args, args=["--runs-dir", str(tmp_path), *SHORT,
                                                               "--hold-step", "exact", *flags]))
    torch.manual_seed(0)
    envs = variants.make_vec(args, 1, "gymnasium")
    agent = iif.Agent(envs.single_observation_space, envs.single_action_space)
    next_obs, _ = envs.reset(seed=0)
    b = iif.collect_rollout(agent, envs, next_obs, np.zeros((2, 1)), args)[0]
    return args, agent, variants.held_optimizer(agent, args), np.random.default_rng(0), b


def snapshot(agent, optimizer, rng):
    return copy.deepcopy(agent.state_dict()), copy.deepcopy(optimizer.state_dict()), copy.deepcopy(
        rng.bit_generator.state)


def from_snapshot(snap, args, scale=1.0):
    """theta(k)'s agent, optimizer (policy's rate x scale) and generator, rebuilt from copies"""
    agent = iif.Agent(iif.gym.spaces.Box(-np.inf, np.inf, (6,)), iif.gym.spaces.Discrete(3))
    agent.load_state_dict(snap[0])
    optimizer = variants.held_optimizer(agent, args)
    optimizer.load_state_dict(copy.deepcopy(snap[1]))
    optimizer.param_groups[0]["lr"] = args.learning_rate * scale
    rng = np.random.default_rng()
    rng.bit_generator.state = copy.deepcopy(snap[2])
    return agent, optimizer, rng


def same_optimizer_state(a, b):
    sa, sb = a.state_dict()["state"], b.state_dict()["state"]
    return sa.keys() == sb.keys() and all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i])


def test_exact_lands_within_ten_percent_of_standards_kl_and_keeps_that_update(tmp_path):
    held = run(tmp_path, "--hold-step", "exact", "--save-rounds")
    standard = run(tmp_path, "--filter-method", "none", name="std")
    assert list(held[0]) == variants.METRICS + variants.HOLD_COLUMNS
    # round 0: one theta(0), one B(0) and one minibatch order: the copy's KL is standard PPO's own
    assert float(held[0]["kl_ref"]) == float(standard[0]["kl"])
    for r in held:
        ratio = float(r["kl"]) / float(r["kl_ref"])
        assert abs(ratio - 1) <= variants.HOLD_TOLERANCE or int(r["n_tries"]) == variants.HOLD_TRIES, r
        assert int(r["n_dropped"]) > 0 and int(r["n_tries"]) >= 1 and float(r["t_hold"]) > 0
    assert any(int(r["n_tries"]) > 1 for r in held)  # the first multiple tried missed at least once
    # theta(1) is IIF's update from theta(0) on B(0)'s kept records, the policy's rate x lr_scale, and nothing else
    r0, r1 = (torch.load(tmp_path / "r" / "rounds" / f"round_000{k}.pt") for k in (0, 1))
    args = variants.resolve_args(tyro.cli(variants.Args, args=["--runs-dir", str(tmp_path / "x"), *SHORT]))
    agent = iif.Agent(iif.gym.spaces.Box(-np.inf, np.inf, (6,)), iif.gym.spaces.Discrete(3))
    agent.load_state_dict(r0["state_dict"])
    optimizer = variants.held_optimizer(agent, args)
    optimizer.param_groups[0]["lr"] *= float(held[0]["lr_scale"])
    variants.ppo_update(agent, optimizer, r0, torch.nonzero(r0["kept"])[:, 0], args, np.random.default_rng(1))
    assert all(torch.equal(agent.state_dict()[k], r1["state_dict"][k]) for k in r1["state_dict"])


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_every_try_starts_from_theta_ks_own_state_and_the_kept_one_is_a_fresh_update(tmp_path, monkeypatch,
                                                                                      optimizer):
    """Adam's moments and step count are copied, not shared: after at least 3 tries, the state is one update from
    theta(k) at the kept rate, bit for bit (agent, Adam's state, the generator), in each of 2 rounds, and Adam's step
    count is the updates kept"""
    monkeypatch.setattr(variants, "HOLD_TOLERANCE", 0.0)  # no try is close enough: all HOLD_TRIES run
    args, agent, opt, rng, b = setup(tmp_path, "--optimizer", optimizer, "--learning-rate", "3e-3")
    variants.ppo_update(agent, opt, b, torch.arange(256), args, rng)  # Adam's state is not empty at theta(k)
    kept = torch.ones(256, dtype=torch.bool)
    kept[torch.randperm(256, generator=torch.Generator().manual_seed(0))[:96]] = False
    steps, scale = 4 * (256 // 64), 1.0
    for k in range(2):
        snap = snapshot(agent, opt, rng)
        n, held = variants.held_update(agent, opt, b, kept, kept >= 0, args, rng, scale)
        assert held["n_tries"] == variants.HOLD_TRIES and held["lr_scale"] != 1.0
        fresh, fresh_opt, fresh_rng = from_snapshot(snap, args, held["lr_scale"])
        assert variants.ppo_update(fresh, fresh_opt, b, torch.nonzero(kept)[:, 0], args, fresh_rng)[0] == n
        assert all(torch.equal(v, fresh.state_dict()[key]) for key, v in agent.state_dict().items())
        assert same_optimizer_state(opt, fresh_opt)
        assert rng.bit_generator.state == fresh_rng.bit_generator.state
        assert [g["lr"] for g in opt.param_groups] == [args.learning_rate] * 2  # the next round starts at lr
        steps, scale = steps + n, held["lr_scale"]
        if optimizer == "adam":
            assert {float(s["step"]) for s in opt.state.values()} == {steps}


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_the_critic_learns_as_in_the_unheld_update_on_the_same_records(tmp_path, optimizer):
    """Separate networks: only the policy's step is held; the critic ends where the update at lr leaves it"""
    args, agent, opt, rng, b = setup(tmp_path, "--optimizer", optimizer)
    kept = torch.ones(256, dtype=torch.bool)
    kept[:64] = False
    snap = snapshot(agent, opt, rng)
    _, held = variants.held_update(agent, opt, b, kept, kept >= 0, args, rng, 1.0)
    assert held["n_tries"] >= 1 and held["lr_scale"] != 1.0
    unheld, unheld_opt, unheld_rng = from_snapshot(snap, args)
    variants.ppo_update(unheld, unheld_opt, b, torch.nonzero(kept)[:, 0], args, unheld_rng)
    critic = [k for k in agent.state_dict() if k.startswith("critic.")]
    assert critic and all(torch.equal(agent.state_dict()[k], unheld.state_dict()[k]) for k in critic)
    assert not torch.equal(agent.state_dict()["actor.4.weight"], unheld.state_dict()["actor.4.weight"])


def test_the_policys_group_holds_a_shared_cnn_and_the_groups_update_as_one():
    """An image agent: the hold's group 0 is the CNN shared by both heads and the actor, group 1 the critic; with
    both at lr, the two groups take the very step that make_optimizer's one group takes"""
    agent = iif.Agent(iif.gym.spaces.Box(0, 255, (7, 7, 3)), iif.gym.spaces.Discrete(7))
    args = variants.resolve_args(tyro.cli(variants.Args, args=["--env-id", "MiniGrid-Empty-8x8-v0", "--optimizer",
                                                               "adam"]))
    groups = variants.held_optimizer(agent, args).param_groups
    names = {id(p): n for n, p in agent.named_parameters()}
    assert {names[id(p)].split(".")[0] for p in groups[0]["params"]} == {"extractor", "actor"}
    assert {names[id(p)].split(".")[0] for p in groups[1]["params"]} == {"critic"}
    assert len(groups[0]["params"]) + len(groups[1]["params"]) == len(list(agent.parameters()))
    torch.manual_seed(0)
    b = dict(obs=torch.randint(0, 255, (128, 7, 7, 3)).float(), actions=torch.randint(0, 7, (128,)),
             advantages=torch.randn(128), returns=torch.randn(128))
    with torch.no_grad():
        b["logprobs"], _, b["values"] = agent(b["obs"], b["actions"])
    two = copy.deepcopy(agent)
    for net, opt in [(agent, iif.make_optimizer(agent, args)), (two, variants.held_optimizer(two, args))]:
        variants.ppo_update(net, opt, b, torch.arange(128), args, np.random.default_rng(0))
    assert all(torch.equal(v, two.state_dict()[k]) for k, v in agent.state_dict().items())


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_standard_ppo_through_the_hold_path_is_standard_ppo_bit_for_bit(tmp_path, optimizer):
    """The null check: holding standard PPO to its own step changes nothing (rows, generators, final weights)"""
    plain = run(tmp_path, "--filter-method", "none", "--optimizer", optimizer, name="plain")
    held = run(tmp_path, "--filter-method", "none", "--optimizer", optimizer, "--hold-step", "exact", name="held")
    assert untimed(held, variants.HOLD_COLUMNS) == untimed(plain)
    assert all(r["n_tries"] == "0" and r["lr_scale"] == "1.0" and r["kl_ref"] == r["kl"] for r in held)
    a, b = (torch.load(tmp_path / n / "agent.pt") for n in ("plain", "held"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_held_random_drops_as_many_records_as_held_iif_and_is_held_alike(tmp_path):
    """The control: random dropping held to the same KL. One theta(0), one B(0): the same count dropped, the same
    reference KL"""
    iif_rows = run(tmp_path, "--hold-step", "exact", name="iif")
    rand = run(tmp_path, "--hold-step", "exact", "--filter-method", "random", name="random")
    assert rand[0]["n_dropped"] == iif_rows[0]["n_dropped"] != "0" and rand[0]["kl_ref"] == iif_rows[0]["kl_ref"]
    for r in rand:
        assert int(r["n_tries"]) >= 1
        assert abs(float(r["kl"]) / float(r["kl_ref"]) - 1) <= variants.HOLD_TOLERANCE or \
            int(r["n_tries"]) == variants.HOLD_TRIES


def test_lifted_standard_trains_every_record_at_iifs_step(tmp_path):
    """--filter-method none --hold-to influence: standard PPO's update, its rate scaled until its KL is that of IIF's
    update from the same theta(k) (round 0: IIF's own run's KL)"""
    iif_rows = run(tmp_path, "--filter-method", "influence", name="iif")
    lifted = run(tmp_path, "--filter-method", "none", "--hold-step", "exact", "--hold-to", "influence", name="lift")
    assert float(lifted[0]["kl_ref"]) == float(iif_rows[0]["kl"])
    for r in lifted:
        assert r["n_dropped"] == "0" and int(r["n_updates"]) == 4 * 4 and int(r["n_tries"]) >= 1
        assert abs(float(r["kl"]) / float(r["kl_ref"]) - 1) <= variants.HOLD_TOLERANCE or \
            int(r["n_tries"]) == variants.HOLD_TRIES
    assert any(float(r["lr_scale"]) > 1 for r in lifted)


def test_td_weights_reach_the_held_update(tmp_path):
    """App. C.5's sampling probabilities: every record kept, yet not standard PPO's update, so every round is held"""
    rows = run(tmp_path, "--hold-step", "exact", "--filter-method", "td-weight")
    standard = run(tmp_path, "--filter-method", "none", name="std")
    assert all(r["n_dropped"] == "0" and int(r["n_tries"]) >= 1 for r in rows)
    assert rows[0]["kl_ref"] == standard[0]["kl"] != rows[0]["kl"]


def test_grad_norm_tries_once_at_the_gradient_sums_ratio(tmp_path):
    rows = run(tmp_path, "--hold-step", "grad-norm")
    assert all(r["n_tries"] == "1" and 0 < float(r["lr_scale"]) for r in rows)
    assert len({r["lr_scale"] for r in rows}) == len(rows)  # computed each round


def test_next_scale_lands_on_a_power_law():
    """Where KL = c x scale^2, one try is enough; where KL = c x scale^3, the secant finds it on the next"""
    for power in (2, 3):
        tries = [(1.0, 0.5 ** 1 * 1.0 ** power, 0.0)]
        target = 0.5 * 0.2 ** power
        s = variants.next_scale(tries, target)
        if power != 2:
            tries.append((s, 0.5 * s ** power, 0.0))
            s = variants.next_scale(tries, target)
        assert s == pytest.approx(0.2)
    assert variants.next_scale([(1.0, 0.0, 0.0)], 0.1) == 4.0  # no step at all: a larger rate


def test_a_round_that_drops_nothing_is_standard_ppo(tmp_path):
    rows = run(tmp_path, "--hold-step", "exact", "--filter-method", "random", "--filter-p", "0.001")
    for r in rows:  # floor(0.001 x n_negative) = 0
        assert r["n_dropped"] == "0" and r["n_tries"] == "0" and float(r["kl"]) == float(r["kl_ref"])


def test_a_killed_held_run_resumes_as_if_never_killed(tmp_path, monkeypatch):
    """The multiple a round starts from is the last round's: a resumed run takes it from the checkpoint"""
    def corridor(sub, *extra):
        variants.main(variants.resolve_args(tyro.cli(variants.Args, args=[
            "--runs-dir", str(tmp_path / sub), "--run-name", "r", *CORRIDOR, "--hold-step", "exact", "--min-agreement",
            "-1", *extra])))
        with open(tmp_path / sub / "r" / "metrics.csv") as f:
            return list(csv.DictReader(f))
    full = corridor("full")
    with monkeypatch.context() as m:
        kill_at(m, "evaluate", 3)
        with pytest.raises(Killed):
            corridor("cut")
    cut = corridor("cut", "--resume")
    assert len({r["lr_scale"] for r in full[:3]}) > 1  # the multiple moved before the kill
    drop = [c for c in full[0] if c.startswith("t_")]
    assert [{k: v for k, v in r.items() if k not in drop} for r in cut] == \
        [{k: v for k, v in r.items() if k not in drop} for r in full]


@pytest.mark.parametrize("flags", [["--target-kl", "0.02"], ["--influence-mode", "tracin", "--save-rounds"],
                                   ["--hold-to", "influence", "--hold-step", "grad-norm"],
                                   ["--hold-to", "influence", "--hold-step", "none"]])
def test_hold_step_flags_that_cannot_go_together(tmp_path, flags):
    with pytest.raises(SystemExit, match="--hold-"):
        variants.resolve_args(tyro.cli(variants.Args, args=["--runs-dir", str(tmp_path), "--run-name", "r", *SHORT,
                                                            "--hold-step", "exact", *flags]))


def test_reseeding_after_the_first_rollout_shares_it_and_nothing_after(tmp_path):
    """--reseed-from 0: round 0's rollout is the run's own, its update and everything after draw other numbers; past the
    last round, nothing changes (the null check)"""
    plain = run(tmp_path, "--filter-method", "none", name="plain")
    late = run(tmp_path, "--filter-method", "none", "--reseed-from", "3", name="late")  # 3 rounds: never reached
    early = run(tmp_path, "--filter-method", "none", "--reseed-from", "0", name="early")
    assert untimed(late) == untimed(plain)
    assert early[0]["train_return"] == plain[0]["train_return"] and early[0]["n_negative"] == plain[0]["n_negative"]
    assert early[0]["kl"] != plain[0]["kl"] and early[1]["kl"] != plain[1]["kl"]


@pytest.mark.parametrize("image", [False, True])
def test_the_critic_on_every_record_changes_nothing_when_nothing_is_dropped(tmp_path, image):
    """The null check of --critic-records all: with the filter off (and held standard PPO, which holds nothing) the
    run is standard PPO's, rows and weights bit for bit; on MiniGrid too, where the CNN is shared"""
    env = ["--env-id", "MiniGrid-Empty-8x8-v0", "--env-backend", "gymnasium"] if image else []
    plain = run(tmp_path, *env, "--filter-method", "none", name="plain")
    for name, flags in [("all", []), ("held", ["--hold-step", "exact"])]:
        rows = run(tmp_path, *env, "--filter-method", "none", "--critic-records", "all", *flags, name=name)
        assert untimed(rows, variants.HOLD_COLUMNS) == untimed(plain)
        a, b = (torch.load(tmp_path / n / "agent.pt") for n in ("plain", name))
        assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
@pytest.mark.parametrize("method", ["influence", "random"])
def test_with_the_critic_on_every_record_a_held_update_trains_standard_ppos_critic(tmp_path, optimizer, method):
    """--critic-records all: after a held update of kept records (3 tries or more, the policy's rate scaled), the
    critic (and its Adam state) is the one the unheld standard update on all records leaves, bit for bit; the policy
    is not, and it took as many steps as the kept records fill"""
    args, agent, opt, rng, b = setup(tmp_path, "--optimizer", optimizer, "--critic-records", "all")
    scores = variants.influence(agent, b, torch.arange(256), variants.make_target(agent, b, args), args,
                                variants.scoring_advantages(b, args))
    kept, _ = variants.filter_records(scores, method, 0.5, torch.Generator().manual_seed(0))
    assert 0 < int((~kept).sum()) < 128
    snap = snapshot(agent, opt, rng)
    n, held = variants.held_update(agent, opt, b, kept, kept >= 0, args, rng, 1.0)
    assert held["n_tries"] >= 1 and held["lr_scale"] != 1.0 and n == 4 * (256 // 64)
    standard, standard_opt, standard_rng = from_snapshot(snap, args)  # standard PPO as iif.py runs it
    variants.ppo_update(standard, standard_opt, b, torch.arange(256), dataclasses.replace(args, critic_records="kept"),
                        standard_rng)
    critic = [k for k in agent.state_dict() if k.startswith("critic.")]
    assert critic and all(torch.equal(agent.state_dict()[k], standard.state_dict()[k]) for k in critic)
    assert not torch.equal(agent.state_dict()["actor.4.weight"], standard.state_dict()["actor.4.weight"])
    if optimizer == "adam":  # the critic's moments too; the actor's steps are the kept records' minibatches
        names = {id(p): n for n, p in agent.named_parameters()}
        order = [names[id(p)] for g in opt.param_groups for p in g["params"]]
        state, ref = opt.state_dict()["state"], standard_opt.state_dict()["state"]
        for i, name in enumerate(order):
            if name.startswith("critic."):
                assert all(torch.equal(state[i][k], ref[i][k]) for k in state[i])
            else:
                assert float(state[i]["step"]) == 4 * (int(kept.sum()) // 64)


def test_with_the_critic_on_every_record_a_shared_cnn_learns_at_the_critics_rate():
    """Image agents under the hold: the CNN goes to the critic's group and the policy loss's gradient into it is
    scaled by the policy's multiple s, so one SGD step moves the CNN by -lr (s g_policy + g_critic): linear in s,
    the actor not at all at s = 0"""
    agent = iif.Agent(iif.gym.spaces.Box(0, 255, (7, 7, 3)), iif.gym.spaces.Discrete(7))
    args = variants.resolve_args(tyro.cli(variants.Args, args=[
        "--env-id", "MiniGrid-Empty-8x8-v0", "--env-backend", "gymnasium", "--critic-records", "all",
        "--update-epochs", "1"]))
    groups = variants.held_optimizer(agent, args).param_groups
    names = {id(p): n for n, p in agent.named_parameters()}
    assert {names[id(p)].split(".")[0] for p in groups[0]["params"]} == {"actor"}
    assert {names[id(p)].split(".")[0] for p in groups[1]["params"]} == {"critic", "extractor"}
    torch.manual_seed(0)
    b = dict(obs=torch.randint(0, 255, (64, 7, 7, 3)).float(), actions=torch.randint(0, 7, (64,)),
             advantages=torch.randn(64), returns=torch.randn(64))
    with torch.no_grad():
        b["logprobs"], _, b["values"] = agent(b["obs"], b["actions"])

    def step(scale):  # one minibatch: one step
        net = copy.deepcopy(agent)
        opt = variants.held_optimizer(net, args)
        opt.param_groups[0]["lr"] *= scale
        assert variants.ppo_update(net, opt, b, torch.arange(64), args, np.random.default_rng(0),
                                   trunk_scale=scale)[0] == 1
        return {k: v - agent.state_dict()[k] for k, v in net.state_dict().items()}
    zero, half, one = step(0.0), step(0.5), step(1.0)
    for k in one:
        if k.startswith("actor."):
            assert torch.equal(zero[k], torch.zeros_like(zero[k])) and not torch.equal(one[k], zero[k])
        if k.startswith("extractor."):
            assert not torch.allclose(one[k], zero[k], atol=1e-9)
            assert torch.allclose(half[k], (zero[k] + one[k]) / 2, atol=1e-7)
        if k.startswith("critic."):  # the critic's own layers see the policy only through the CNN: not at all
            assert torch.equal(zero[k], one[k])


@pytest.mark.parametrize("flags", [["--target-kl", "0.02"], ["--influence-mode", "tracin", "--save-rounds"],
                                   ["--filter-method", "td-weight"]])
def test_critic_records_all_refuses_what_it_cannot_pair(tmp_path, flags):
    with pytest.raises(SystemExit, match="--critic-records all"):
        variants.resolve_args(tyro.cli(variants.Args, args=["--runs-dir", str(tmp_path), *SHORT, "--critic-records",
                                                            "all", *flags]))


def test_save_states_keeps_every_nth_rounds_starting_state(tmp_path):
    """--save-states 2 over 3 rounds: the states at the start of rounds 0 and 2; round 2's is the checkpoint that
    round 1 ended with, so a run resumed from it redoes round 2 as the run did"""
    rows = run(tmp_path, "--save-states", "2", "--save-rounds")
    assert sorted(p.name for p in (tmp_path / "r" / "states").iterdir()) == ["round_0000.pt", "round_0002.pt"]
    s0, s2 = (torch.load(tmp_path / "r" / "states" / f"round_000{k}.pt", weights_only=False) for k in (0, 2))
    r0, r2 = (torch.load(tmp_path / "r" / "rounds" / f"round_000{k}.pt") for k in (0, 2))
    assert s0["round"] == -1 and s2["round"] == 1 and len(rows) == 3
    for s, r in [(s0, r0), (s2, r2)]:
        assert all(torch.equal(s["agent"][k], r["state_dict"][k]) for k in r["state_dict"])
