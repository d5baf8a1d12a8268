"""iif_variants.py --hold-step: IIF's update held to the KL that standard PPO's update takes from theta(k) on B(k)."""
import csv

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


def test_exact_lands_within_ten_percent_of_standards_kl_and_keeps_that_update(tmp_path):
    held = run(tmp_path, "--hold-step", "exact", "--save-rounds")
    standard = run(tmp_path, "--filter-method", "none", name="std")
    assert list(held[0]) == iif.METRICS + variants.HOLD_COLUMNS
    # round 0: one theta(0), one B(0) and one minibatch order: the copy's KL is standard PPO's own
    assert float(held[0]["kl_standard"]) == float(standard[0]["kl"])
    for r in held:
        ratio = float(r["kl"]) / float(r["kl_standard"])
        assert abs(ratio - 1) <= variants.HOLD_TOLERANCE or int(r["n_tries"]) == variants.HOLD_TRIES, r
        assert int(r["n_dropped"]) > 0 and int(r["n_tries"]) >= 1 and float(r["t_hold"]) > 0
    assert any(int(r["n_tries"]) > 1 for r in held)  # the first multiple tried missed at least once
    # theta(1) is IIF's update from theta(0) on B(0)'s kept records at lr x lr_scale, and nothing else
    r0, r1 = (torch.load(tmp_path / "r" / "rounds" / f"round_000{k}.pt") for k in (0, 1))
    args = variants.resolve_args(tyro.cli(variants.Args, args=["--runs-dir", str(tmp_path / "x"), *SHORT]))
    args.learning_rate *= float(held[0]["lr_scale"])
    agent = iif.Agent(iif.gym.spaces.Box(-np.inf, np.inf, (6,)), iif.gym.spaces.Discrete(3))
    agent.load_state_dict(r0["state_dict"])
    variants.ppo_update(agent, iif.make_optimizer(agent, args), r0, torch.nonzero(r0["kept"])[:, 0], args,
                        np.random.default_rng(1))
    assert all(torch.equal(agent.state_dict()[k], r1["state_dict"][k]) for k in r1["state_dict"])


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
        assert r["n_dropped"] == "0" and r["n_tries"] == "0" and float(r["kl"]) == float(r["kl_standard"])


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


@pytest.mark.parametrize("flags", [["--filter-method", "none"], ["--target-kl", "0.02"],
                                   ["--influence-mode", "tracin", "--save-rounds"]])
def test_hold_step_needs_a_filtered_update_of_its_own(tmp_path, flags):
    with pytest.raises(SystemExit, match="--hold-step"):
        variants.resolve_args(tyro.cli(variants.Args, args=["--runs-dir", str(tmp_path), "--run-name", "r", *SHORT,
                                                            "--hold-step", "exact", *flags]))
