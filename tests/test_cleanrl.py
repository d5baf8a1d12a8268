"""iif.py's CleanRL conventions: TensorBoard with CleanRL's scalar names, --capture-video, --save-model and
--eval-model, --track (wandb, offline), --cuda's fallback, and --help's preset values."""
import csv
import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
import tyro

import iif

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CARTPOLE = ["--env-id", "CartPole-v1", "--total-timesteps", "8192", "--eval-episodes", "5"]
CLEANRL = ["charts/episodic_return", "charts/episodic_length", "charts/learning_rate", "charts/SPS",
           "losses/value_loss", "losses/policy_loss", "losses/entropy", "losses/old_approx_kl", "losses/approx_kl",
           "losses/clipfrac", "losses/explained_variance"]


def iif_py(tmp_path, *flags, env=None):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "iif.py"), *flags], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_tensorboard_video_and_a_saved_model_that_tests_again(tmp_path):
    proc = iif_py(tmp_path, *CARTPOLE, "--run-name", "cp", "--capture-video", "--save-model")
    assert " SPS " in proc.stdout and "on gymnasium, tests on gymnasium, cpu" in proc.stdout
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(tmp_path / "runs" / "cp"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags()
    assert set(CLEANRL) <= set(tags["scalars"])
    assert {"iif/n_kept", "iif/n_negative", "iif/n_dropped", "iif/test_return", "iif/kl",
            "iif/influence_seconds"} <= set(tags["scalars"])
    assert "iif/influence" in tags["histograms"] and "hyperparameters/text_summary" in tags["tensors"]
    with open(tmp_path / "runs" / "cp" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    for tag, column in [("iif/test_return", "test_return_mean"), ("losses/approx_kl", "approx_kl")]:
        logged = [(e.step, e.value) for e in acc.Scalars(tag)]
        assert logged == [(int(r["global_step"]), pytest.approx(float(r[column]), rel=1e-6)) for r in rows], tag
    assert [e.step for e in acc.Scalars("charts/SPS")] == [2048, 4096, 6144, 8192]
    # as CleanRL: a point per finished training episode at the step that ended it, their round's mean in metrics.csv
    returns, lengths = ([(e.step, e.value) for e in acc.Scalars(f"charts/episodic_{x}")] for x in ("return", "length"))
    assert len(returns) == len(lengths) > 4 * 10 and [s for s, _ in returns] == [s for s, _ in lengths]
    ends = np.cumsum([v for _, v in lengths])  # CartPole: one env, so episode i ends at the sum of the lengths so far
    assert [s for s, _ in lengths] == [int(e) for e in ends]
    assert [v for _, v in returns] == [v for _, v in lengths]  # CartPole's return is its length
    for r, k in zip(rows, range(4)):
        mine = [v for s, v in returns if 2048 * k < s <= 2048 * (k + 1)]
        assert float(r["train_return"]) == pytest.approx(np.mean(mine), rel=1e-6) and int(r["n_records"]) == 2048
    videos = sorted(os.listdir(tmp_path / "videos" / "cp"))  # 4 rounds: one video each
    assert videos == [f"round-{k}-episode-0.mp4" for k in range(4)]
    assert all(os.path.getsize(tmp_path / "videos" / "cp" / v) > 1000 for v in videos)
    agent = iif.Agent(gym.spaces.Box(-np.inf, np.inf, (4,)), gym.spaces.Discrete(2))  # CleanRL's way to load it
    agent.load_state_dict(torch.load(tmp_path / "runs" / "cp" / "iif.cleanrl_model"))
    assert [e.step for e in acc.Scalars("eval/episodic_return")] == list(range(10))  # the saved agent, tested
    assert not (tmp_path / "runs" / "cp" / "agent.pt").exists()
    out = iif_py(tmp_path, "--eval-model", "runs/cp/iif.cleanrl_model", "--eval-episodes", "7", "--capture-video")
    assert "test return" in out.stdout and "over 7 episodes" in out.stdout
    assert os.listdir(tmp_path / "videos" / "cp-eval") == ["round-0-episode-0.mp4"]
    assert not (tmp_path / "runs" / "cp-eval").exists()  # testing trains nothing and writes no run


def test_without_save_model_no_model_is_written_and_track_runs_offline(tmp_path):
    env = dict(os.environ, WANDB_MODE="offline", WANDB_DIR=str(tmp_path), WANDB_SILENT="true")
    iif_py(tmp_path, "--env-id", "CartPole-v1", "--total-timesteps", "2048", "--eval-episodes", "2", "--run-name",
           "t", "--track", "--wandb-project-name", "iif-test", env=env)
    assert sorted(f for f in os.listdir(tmp_path / "runs" / "t") if not f.startswith("events.")) == \
        ["config.json", "metrics.csv"]
    offline = [d for d in os.listdir(tmp_path / "wandb") if d.startswith("offline-run-")]
    assert len(offline) == 1
    files = os.listdir(tmp_path / "wandb" / offline[0])
    assert any(f.endswith(".wandb") for f in files), files


def test_cuda_falls_back_to_the_cpu_and_gives_the_same_run(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: benchmarks/gpu_check.sh runs iif.py on it")
    a = iif_py(tmp_path, "--env-id", "Acrobot-v1", "--total-timesteps", "2048", "--eval-episodes", "2", "--run-name",
               "a", "--env-backend", "gymnasium")
    b = iif_py(tmp_path, "--env-id", "Acrobot-v1", "--total-timesteps", "2048", "--eval-episodes", "2", "--run-name",
               "b", "--env-backend", "gymnasium", "--no-cuda")
    assert "gymnasium, cpu" in a.stdout and "gymnasium, cpu" in b.stdout

    def rows(name):
        with open(tmp_path / "runs" / name / "metrics.csv") as f:
            return [{k: v for k, v in r.items() if not k.startswith("t_")} for r in csv.DictReader(f)]
    assert rows("a") == rows("b")


class NoFrames(gym.Env):
    metadata = {"render_modes": []}
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, True, False, {}


def test_capture_video_on_an_env_without_frames_stops_at_once(tmp_path):
    gym.register("NoFrames-v0", entry_point=NoFrames, max_episode_steps=10)
    with pytest.raises(SystemExit, match="--capture-video: NoFrames-v0 does not render rgb_array"):
        iif.resolve_args(tyro.cli(iif.Args, args=["--env-id", "NoFrames-v0", "--capture-video", "--runs-dir",
                                                   str(tmp_path)]))
    assert not os.listdir(tmp_path)
    with pytest.raises(SystemExit, match="--eval-model 'nothing.cleanrl_model': no such file"):
        iif.resolve_args(tyro.cli(iif.Args, args=["--eval-model", "nothing.cleanrl_model"]))


def test_help_shows_every_presets_value_and_no_none():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "iif.py"), "--help"], capture_output=True, text=True,
                         env=dict(os.environ, COLUMNS="200")).stdout
    out = " ".join(out.replace("│", " ").split())  # the help's box and line breaks away
    assert "(default: None)" not in out
    for text in ("FrozenLake 102400", "BipedalWalker 1024000", "BipedalWalker adam", "MiniGrid 0.125",
                 "highway 0.5, LunarLander 0.0", "other envs none", "--track", "--capture-video", "--save-model",
                 "--cuda", "--torch-deterministic", "--eval-model"):
        assert text in out, text


def flags_of(help_text):
    """--help's flags, each one's help joined into a line (tyro's box and line breaks away)"""
    flags = []
    for line in help_text.splitlines():
        line = line.strip().strip("│").strip()
        if line.startswith("--"):
            flags.append(line)
        elif line.startswith(("╭", "╰")) or not flags:
            continue
        elif line:
            flags[-1] += " " + line
    return flags


def doubled_defaults(help_text):
    """The flags whose help states a default and then tyro's "(default: None)" after it"""
    return [f for f in flags_of(help_text) if "(default: None)" in f and "default" in f[:f.index("(default: None)")]]


def test_doubled_defaults_are_found():
    old = ("│ --threads {None}|INT  torch CPU threads (default: torch's choice) (default: None) │\n"
           "│ --rounds {None}|INT                                                             │\n"
           "│                       training rounds (default: one pass) (default: None)       │\n"
           "│ --seed INT            seed (default: 1)                                         │\n"
           "│ --target-state {None}|STR  f_action's state (default: None)                     │")
    assert len(flags_of(old)) == 4 and [f.split()[0] for f in doubled_defaults(old)] == ["--threads", "--rounds"]


@pytest.mark.parametrize("script", ["iif.py", "rlhf_iif.py", "research/iif_variants.py", "research/rlhf_variants.py",
                                    "research/grpo_iif.py"])
def test_no_help_says_default_none_after_stating_a_default(script):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, script), "--help"], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, COLUMNS="200", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(flags_of(proc.stdout)) >= 20 and "--seed INT" in proc.stdout
    assert doubled_defaults(proc.stdout) == []
