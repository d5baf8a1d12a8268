"""The envpool backend (iif_envpool.py), and iif_variants.py's --eval-every and --resume."""
import csv
import importlib.util
import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
import tyro

import iif
import iif_variants as variants

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the envpool tests skip without the package; the --eval-every and --resume tests run either way
needs_envpool = pytest.mark.skipif(importlib.util.find_spec("envpool") is None, reason="needs envpool")
if importlib.util.find_spec("envpool"):
    import envpool
    import iif_envpool


def args_for(tmp_path, *flags):
    return variants.resolve_args(tyro.cli(variants.Args, args=["--runs-dir", str(tmp_path), "--run-name", "r",
                                                                  *flags]))


def read_metrics(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def without_times(rows):
    return [{k: v for k, v in r.items() if not k.startswith("t_")} for r in rows]


@needs_envpool
def test_envpool_wrapper_is_envpool_without_its_reset_steps():
    # Raw envpool answers the step after an episode's end with a reset (reward 0, the first observation,
    # the action ignored). The wrapper's stream must be the raw stream with those steps cut out, the
    # first observation moved onto the step that ended the episode and the final one into info.
    steps, kwargs = 40, dict(max_episode_steps=7)
    actions = np.random.default_rng(0).integers(0, 3, steps)
    raw = envpool.make("Acrobot-v1", env_type="gymnasium", num_envs=1, seed=5, num_threads=1, **kwargs)
    raw_first, _ = raw.reset()
    obs, rew, done, final = [], [], [], []
    reset_step = False
    while len(obs) < steps:
        o, r, te, tr, _ = raw.step(actions[len(obs)][None])
        if reset_step:  # envpool's reset step: its observation is the next episode's first
            obs[-1] = o[0]
            reset_step = False
            continue
        obs.append(o[0])
        rew.append(r[0])
        done.append(bool(te[0] | tr[0]))
        final.append(o[0])
        reset_step = done[-1]
    ours = iif_envpool.EnvpoolVec("Acrobot-v1", kwargs, 1, 1)
    first, _ = ours.reset(seed=5)
    np.testing.assert_array_equal(first, raw_first)
    for t in range(steps):
        o, r, te, tr, info = ours.step(actions[t][None])
        np.testing.assert_array_equal(o[0], obs[t])
        assert r[0] == rew[t] and bool(te[0] | tr[0]) == done[t]
        if done[t]:
            np.testing.assert_array_equal(info["final_obs"][0], final[t])
    assert sum(done) == 5  # episodes of 7 steps: the stream crossed five resets


@needs_envpool
def test_envpool_wrapper_steps_a_subset():
    ours = iif_envpool.EnvpoolVec("Acrobot-v1", {}, 4, 1)
    ours.reset(seed=1)
    o, r, te, tr, info = ours.step(np.zeros(2, dtype=np.int64), np.array([1, 3]))
    assert o.shape == (2, 6) and list(info["env_id"]) == [1, 3] and list(info["elapsed_step"]) == [1, 1]
    _, _, _, _, info = ours.step(np.zeros(4, dtype=np.int64))
    assert list(info["elapsed_step"]) == [1, 2, 1, 2]


@needs_envpool
@pytest.mark.parametrize("env_id", ["MiniGrid-Empty-8x8-v0", "highway-v0"])
def test_envpool_spaces_match_gymnasium(env_id):
    gym_env = iif.make_env(env_id)()
    pool = iif_envpool.EnvpoolVec(env_id, iif.PRESETS[env_id]["envpool"], 2, 1)
    assert pool.single_observation_space.shape == gym_env.observation_space.shape
    assert pool.single_action_space == gym_env.action_space
    obs, _ = pool.reset(seed=1)
    assert obs.shape == (2, *gym_env.observation_space.shape)


@needs_envpool
def test_evaluate_on_envpool_steps_only_the_envs_owing_episodes():
    agent = iif.Agent(gym.spaces.Box(-1, 1, (6,)), gym.spaces.Discrete(3))
    calls = []
    pool = iif_envpool.EnvpoolVec("Acrobot-v1", dict(max_episode_steps=5), 4, 1)
    step = pool.step
    pool.step = lambda a, ids, reset: calls.append((len(ids), reset)) or step(a, ids, reset)
    # 10 episodes on 4 envs: quotas 3, 3, 2, 2. All four step 10 times, then the first two 5 more; ended envs reset
    assert iif.evaluate(agent, pool, 10, seed=3) == (-5.0, 0.0)  # 5-step episodes, reward -1 a step
    assert calls == [(4, True)] * 10 + [(2, True)] * 5


@needs_envpool
def test_evaluate_resets_no_env_after_its_last_episode():
    """An episode an env (envpool's test episodes): no ended env is reset, and the returns are those of resetting"""
    torch.manual_seed(0)
    agent = iif.Agent(gym.spaces.Box(-1, 1, (8,)), gym.spaces.Discrete(4))  # untrained: crashes after ~100 steps
    results, resets, live = {}, set(), set()
    for forced in (False, True):
        pool = iif_envpool.EnvpoolVec("LunarLander-v3", {}, 20, 1)
        step = pool.step
        pool.step = lambda a, ids, reset: resets.add(reset) or live.add(len(ids)) or step(a, ids, reset or forced)
        torch.manual_seed(1)
        results[forced] = iif.evaluate(agent, pool, 20, seed=3)
    assert resets == {False}
    assert len(live) > 5  # episodes ended at many steps: envs were stepped after others had ended
    assert results[False] == results[True]


def vec_args(env_id, backend):
    import argparse
    return argparse.Namespace(env_id=env_id, env_kwargs={}, env_backend=backend, async_envs=False, threads=1)


@needs_envpool
def test_same_policy_same_test_return_on_both_backends():
    torch.manual_seed(0)
    agent = iif.Agent(gym.spaces.Box(-1, 1, (8,)), gym.spaces.Discrete(4))  # untrained: crashes after ~100 steps
    results = {}
    for backend, n_envs in (("gymnasium", 16), ("envpool", 100)):
        envs = iif.make_vec(vec_args("LunarLander-v3", backend), n_envs, backend)
        results[backend] = iif.evaluate(agent, envs, 100, seed=10_000)
        envs.close()
    (m_g, s_g), (m_e, s_e) = results["gymnasium"], results["envpool"]
    assert s_g > 20 and s_e > 20  # returns spread: the comparison has something to compare
    assert abs(m_g - m_e) < 3 * np.sqrt((s_g ** 2 + s_e ** 2) / 100), results


@needs_envpool
def test_envpool_rollout_has_no_reset_records_and_bootstraps_truncations(tmp_path):
    # Acrobot pays -1 a step and 0 on its terminal step; envpool's reset steps would be reward-0 records
    subprocess.run([sys.executable, os.path.join(ROOT, "iif.py"), "--runs-dir", str(tmp_path), "--run-name", "r",
                    "--env-id", "Acrobot-v1", "--env-backend", "envpool", "--num-steps", "1100", "--minibatch-size",
                    "100", "--total-timesteps", "1100", "--eval-episodes", "2", "--save-rounds"], check=True,
                   capture_output=True)
    b = torch.load(tmp_path / "r" / "rounds" / "round_0000.pt")
    assert ((b["rewards"] == 0) == (b["terminations"] == 1)).all()
    ends = torch.nonzero(b["dones"]).flatten().tolist()
    assert ends  # a random policy's episodes are mostly truncated at 500 steps
    for t in ends:
        if t + 1 < len(b["obs"]):  # the next record starts an episode: Acrobot starts within 0.1 of rest
            assert (b["obs"][t + 1][[0, 2]] > 0.99).all() and (b["obs"][t + 1][4:].abs() <= 0.1).all()
        if not b["terminations"][t] and t + 1 < len(b["obs"]):  # V(final observation), not V(next first)
            assert not torch.isclose(b["next_values"][t], b["values"][t + 1])
    inner = [t for t in range(len(b["obs"]) - 1) if t not in ends]
    torch.testing.assert_close(b["next_values"][inner], b["values"][[t + 1 for t in inner]])


@pytest.mark.parametrize("script, flags, message", [
    ("iif.py", ["--env-id", "FrozenLake-v1", "--env-backend", "envpool"], "--env-backend"),
    ("iif.py", ["--env-id", "highway-fast-v0", "--env-backend", "envpool"], "--env-backend"),
    ("research/iif_variants.py", ["--eval-every", "0"], "--eval-every"),
    ("research/iif_variants.py", ["--resume"], "--run-name"),
])
def test_bad_backend_and_resume_flags_fail_early(tmp_path, script, flags, message):
    cmd = [sys.executable, os.path.join(ROOT, script), "--runs-dir", str(tmp_path), *flags]
    if "--resume" not in flags:
        cmd += ["--run-name", "r"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and message in proc.stderr and "Traceback" not in proc.stderr


@needs_envpool
def test_auto_backend():
    """auto: Stage I on the paper's gymnasium env (highway's port: highway-env is far slower), the test on envpool"""
    assert iif.resolve_args(iif.Args(env_id="Acrobot-v1")).backends == ("gymnasium", "envpool")
    assert iif.resolve_args(iif.Args(env_id="highway-v0")).backends == ("envpool", "envpool")
    assert iif.resolve_args(iif.Args(env_id="FrozenLake-v1")).backends == ("gymnasium", "gymnasium")
    assert iif.resolve_args(iif.Args(env_id="CartPole-v1")).backends == ("gymnasium", "gymnasium")  # no preset
    for backend in ("gymnasium", "envpool"):
        assert iif.resolve_args(iif.Args(env_id="Acrobot-v1", env_backend=backend)).backends == (backend, backend)
    a = variants.resolve_args(variants.Args(env_id="Acrobot-v1"))
    assert a.eval_envs == a.eval_episodes == 1000  # one test episode per batched env


def test_eval_every_tests_only_every_nth_round(tmp_path):
    a = args_for(tmp_path, "--env-id", "CartPole-v1", "--num-steps", "32", "--minibatch-size", "16",
                 "--total-timesteps", "160", "--eval-every", "2", "--eval-episodes", "2")
    variants.main(a)
    rows = read_metrics(tmp_path / "r" / "metrics.csv")
    assert [r["test_return_mean"] != "" for r in rows] == [False, True, False, True, False]
    assert all(float(r["t_eval"]) == pytest.approx(0, abs=1e-3) for r in rows[::2])


# ---- --resume ----

class Corridor(gym.Env):
    """Fixed start, deterministic moves, reward 1 for each step right: every episode lasts exactly 8
    steps (truncated), so with 16-step rounds episodes end at round ends, and a resumed run, whose
    environments restart, must equal the uninterrupted one."""
    observation_space = gym.spaces.Box(0.0, 1.0, (5,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0
        return np.eye(5, dtype=np.float32)[self.pos], {}

    def step(self, action):
        self.pos = int(np.clip(self.pos + (1 if action else -1), 0, 4))
        return np.eye(5, dtype=np.float32)[self.pos], float(action), False, False, {}


gym.register("Corridor-v0", entry_point=Corridor, max_episode_steps=8)
CORRIDOR = ["--env-id", "Corridor-v0", "--filter-method", "influence", "--num-steps", "16", "--minibatch-size", "8",
            "--total-timesteps", "96", "--eval-episodes", "3", "--learning-rate", "0.01"]


class Killed(Exception):
    pass


def kill_at(monkeypatch, name, k):
    """Make iif_variants.<name> raise on its call in round k (it is called once per round)."""
    real, calls = getattr(variants, name), []

    def fake(*a, **kw):
        calls.append(1)
        if len(calls) == k + 1:
            raise Killed
        return real(*a, **kw)

    monkeypatch.setattr(variants, name, fake)


@pytest.mark.parametrize("name, k", [
    ("evaluate", 2),         # killed inside round 2, before its row is written
    ("save_checkpoint", 3),  # killed after round 3's row is written, before its checkpoint
    ("save_checkpoint", 5),  # killed in the last round: only the final agent is missing
])
def test_a_killed_run_resumed_equals_the_uninterrupted_run(tmp_path, monkeypatch, name, k):
    variants.main(args_for(tmp_path / "full", *CORRIDOR))
    with monkeypatch.context() as m:
        kill_at(m, name, k)
        with pytest.raises(Killed):
            variants.main(args_for(tmp_path / "cut", *CORRIDOR))
    rows = read_metrics(tmp_path / "cut" / "r" / "metrics.csv")
    assert len(rows) == (k if name == "evaluate" else k + 1)
    with pytest.raises(SystemExit, match="--resume"):  # without --resume the run is not overwritten
        variants.main(args_for(tmp_path / "cut", *CORRIDOR))
    variants.main(args_for(tmp_path / "cut", *CORRIDOR, "--resume"))
    full = read_metrics(tmp_path / "full" / "r" / "metrics.csv")
    cut = read_metrics(tmp_path / "cut" / "r" / "metrics.csv")
    assert [int(r["round"]) for r in cut] == list(range(6))
    assert without_times(cut) == without_times(full)
    a, b = (torch.load(tmp_path / d / "r" / "agent.pt") for d in ("full", "cut"))
    assert all(torch.equal(a[key], b[key]) for key in a)
    assert len(set(float(r["test_return_mean"]) for r in full)) > 1  # the policy learned something


def test_resume_restores_adam_and_every_rng(tmp_path, monkeypatch):
    flags = [*CORRIDOR, "--optimizer", "adam", "--filter-method", "random", "--learning-rate", "0.003"]
    variants.main(args_for(tmp_path / "full", *flags))
    with monkeypatch.context() as m:
        kill_at(m, "evaluate", 3)
        with pytest.raises(Killed):
            variants.main(args_for(tmp_path / "cut", *flags))
    variants.main(args_for(tmp_path / "cut", *flags, "--resume"))
    assert without_times(read_metrics(tmp_path / "cut" / "r" / "metrics.csv")) == \
        without_times(read_metrics(tmp_path / "full" / "r" / "metrics.csv"))


def test_resume_refuses_other_flags_and_finishes_a_finished_run(tmp_path):
    variants.main(args_for(tmp_path, *CORRIDOR))
    with pytest.raises(SystemExit, match="--learning-rate 0.01 \\(now 0.02\\)"):
        variants.main(args_for(tmp_path, *CORRIDOR[:-1], "0.02", "--resume"))
    before = read_metrics(tmp_path / "r" / "metrics.csv")
    variants.main(args_for(tmp_path, *CORRIDOR, "--resume"))  # nothing left to run
    assert read_metrics(tmp_path / "r" / "metrics.csv") == before
    # small: the agent, Adam's two moments and the RNG states
    assert os.path.getsize(tmp_path / "r" / "checkpoint.pt") < 3 * os.path.getsize(tmp_path / "r" / "agent.pt") + 20_000


@needs_envpool
def test_resume_on_envpool_keeps_each_round_once(tmp_path, monkeypatch):
    flags = ["--env-id", "Acrobot-v1", "--env-backend", "envpool", "--num-steps", "64", "--minibatch-size", "32",
             "--total-timesteps", "256", "--eval-episodes", "4"]
    with monkeypatch.context() as m:
        kill_at(m, "save_checkpoint", 1)
        with pytest.raises(Killed):
            variants.main(args_for(tmp_path, *flags))
    variants.main(args_for(tmp_path, *flags, "--resume"))
    rows = read_metrics(tmp_path / "r" / "metrics.csv")
    assert [int(r["round"]) for r in rows] == [0, 1, 2, 3]


REFERENCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "backends")


@needs_envpool
@pytest.mark.parametrize("name", sorted(os.listdir(REFERENCE)))
def test_each_backend_gives_what_it_gave(tmp_path, name):
    """--env-backend gymnasium and envpool, each for both stages, against short runs committed before auto split the
    stages (made by `python iif.py --env-id <env> --env-backend <backend> --num-steps 256 --total-timesteps 512
    --eval-episodes 4 --runs-dir tests/data/backends --run-name <env>__<backend>`): every column but the seconds"""
    env_id, backend = name.split("__")
    a = iif.resolve_args(tyro.cli(iif.Args, args=["--env-id", env_id, "--env-backend", backend, "--num-steps", "256",
                                                  "--total-timesteps", "512", "--eval-episodes", "4", "--runs-dir",
                                                  str(tmp_path), "--run-name", "r"]))
    assert a.backends == (backend, backend)
    iif.main(a)
    rows = [read_metrics(os.path.join(d, "metrics.csv")) for d in (os.path.join(REFERENCE, name), tmp_path / "r")]
    assert without_times(rows[0]) == without_times(rows[1])


@needs_envpool
def test_auto_trains_round_0_as_gymnasium_and_tests_on_envpool(tmp_path):
    """auto: Stage I and the update on gymnasium's Acrobot (round 0's buffer, records kept and KL are gymnasium's),
    the test on envpool's port"""
    rows = {}
    for backend in ("auto", "gymnasium"):
        a = iif.resolve_args(tyro.cli(iif.Args, args=["--env-id", "Acrobot-v1", "--env-backend", backend,
                                                      "--num-steps", "256", "--total-timesteps", "512",
                                                      "--eval-episodes", "4", "--runs-dir", str(tmp_path),
                                                      "--run-name", backend]))
        assert a.backends == (("gymnasium", "envpool") if backend == "auto" else ("gymnasium",) * 2)
        iif.main(a)
        rows[backend] = read_metrics(os.path.join(tmp_path, backend, "metrics.csv"))
    same = [k for k in rows["auto"][0] if not k.startswith("t_") and not k.startswith("test_")]
    assert {k: rows["auto"][0][k] for k in same} == {k: rows["gymnasium"][0][k] for k in same}
    assert rows["auto"][0]["n_dropped"] != "0"  # a filtered round: the kept records are compared
