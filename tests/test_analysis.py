"""analysis.py: metrics against hand-computed examples, and every subcommand on tiny runs."""
import argparse
import contextlib
import csv
import io
import json
import dataclasses
import math
import os
import re
import shutil
import subprocess
import sys
from unittest import mock

import gymnasium as gym
import numpy as np
import pytest
import scipy.stats
import torch
import tyro

import analysis
import analysis_variants
import iif
import iif_variants as variants

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--num-steps", "256", "--minibatch-size", "64", "--update-epochs", "2", "--eval-episodes", "8"]


def rows(returns, t_optim=1.0, t_influence=0.0):
    return [dict(test_return_mean=r, t_optim=t_optim, t_influence=t_influence) for r in returns]


def test_first_round_and_record_levels():
    assert analysis.first_round([0.1, 0.5, 0.4, 0.9], 0.45) == 2
    assert analysis.first_round([0.1, 0.5], 0.6) == math.inf
    assert analysis.record_levels([0.2, 0.1, 0.5, 0.5, 0.4, 0.8]) == [0.2, 0.5, 0.8]


def test_efficiency_by_hand():
    std = rows([0.0, 0.2, 0.2, 0.5, 0.5, 1.0])  # levels 0, .2, .5, 1 reached after 1, 2, 4, 6 rounds
    iif = rows([0.0, 0.5, 0.6, 1.0, 1.0, 1.0], t_optim=0.5, t_influence=0.1)  # after 1, 2, 2, 4 rounds
    e = analysis.efficiency(std, iif)
    assert e["n_levels"] == 4 and e["n_unreached"] == 0
    assert e["se_ave"] == pytest.approx(np.mean([0, 0, 1 - 2 / 4, 1 - 4 / 6]))
    assert e["se_peak"] == pytest.approx(1 - 4 / 6)
    # runtime to the peak: IIF 4 rounds x (0.5 + 0.1) s against standard 6 rounds x 1 s (no influence)
    assert e["rt_peak"] == pytest.approx(1 - 2.4 / 6)


def test_efficiency_with_a_level_iif_never_reaches():
    std = rows([0.1, 0.3, 0.9])
    iif = rows([0.3, 0.5, 0.6])  # never reaches 0.9: counted as round 4 (its 3 rounds + 1)
    e = analysis.efficiency(std, iif)
    assert e["n_unreached"] == 1
    assert e["se_ave"] == pytest.approx(np.mean([0, 1 - 1 / 2, 1 - 4 / 3]))
    assert e["se_peak"] == pytest.approx(1 - 4 / 3)
    assert e["rt_peak"] == pytest.approx(1 - 3 / 3)  # all of IIF's time against all of standard's


def test_even_levels_and_their_se():
    returns = [0.0, 0.2, float("nan"), 0.5, 1.0]  # --eval-every: the nan round sets no level
    assert analysis_variants.even_levels(returns, 4) == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert analysis.record_levels(returns) == [0.0, 0.2, 0.5, 1.0]
    std = rows([0.0, 0.2, 0.2, 0.5, 0.5, 1.0])
    iif = rows([0.0, 0.5, 0.65, 1.0, 1.0, 1.0])
    # ten levels .1, .2, ..., 1: standard after 2, 2, 4, 4, 4, 6 x 5 rounds; IIF after 2 x 5, 3, 4 x 4
    expected = np.mean([0, 0, 1 - 2 / 4, 1 - 2 / 4, 1 - 2 / 4, 1 - 3 / 6] + [1 - 4 / 6] * 4)
    even = analysis_variants.efficiency(std, iif, "even")
    assert even["se_ave"] == pytest.approx(expected) and even["n_levels"] == 10
    assert even["se_peak"] == analysis.efficiency(std, iif)["se_peak"]
    assert analysis_variants.efficiency(std, iif) == analysis.efficiency(std, iif, "records")  # the paper's levels


@pytest.mark.parametrize("x", [[0.1, 0.3, 0.2, 0.6, 0.4], [12.0, -3.5, 40.25], [-1e-3, 2e-3], [7.0, 7.0, 7.0],
                               np.random.default_rng(0).normal(30, 20, 10)])
def test_mean_ci_is_the_t_interval_of_research_verdicts(x):
    """analysis.py keeps its own t-interval (it runs copied beside iif.py alone); every table's "[lo, hi]" is the
    same interval, research/verdicts.py's"""
    import verdicts
    assert analysis.mean_ci(x) == verdicts.t_interval(x)  # exactly: the same digits in every table
    mean, low, high = analysis.mean_ci(x)
    if np.ptp(x) > 0:
        ref = scipy.stats.t.interval(0.95, len(x) - 1, loc=np.mean(x), scale=scipy.stats.sem(x))
        assert mean == pytest.approx(np.mean(x)) and (low, high) == pytest.approx(ref, rel=1e-9)
    else:
        assert low == mean == high  # no spread: the interval is the mean


def test_mean_ci_of_one_seed_has_no_interval():
    assert analysis.mean_ci([0.5])[0] == 0.5 and all(math.isnan(v) for v in analysis.mean_ci([0.5])[1:])
    assert analysis.fmt_ci([0.5]) == "50.0 (1 seed)" and analysis.fmt_ci([0.5, 0.5]) == "50.0 [50.0, 50.0]"


def test_rt_peak_divides_by_standard_time_over_all_rounds():
    # Table 3's formula: standard peaks at round 3 of 5, but its denominator is all 5 rounds' optimisation
    std = [dict(test_return_mean=r, t_optim=t, t_influence=0.0)
           for r, t in zip([0.1, 0.4, 0.9, 0.8, 0.7], [2.0, 2.0, 2.0, 1.0, 1.0])]
    iif = [dict(test_return_mean=r, t_optim=1.0, t_influence=0.25) for r in [0.4, 0.9, 0.9, 0.9, 0.9]]
    e = analysis.efficiency(std, iif)
    assert e["se_peak"] == pytest.approx(1 - 2 / 3)
    assert e["rt_peak"] == pytest.approx(1 - 2 * 1.25 / 8.0)  # 0.6875; standard's time to its peak (6 s) would give 0.583


def test_roughness_on_a_small_graph():
    emb = np.array([[0.0], [1.0], [3.0]])
    scores = np.array([2.0, 1.0, -2.0])  # L-inf normalised: 1, 0.5, -1
    # squared distances 1, 9, 4; sigma^2 = their median 4; u = 1 joins 0-1 and 1-2 (2's nearest is 1)
    w01, w12 = np.exp(-1 / 4), np.exp(-4 / 4)
    expected = 2 * (w01 * 0.5 ** 2 + w12 * 1.5 ** 2) / (2 * (w01 + w12))
    assert analysis.roughness(emb, scores, 1) == pytest.approx(expected)
    w02 = np.exp(-9 / 4)  # u = 2: the complete graph
    full = (w01 * 0.25 + w12 * 2.25 + w02 * 4) / (w01 + w12 + w02)
    assert analysis.roughness(emb, scores, 2) == pytest.approx(full)
    assert analysis.roughness(emb, np.ones(3), 2) == 0.0


def test_mc_advantage_on_a_deterministic_mdp():
    # s0 --a0 (r 0)--> s1 --a0 (r 1)--> end;   s0 --a1 (r 0.5)--> end;   s1 --a1 (r 0)--> end;   gamma 0.9
    # episodes: [s0 a0, s1 a0], [s0 a1], [s0 a0, s1 a0], [s0 a1], then an unfinished [s0 a0, s1 a1]
    states = np.array([0, 1, 0, 0, 1, 0, 0, 1])
    actions = np.array([0, 0, 1, 0, 0, 1, 0, 1])
    rewards = np.array([0, 1, 0.5, 0, 1, 0.5, 0, 0])
    dones = np.array([0, 1, 1, 0, 1, 1, 0, 0])
    a_mc = variants.mc_advantage(*(x[:, None] for x in (states, actions, rewards, dones)), 0.9)[:, 0]
    q_s0a0, q_s0a1 = 0.9, 0.5  # the true Q of this deterministic MDP
    v_s0 = (q_s0a0 + q_s0a1) / 2  # the behaviour took each action twice in finished episodes
    np.testing.assert_allclose(a_mc[:7], [q_s0a0 - v_s0, 0, q_s0a1 - v_s0, q_s0a0 - v_s0, 0, q_s0a1 - v_s0,
                                          q_s0a0 - v_s0])  # the unfinished s0 a0 takes the pair's estimate
    assert np.isnan(a_mc[7])  # (s1, a1) has no finished visit


def test_spearman_with_ties():
    # ranks 3.5, 1, 3.5, 2 against 2, 1, 3, 4: Pearson's r of the ranks
    x, y = np.array([3.0, 1.0, 3.0, 2.0]), np.array([2.0, 1.0, 3.0, 4.0])
    rx, ry = np.array([3.5, 1, 3.5, 2]), np.array([2.0, 1, 3, 4])
    assert analysis.spearman(x, y) == pytest.approx(np.corrcoef(rx, ry)[0, 1])
    assert analysis.spearman(np.arange(5.0), np.arange(5.0) ** 3) == pytest.approx(1.0)
    assert analysis.spearman(np.arange(5.0), -np.arange(5.0)) == pytest.approx(-1.0)


def sh(script, *argv):
    """What `python analysis.py ...`, `python research/analysis_variants.py ...` or `python iif.py ...` prints, run in this
    process (it imports torch once)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), mock.patch.object(sys, "argv", [script, *argv]):
        if script in ("analysis.py", "analysis_variants.py"):
            (analysis if script == "analysis.py" else analysis_variants).main()
        else:
            iif.main(iif.resolve_args(tyro.cli(iif.Args, args=list(argv))))
    return out.getvalue()


def iif_run(runs, name, *flags):
    sh("iif.py", "--runs-dir", str(runs), "--run-name", name, *flags)
    return os.path.join(runs, name)


@pytest.fixture(scope="module")
def frozenlake_runs(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    for label in ("influence", "none"):
        for seed in ("1", "2"):
            iif_run(runs, f"FrozenLake-v1__{label}__{seed}", "--env-id", "FrozenLake-v1", "--filter-method", label,
                    "--seed", seed, "--total-timesteps", "1024", *TINY)
    saved = iif_run(runs / "saved", "fl", "--env-id", "FrozenLake-v1", "--filter-method", "none", "--save-rounds",
                    "--total-timesteps", "1536", *TINY)
    return runs, saved


def test_curves_and_efficiency_subcommands(frozenlake_runs, tmp_path):
    runs, _ = frozenlake_runs
    out = sh("analysis.py", "curves", "--runs", str(runs), "--env", "FrozenLake-v1", "--out", str(tmp_path / "c.png"))
    assert "IIF" in out and "Standard" in out and (tmp_path / "c.png").stat().st_size > 0
    band = sh("analysis.py", "curves", "--runs", str(runs), "--env", "FrozenLake-v1", "--band", "t",
              "--out", str(tmp_path / "t.png"))
    assert band.replace("t.png", "c.png") == out  # the band is drawn, not printed
    assert (tmp_path / "t.png").read_bytes() != (tmp_path / "c.png").read_bytes()
    out = sh("analysis.py", "efficiency", "--runs", str(runs), "--env", "FrozenLake-v1")
    assert "| FrozenLake-v1 | IIF | 2 |" in out and "SE_ave" in out and "| FrozenLake-v1 | Standard |" in out
    at = sh("analysis_variants.py", "efficiency", "--runs", str(runs), "--env", "FrozenLake-v1", "--at", "-1")
    assert "| FrozenLake-v1 | IIF | -1 | 1 / 1, 1 / 1 | 0.0 % (2 of 2 seeds) |" in at  # every run reaches -1 in round 1
    row, row_at = (next(line for line in o.splitlines() if line.startswith("| FrozenLake-v1 | IIF | 2 |"))
                   for o in (out, at))
    cells, cells_at = row.split(" | "), row_at.split(" | ")
    assert cells_at[:4] + cells_at[5:] == cells  # analysis.py's row, and the even levels' SE_ave beside it
    assert at[at.index("\nPer-round"):] == out[out.index("\nPer-round"):]
    assert re.search(r"^FrozenLake-v1: of standard's \d+ record levels, IIF reached", at, re.M)


def write_run(runs, label, seed, returns):
    """<runs>/E__<label>__<seed>/metrics.csv with these test returns (0.1 in every other column)"""
    os.makedirs(runs / f"E__{label}__{seed}")
    rows = [{k: 0.1 for k in iif.METRICS} | dict(round=k, test_return_mean=r) for k, r in enumerate(returns)]
    with open(runs / f"E__{label}__{seed}" / "metrics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=iif.METRICS)
        w.writeheader()
        w.writerows(rows)


def test_curves_print_each_seeds_final_and_late_lowest(tmp_path):
    for seed, returns in ((1, [5, 1, 4, 3]), (2, [0, 2, 6, 7])):
        write_run(tmp_path, "none", seed, returns)
    out = sh("analysis.py", "curves", "--runs", str(tmp_path), "--env", "E", "--out", str(tmp_path / "c.png"))
    assert "per seed: final 3.0, 7.0; lowest after round 2: 3.0, 6.0" in out  # rounds 3 and 4
    out = sh("analysis.py", "curves", "--runs", str(tmp_path), "--env", "E", "--rounds", "2",
             "--out", str(tmp_path / "c.png"))
    assert "per seed: final 1.0, 2.0; lowest after round 1: 1.0, 2.0" in out  # round 2 only


def test_the_released_codes_labels_are_named_by_analysis_variants_only(tmp_path):
    """analysis.py names the paper's methods; the research runs' names (results/release) are analysis_variants.py's"""
    for label in ("none", "release-none"):
        write_run(tmp_path, label, 1, [1, 2, 3])
    out = sh("analysis.py", "curves", "--runs", str(tmp_path), "--env", "E", "--out", str(tmp_path / "c.png"))
    assert "Standard: 3.000" in out and "release-none: 3.000" in out
    out = sh("analysis_variants.py", "curves", "--runs", str(tmp_path), "--env", "E", "--out", str(tmp_path / "c.png"))
    assert "Standard, released code: 3.000" in out


def test_efficiency_on_the_first_rounds(tmp_path):
    runs = (("none", 1, [1, 2, 3, 4]), ("influence", 1, [2, 3, 3, 3]), ("none", 2, [1, 2, 3, 4]),
            ("influence", 2, [4, 4]))  # seed 2's IIF run is unfinished
    for label, seed, returns in runs:
        write_run(tmp_path, label, seed, returns)
    cmd = ("analysis.py", "efficiency", "--runs", str(tmp_path), "--env", "E")
    out = sh(*cmd)  # SE(v) for v = 1, 2, 3, 4: 1 - 1/1, 1 - 1/2, 1 - 2/3, 1 - (4 + 1)/4
    assert "| E | IIF | 1 | 14.6 (1 seed) |" in out and "| 4 (1) |" in out  # one seed: no interval
    assert "E: seed(s) 2 left out, unfinished" in out
    out = sh(*cmd, "--label", "random")  # no such runs: said, not a traceback
    assert "E: no seed has both a standard ('none') and a 'random' run" in out
    cmd = ("analysis_variants.py", *cmd[1:], "--levels", "records")
    out = sh(*cmd)
    assert "| E | IIF | 1 | 14.6 (1 seed) |" in out
    assert "E: of standard's 4 record levels, IIF reached 2 first, 1 at the same round, 1 later" in out
    out = sh(*cmd, "--rounds", "2")  # v = 1, 2 only; every run holds 2 rounds
    assert "| E | IIF | 2 | 25.0 [25.0, 25.0] |" in out and "| 2 (0), 2 (0) |" in out
    out = sh(*cmd, "--tested-every", "2")  # rounds 1 and 3 tested: v = 2, 4, reached by IIF in 2, never
    assert "| -12.5 (1 seed) |" in out and "| 2 (1) |" in out


def test_frozenlake_diagnostics_subcommands(frozenlake_runs, tmp_path):
    _, saved = frozenlake_runs
    out = sh("analysis.py", "bottom-records", "--run", saved, "--rounds", "1", "5", "--n", "20",
             "--out", str(tmp_path / "b.png"))
    counts = [int(c) for c in re.findall(r"a=[LDRU]\s+(\d+)", out)]
    assert sum(counts) == 2 * 20 and (tmp_path / "b.png").exists()
    out = sh("analysis.py", "advantage-diagnosis", "--run", saved, "--round", "3", "--out", str(tmp_path / "a.png"))
    assert "Spearman" in out and "bottom 20 %" in out and (tmp_path / "a.png").exists()
    out = sh("analysis.py", "behavior-formation", "--run", saved, "--neighbours", "5", "--out", str(tmp_path / "f.png"))
    assert out.count("\n| ") == 6 + 1 and (tmp_path / "f.png").exists()  # header row + one per round
    other = (int(re.search(r"action \[(\d)\]", out).group(1)) + 1) % 4  # not the default pick's action
    out = sh("analysis.py", "behavior-formation", "--run", saved, "--neighbours", "5", "--action", str(other),
             "--out", str(tmp_path / "f2.png"))
    assert f"action [{other}] in state" in out
    with pytest.raises(SystemExit, match="--action 7: no record of round"):
        sh("analysis.py", "behavior-formation", "--run", saved, "--action", "7")
    out = sh("analysis_variants.py", "rescore", "--run", saved, "--change", "no-score-log-std")
    rows = re.findall(r"^\| \d+ \| (\S+) \| (\S+) \| (\d+) / (\d+) \| (\S+) \|$", out, re.M)
    assert len(rows) == 6 and all(float(r[0]) < 1e-5 for r in rows)  # the run's own scores, rescored
    assert all(r[1] == "1.000" and r[2] == r[3] for r in rows)  # no log-std in a discrete policy
    out = sh("analysis_variants.py", "rescore", "--run", saved, "--change", "target-adv-normalized")
    assert "median over 6 rounds" in out
    out = sh("analysis.py", "intervention", "--run", saved, "--every", "2", "--episodes", "4",
             "--out", str(tmp_path / "i.png"))
    assert "negatives dropped" in out and (tmp_path / "i.png").exists()


def test_episode_returns_by_hand():
    b = dict(rewards=torch.tensor([0.0, 0.0, 1.0, 0.0, 0.5, 0.0]), dones=torch.tensor([0.0, 0, 1, 0, 1, 0]))
    np.testing.assert_array_equal(analysis_variants.episode_returns(b), [1, 1, 1, 0.5, 0.5, np.nan])  # the last did not end


def test_dropped_subcommand(tmp_path):
    saved = iif_run(tmp_path, "cp", "--env-id", "CartPole-v1", "--filter-method", "influence", "--save-rounds",
                    "--total-timesteps", "512", *TINY)
    out = sh("analysis_variants.py", "dropped", "--run", saved)
    rows = [line.split(" | ") for line in out.splitlines() if re.match(r"\| \d", line)]
    metrics = analysis.read_metrics(os.path.join(saved, "metrics.csv"))
    assert [int(r[6]) for r in rows] == [int(m["n_dropped"]) for m in metrics] and len(rows) == 2
    assert all(float(r[3]) == pytest.approx(m["kl"], rel=1e-2) for r, m in zip(rows, metrics))
    # round 0: the KL over B(k) is the record-weighted mean of the KL on the kept and on the dropped records
    (kept, dropped), m = (float(x) for x in rows[0][4:6]), metrics[0]
    assert (m["n_kept"] * kept + m["n_dropped"] * dropped) / m["n_records"] == pytest.approx(m["kl"], rel=1e-2)
    assert rows[1][4] == rows[1][5] == "nan"  # no round file after the last


def test_minigrid_bottom_records(tmp_path):
    saved = iif_run(tmp_path, "mg", "--env-id", "MiniGrid-Empty-8x8-v0", "--filter-method", "none", "--save-rounds",
                    "--total-timesteps", "256", *TINY)
    out = sh("analysis.py", "bottom-records", "--run", saved, "--rounds", "0", "--n", "4",
             "--out", str(tmp_path / "m.png"))
    assert out.count("  record ") == 4 and (tmp_path / "m.png").exists()


def test_ablation_table_from_hand_made_runs(tmp_path):
    def write(variant, label, seed, returns, t_optim=1.0, t_influence=0.0):
        d = tmp_path / variant / f"E-v0__{label}__{seed}"
        d.mkdir(parents=True)
        lines = ["test_return_mean,t_optim,t_influence"] + [f"{r},{t_optim},{t_influence}" for r in returns]
        (d / "metrics.csv").write_text("\n".join(lines) + "\n")
    # recipe a, seed 1: standard reaches levels .1, .3, .9 after 1, 2, 4 rounds; IIF after 1, 1, 2
    write("a", "none", 1, [0.1, 0.3, 0.3, 0.9])
    write("a", "influence", 1, [0.3, 0.9, 0.9, 0.9], t_optim=1.0, t_influence=0.5)
    write("a", "none", 2, [0.1, 0.2])  # unfinished: skipped by --complete
    write("a", "influence", 2, [0.1, 0.2])
    write("b", "none", 1, [0.1, 0.3, 0.3, 0.9])  # recipe b has no IIF run
    out = sh("analysis_variants.py", "ablation", "--runs", str(tmp_path), "--variants", "a", "b", "--env", "E-v0",
             "--at-round", "2", "--complete", "E-v0=4")
    se_ave, se_peak, rt_peak = np.mean([0, 1 - 1 / 2, 1 - 2 / 4]), 1 - 2 / 4, 1 - 2 * 1.5 / 4
    # even levels .18, .26, ..., .9 (10 above the lowest, 0.1): standard after 2 rounds up to .3, then 4;
    # IIF after 1, then 2
    se_even = np.mean([1 - 1 / 2] * 3 + [1 - 2 / 4] * 7)
    cell = [f"{100 * x:.1f} (1 seed)" for x in (se_ave, se_even, se_peak, rt_peak)]
    assert (f"| E-v0 | a | 1 | {' | '.join(cell)} | 0.300 ± 0.000 | 0.900 ± 0.000 | 0.900 ± 0.000 | - |") in out
    assert "| E-v0 | b |" not in out  # no IIF run: no row


def test_frontier_reads_ppos_upper_envelope_at_equal_final_kl(tmp_path):
    def write(label, beta, seed, kl, reward, toxicity, final=True):
        d = tmp_path / f"ippo-detox__{label}-b{beta}__{seed}"
        d.mkdir()
        (d / "metrics.csv").write_text("kl,reward_mean,eval_toxicity\n1,0,0\n")  # the rounds: not read
        if final:
            (d / "final.json").write_text(json.dumps(dict(n_test=200, final_kl=kl, final_kl_se=0.1,
                                                          final_reward=reward, final_reward_se=0.1,
                                                          final_toxicity=toxicity)))
    for seed in (1, 2, 3):  # PPO, a zig-zag in KL: 10, 5, 2, 8 at beta 0.05, 0.2, 0.8, 3.2
        for beta, kl, reward, tox in ((0.05, 10, 3.0, 0.5), (0.2, 5, 2.0, 0.4), (0.8, 2, 1.0, 0.3),
                                      (3.2, 8, 1.5, 0.35)):
            write("none", beta, seed, kl, reward, tox)
        write("influence", 0.2, seed, math.sqrt(50), 2.6 + 0.2 * (seed - 1), 0.2)  # halfway between 5 and 10
        write("i-ppo", 0.2, seed, 0.5, 0.1, 0.2)  # below PPO's smallest KL
        write("i-ppo-noreweight", 0.2, seed, (1.5, 2.0, 2.5)[seed - 1], 1.0, 0.3)  # at PPO's smallest KL, on average
    write("influence", 0.8, 1, 3.0, 9.9, 0.0, final=False)  # under way
    out = sh("analysis_variants.py", "frontier", "--runs", str(tmp_path), "--env", "ippo-detox",
             "--resamples", "200", "--out", str(tmp_path / "f.png"))
    assert "1 run(s) without final.json" in out and "influence-b0.8__1" in out and "| IIF (f_seq) | 0.8 |" not in out
    # the envelope leaves out beta 3.2's point (KL 8, reward 1.5: PPO reaches 2.0 at KL 5); toxicity's is flat
    assert "reward at KL 2, 5, 10; test toxicity at KL 2, 10" in out
    # at KL sqrt(50), the frontier is 2.5: a difference of 0.3, and the t-interval of 3 seeds of sd 0.2 (PPO's
    # points have no spread)
    h = scipy.stats.t.ppf(0.975, 2) * 0.2 / math.sqrt(3)
    assert f"| IIF (f_seq) | 0.2 | 7.07 | +0.300 [{0.3 - h:+.3f}, {0.3 + h:+.3f}]" in out
    assert "| IIF (f_seq) | not detected at KL 7.1 (1 point) over 3 seeds | ahead of PPO at KL 7.1 (1 point) |" in out
    assert "| I-PPO | no KL in common | no KL in common |" in out
    edge = next(line for line in out.splitlines() if line.startswith("| I-PPO, no reweighting | 0.2 | 2 |"))
    share = int(edge.split("; ")[1].split("%")[0])
    assert 10 <= share <= 60, edge  # resamples whose mean KL falls below 2: counted, not dropped silently
    assert (tmp_path / "f.png").stat().st_size > 0
    for seed in (1, 2, 3):  # a second PPO frontier (VF_COEF=0.01) whose KLs take in I-PPO's
        write("none-vf0.01", 3.2, seed, 0.25, 0.0, 0.3)
        write("none-vf0.01", 0.8, seed, 1.0, 0.4, 0.3)
    out = sh("analysis_variants.py", "frontier", "--runs", str(tmp_path), "--env", "ippo-detox",
             "--resamples", "50", "--baseline", "none", "none-vf0.01", "--out", str(tmp_path / "f.png"))
    assert "| I-PPO | no KL in common | no KL in common |" in out  # against PPO
    # against the second frontier, read halfway in log KL at 0.5: reward 0.2 (toxicity flat at 0.3)
    assert "| I-PPO | 0.2 | 0.5 | -0.100 [-0.100, -0.100]" in out
    assert "| I-PPO | behind PPO, value coefficient 0.01 at KL 0.5 (1 point) | ahead of PPO, value coefficient " \
        "0.01 at KL 0.5 (1 point) |" in out


def test_frontier_reads_grpo_runs_by_the_metrics_of_their_final_json(tmp_path):
    """results/grpo_frontier.sh's runs: GRPO in PPO's place, and the test metric their final.json has"""
    def write(label, beta, seed, kl, accuracy):
        d = tmp_path / f"grpo-add__{label}-b{beta}__{seed}"
        d.mkdir()
        (d / "metrics.csv").write_text("round,reward_mean,eval_accuracy\n0,0,\n")
        (d / "final.json").write_text(json.dumps(dict(n_test=400, final_kl=kl, final_reward=accuracy,
                                                      final_accuracy=accuracy)))
    for seed in (1, 2, 3):
        write("none", 0.01, seed, 4.0, 0.6)
        write("none", 0.16, seed, 1.0, 0.5)
        write("random", 0.04, seed, 2.0, (0.44, 0.45, 0.46)[seed - 1])  # GRPO's frontier reads 0.55 at KL 2
    out = sh("analysis_variants.py", "frontier", "--runs", str(tmp_path), "--env", "grpo-add", "--resamples", "50",
             "--out", str(tmp_path / "f.png"))
    assert "| method | beta | seeds | KL to the reference | reward | test accuracy |" in out
    h = scipy.stats.t.ppf(0.975, 2) * 0.01 / math.sqrt(3)
    assert f"| random dropping | 0.04 | 2 | -0.100 [{-0.1 - h:+.3f}, {-0.1 + h:+.3f}]" in out
    assert "| random dropping | behind GRPO at KL 2 (1 point) | behind GRPO at KL 2 (1 point) |" in out


@pytest.fixture
def one_thread():
    """torch on one thread, as iif.py and analysis.py run it"""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_retrain_reproduces_iif_update_exactly(frozenlake_runs, one_thread):
    # iif.py draws every round's minibatch shuffles from one np.random.default_rng(seed), created before round 0
    # and consumed by update_epochs permutations of the buffer per round (--filter-method none keeps all records).
    # Round 0 sees it fresh; round 3 sees it after 3 rounds' permutations, replayed here. SGD has no state, so a
    # fresh optimizer is exact; torch runs on one thread, as in iif.py, so the sums run in its order.
    _, saved = frozenlake_runs
    config = analysis.load_config(saved)
    rng = np.random.default_rng(config["seed"])
    for k in range(4):
        b = analysis.load_round(saved, k)
        kept = torch.ones(len(b["influence"]), dtype=torch.bool)
        if k in (0, 3):
            if k == 0:  # a fresh rng, and theta(k) copied from an agent, as counterfactual_round does
                start = analysis.agent_for(config, b["state_dict"])
                agent = analysis.retrain(config, b, kept, config["seed"], start=start)
            else:
                agent = analysis.retrain(config, b, kept, config["seed"], rng)
            expected = analysis.load_round(saved, k + 1)["state_dict"]
            for name, value in agent.state_dict().items():
                assert torch.equal(value, expected[name]), (k, name)
        if k < 3:  # the permutations iif.py's round k drew
            for _ in range(config["update_epochs"]):
                rng.permutation(len(kept))
    theta_1 = analysis.load_round(saved, 1)["state_dict"]
    other = analysis.retrain(config, analysis.load_round(saved, 0), kept, config["seed"] + 1)
    assert not all(torch.equal(v, theta_1[n]) for n, v in other.state_dict().items())  # the seed matters


def tiny_round(lr=1e-4, n=256, seed=0):
    """A made-up buffer B(0) of FrozenLake-shaped records, scored at theta(0), and a config of one epoch of
    plain SGD (no advantage normalisation) with a small learning rate: the round is close to linear."""
    config = {f.name: getattr(variants.Args(), f.name) for f in dataclasses.fields(variants.Args)}
    config.update(env_id="FrozenLake-v1", env_kwargs=iif.PRESETS["FrozenLake-v1"]["env_kwargs"], optimizer="sgd",
                  learning_rate=lr, update_epochs=1, minibatch_size=8, adv_norm="none", filter_p=0.5,
                  max_grad_norm=0.0)
    torch.manual_seed(seed)
    agent = analysis.agent_for(config, iif.Agent(gym.spaces.Box(0, 1, (16,)), gym.spaces.Discrete(4)).state_dict())
    g = torch.Generator().manual_seed(seed)
    b = dict(obs=torch.eye(16)[torch.randint(16, (n,), generator=g)], actions=torch.randint(4, (n,), generator=g),
             advantages=torch.randn(n, generator=g))
    with torch.no_grad():
        b["logprobs"], _, b["values"] = agent(b["obs"], b["actions"])
    b["returns"] = b["advantages"] + b["values"]
    cfg = argparse.Namespace(**config)
    b["influence"] = variants.influence(agent, b, torch.arange(n), (b["obs"], b["actions"], b["advantages"]), cfg)
    b["state_dict"], b["influence_tracin"] = agent.state_dict(), None
    return config, b


def test_lds_near_one_when_the_round_is_nearly_linear(one_thread):
    config, b = tiny_round()
    out = analysis_variants.counterfactual_round(config, b, 0, m=100, fraction=0.5)
    assert out["lds"]["snapshot"] > 0.9, out["lds"]
    assert abs(out["lds"]["random"]) < 0.3, out["lds"]
    # first order: the round changes f by lr x epochs / minibatch x the summed scores of its records
    scale = analysis_variants.update_scale(config)
    assert out["f_full"] - out["f0"] == pytest.approx(scale * float(b["influence"].sum()), rel=0.05)
    # the group IIF drops, with one-record minibatches (so no remainder of the kept records is skipped), 2 epochs
    config = {**config, "minibatch_size": 1, "update_epochs": 2}
    full = torch.ones(len(b["influence"]), dtype=torch.bool)
    f_full = analysis_variants.f_return(analysis_variants.retrain(config, b, full, 0), b, config)
    g = analysis_variants.group_check(config, b, 0, f_full)
    predicted = -analysis_variants.update_scale(config) * g["dropped_sum"]
    assert g["n_dropped"] > 0 and g["actual"] == pytest.approx(predicted, rel=0.05)
    assert analysis_variants.update_scale({**config, "optimizer": "adam"}) is None


def test_counterfactual_subcommand(frozenlake_runs, tmp_path):
    _, saved = frozenlake_runs
    run = tmp_path / "run"
    shutil.copytree(saved, run)
    for k in (1, 3):  # a TracIn score that ranks the records opposite to the snapshot: the opposite LDS
        b = analysis.load_round(str(run), k)
        b["influence_tracin"] = -b["influence"]
        torch.save(b, run / "rounds" / f"round_{k:04d}.pt")
    out = sh("analysis_variants.py", "counterfactual", "--run", str(run), "--rounds", "1", "3", "--subsets", "6",
             "--out", str(tmp_path / "cf.png"))
    lds = {(s, k): float(v) for s, k, v in re.findall(r"\| (\w+) \| (\d+|mean) \| ([+-]\d\.\d+) \|", out)}
    assert {s for s, _ in lds} == {"snapshot", "tracin", "random"} and len(lds) == 9
    assert all(lds["snapshot", k] == pytest.approx(-lds["tracin", k], abs=1e-3) for k in ("1", "3", "mean"))
    assert all(abs(lds["snapshot", k]) > 0.01 for k in ("1", "3"))
    assert lds["snapshot", "mean"] == pytest.approx((lds["snapshot", "1"] + lds["snapshot", "3"]) / 2, abs=1e-3)
    assert "| round | dropped | predicted delta f |" in out and (tmp_path / "cf.png").exists()


def test_sensitivity_picks_each_methods_best_rate_and_compares_them(tmp_path):
    """Areas (mean test return over the rounds) by hand; a diverged rate is shown and never best; best against
    best is paired by seed"""
    runs = {("none-lr1x", 1): [0, 1, 2, 3], ("none-lr1x", 2): [0, 1, 2, 4],  # areas 1.5, 1.75
            ("none-lr3x", 1): [1, 2, 3, 3], ("none-lr3x", 2): [1, 2, 3, 4],  # 2.25, 2.5: standard's best
            ("influence-lr1x", 1): [0, 2, 3, 3], ("influence-lr1x", 2): [0, 2, 3, 4],
            ("influence-lr3x", 1): [2, 3, 3, 3], ("influence-lr3x", 2): [2, 3, 4, 4],  # 2.75, 3.25: IIF's best
            ("influence-lr10x", 2): [5]}  # stopped on a non-finite loss after a round
    for (label, seed), returns in runs.items():
        write_run(tmp_path, label, seed, returns)
        with open(tmp_path / f"E__{label}__{seed}" / "config.json", "w") as f:
            f.write('{"num_rounds": 4}')
    for seed in (1, 2):  # seed 1 diverged before its first round ended: no folder
        (tmp_path / f"E__influence-lr10x__{seed}.err").write_text("error: round 0: non-finite PPO loss (nan)")
    out = sh("analysis_variants.py", "sensitivity", "--runs", str(tmp_path), "--env", "E", "--out", str(tmp_path / "s.png"))
    assert (tmp_path / "s.png").stat().st_size > 10_000
    lines = out.splitlines()
    h = scipy.stats.t.ppf(0.975, 1) * 0.25 / 2  # two seeds 0.25 apart: sd 0.25 / sqrt(2), over sqrt(2)
    assert any(re.match(rf"\| E \| standard \| 3 \| 2 \| 2\.4 \[{2.375 - h:.1f}, {2.375 + h:.1f}\] \| .* \| best \|$", line)
               for line in lines)
    assert any(re.match(r"\| E \| IIF \| 3 \| 2 \| 3\.0 \[-?\d\.\d, \d\.\d\] \| .* \| best \|$", line) for line in lines)
    assert "| E | IIF | 10 | 0 | - | - | diverged (2 of 2 seeds) |" in lines
    diff = f"0.6 [{0.625 - h:.1f}, {0.625 + h:.1f}]"  # area, IIF at 3 x minus standard at 3 x: 0.5 and 0.75
    assert any(line.startswith("| E | best against best | 3 | 3 | 2 |") and line.endswith(f"| {diff} |")
               for line in lines)
    assert any(line.startswith("| E | both at the preset's | 1 | 1 | 2 |") for line in lines)
    p = scipy.stats.ttest_1samp([0.5, 0.75], 0).pvalue  # one environment: Holm's p is the test's
    assert (f"E: not detected over 2 seeds (area, IIF at 3 x minus standard at 3 x: {diff}, p {p:.2g}, "
            f"Holm p {p:.2g})") in out


def test_analysis_py_runs_copied_beside_iif_py_alone(tmp_path):
    """The paper's figures need iif.py and no other file of this project"""
    for f in ("iif.py", "analysis.py"):
        shutil.copy(os.path.join(ROOT, f), tmp_path)
    proc = subprocess.run([sys.executable, "analysis.py", "efficiency", "--runs", os.path.join(ROOT, "results", "runs"),
                           "--env", "FrozenLake-v1"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert proc.returncode == 0 and "| FrozenLake-v1 |" in proc.stdout, proc.stderr[-2000:]


@pytest.mark.parametrize("n", [3, 5])
def test_welch_against_the_papers_mean_and_std(n):
    """Welch's t statistic and Satterthwaite's degrees of freedom by hand, against a paper's mean ± std over 3 seeds"""
    import verdicts
    x = np.random.default_rng(n).normal(10, 3, n)
    va, vb = x.var(ddof=1) / n, 2.0 ** 2 / 3
    t = (x.mean() - 14.0) / np.sqrt(va + vb)
    dof = (va + vb) ** 2 / (va ** 2 / (n - 1) + vb ** 2 / 2)
    assert verdicts.welch(x, 14.0, 2.0) == pytest.approx(2 * scipy.stats.t.sf(abs(t), dof), rel=1e-9)


def test_paper_table_says_a_verdict_only_where_the_holm_adjusted_test_allows(tmp_path, monkeypatch):
    """SE_ave over standard's record levels 1-4 (rounds 1-4): on E, IIF reaches them in rounds 1, 1, 2, 3 (seeds 1, 2)
    and 1, 2, 2, 3 (seed 3), SE (0 + 1/2 + 1/3 + 1/4) / 4 and (0 + 0 + 1/3 + 1/4) / 4: ahead of standard PPO (p 0.032);
    against a paper at 25 ± 1 % not detected, at 50 ± 1 % below. F leads as weakly (p 0.027): each is ahead alone,
    and neither once Holm counts the two"""
    import verdicts
    for env, runs in (("E", ([2, 3, 4, 4], [2, 3, 4, 4], [1, 3, 4, 4])), ("F", ([1, 3, 4, 4], [1, 3, 4, 4], [1, 3, 3, 4]))):
        for seed, iif_returns in enumerate(runs, 1):
            write_run(tmp_path / env, "none", seed, [1, 2, 3, 4])
            write_run(tmp_path / env, "influence", seed, iif_returns)
            for label in ("none", "influence"):
                shutil.move(tmp_path / env / f"E__{label}__{seed}", tmp_path / f"{env}__{label}__{seed}")
    x = [100 * (1 / 2 + 1 / 3 + 1 / 4) / 4] * 2 + [100 * (1 / 3 + 1 / 4) / 4]
    for paper, word in (((25.0, 1.0), "not detected to differ"), ((50.0, 1.0), "below")):
        monkeypatch.setitem(analysis_variants.PAPER_FIG6B, "E", (paper, paper, paper))
        out = sh("analysis_variants.py", "paper", "--runs", str(tmp_path), "--env", "E")
        row = next(line for line in out.splitlines() if line.startswith("| E | SE_ave, records |"))
        cells = [c.strip() for c in row.split("|")[1:-1]]
        p = verdicts.p_value(x)
        assert cells[2] == "3" and cells[3] == verdicts.family({"E": x})["E"]["text"], row
        assert cells[4] == cells[5] == verdicts.p_text(p) and cells[6] == "ahead", row
        assert cells[8] == cells[9] == verdicts.p_text(verdicts.welch(x, *paper)) and cells[10] == word, row
    weak = [100 * 7 / 48] * 2 + [100 / 12]
    assert 0.025 < verdicts.p_value(weak) < verdicts.p_value(x) < 0.05  # Holm doubles the smaller: both above 0.05

    def word(out, env):
        return next(line for line in out.splitlines() if line.startswith(f"| {env} | SE_ave, records |")).split(" | ")[6]
    assert word(sh("analysis_variants.py", "paper", "--runs", str(tmp_path), "--env", "F"), "F") == "ahead"
    both = sh("analysis_variants.py", "paper", "--runs", str(tmp_path), "--env", "E", "F")
    assert word(both, "E") == word(both, "F") == "not detected over 3 seeds"


def test_efficiency_as_if_tested_on_fewer_episodes(tmp_path):
    """--test-episodes adds normal noise of sd test_return_std x sqrt(1/N - 1/M), M the run's own test episodes:
    none where the std is 0, the same draws for the same --noise-seed, and N >= M refused"""
    def write(std):
        for label, seed, returns in (("none", 1, [1, 2, 3, 4]), ("influence", 1, [1.5, 2.5, 3.5, 4.5]),
                                     ("none", 2, [1, 2, 3, 4]), ("influence", 2, [2.5, 2.5, 3.5, 4.5])):
            run = tmp_path / str(std) / f"E__{label}__{seed}"
            write_run(tmp_path / str(std), label, seed, returns)
            with open(run / "metrics.csv") as f:
                rows = list(csv.DictReader(f))
            with open(run / "metrics.csv", "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=iif.METRICS)
                w.writeheader()
                w.writerows({**r, "test_return_std": std} for r in rows)
            with open(run / "config.json", "w") as f:
                json.dump({"eval_episodes": 100}, f)
        return ("analysis_variants.py", "efficiency", "--runs", str(tmp_path / str(std)), "--env", "E")

    def table(*cmd):
        return [line for line in sh(*cmd).splitlines() if line.startswith("| E |")]
    cmd = write(0.0)
    assert table(*cmd, "--test-episodes", "2") == table(*cmd)  # no spread, no noise
    cmd = write(3.0)  # sd 3 x sqrt(1/2 - 1/100) = 2.1: the levels reorder
    noisy = [table(*cmd, "--test-episodes", "2", "--noise-seed", str(k)) for k in (0, 0, 1, 2)]
    assert noisy[0] == noisy[1] and noisy[0] != table(*cmd) and len({str(t) for t in noisy[1:]}) > 1
    with pytest.raises(SystemExit, match="--test-episodes 100 must be below the runs' own 100"):
        sh(*cmd, "--test-episodes", "100")
