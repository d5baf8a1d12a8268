"""analysis_variants.py frontier --rule runs: the monotone frontier over runs, read seed by seed against the
frontier of the baseline's other seeds (docs/ippo.md, "At equal KL"). Synthetic data only; a few seconds."""
import contextlib
import io
import json
import sys
from unittest import mock

import numpy as np
import pytest

import analysis_variants as av

BETAS = (0.05, 0.2, 0.8, 3.2)


def synthetic(rng, shift=0.0, log_kl_shift=0.0, seeds=5, slope=0.3, noise=0.3, kl_noise=0.3):
    """Runs [(beta, seed, {final_kl, final_reward})] of one smooth curve (reward = slope * log KL) plus noise, a
    run per beta and seed, each beta at its own KL (larger beta, smaller KL); shift added to every reward"""
    out = []
    for s in range(1, seeds + 1):
        for j, b in enumerate(BETAS):
            lk = np.log(8.0) - np.log(2.0) * j + log_kl_shift + rng.normal(0, kl_noise)
            out.append((b, str(s), {"final_kl": float(np.exp(lk)),
                                    "final_reward": slope * lk + shift + rng.normal(0, noise)}))
    return out


def test_monotone_fit_by_hand():
    """Pool-adjacent-violators on four runs: the violating pair (3, 2) pooled to 2.5; nonincreasing where lower is
    better; runs at one KL pooled first (weighted)"""
    x, f = av.monotone_fit([1, 2, 4, 8], [1, 3, 2, 4])
    np.testing.assert_allclose(x, np.log([1, 2, 4, 8]))
    np.testing.assert_allclose(f, [1, 2.5, 2.5, 4])
    np.testing.assert_allclose(av.monotone_fit([8, 4, 2, 1], [0, 2, 1, 3], lower_is_better=True)[1], [3, 1.5, 1.5, 0])
    x, f = av.monotone_fit([1, 1, 2], [0, 2, 0])  # KL 1: mean 1 over 2 runs; KL 2: 0 -> pooled (2 + 0) / 3
    np.testing.assert_allclose(x, np.log([1, 2]))
    np.testing.assert_allclose(f, [2 / 3, 2 / 3])
    x, f = av.monotone_fit([1, 2, np.nan, 4, -0.1], [0, 1, 5, np.nan, 9])  # no KL, no value, KL <= 0: left out
    np.testing.assert_allclose(f, [0, 1])


def test_monotone_fit_is_monotone_and_read_in_log_kl():
    rng = np.random.default_rng(0)
    kl, y = np.exp(rng.normal(0, 1, 60)), rng.normal(0, 1, 60)
    assert np.all(np.diff(av.monotone_fit(kl, y)[1]) >= -1e-12)
    assert np.all(np.diff(av.monotone_fit(kl, y, lower_is_better=True)[1]) <= 1e-12)
    fit = av.monotone_fit([1, 4], [0, 1])
    assert av.read_fit(fit, 2.0) == pytest.approx(0.5)  # halfway in log KL
    assert av.read_fit(fit, 4.0) == pytest.approx(1.0)
    assert np.isnan(av.read_fit(fit, 0.5)) and np.isnan(av.read_fit(fit, 8.0)) and np.isnan(av.read_fit(fit, 0.0))
    assert np.isnan(av.read_fit(av.monotone_fit([], []), 1.0))


def test_null_not_detected_and_a_shift_detected_both_ways():
    """PPO's left-out seeds against the frontier of its other seeds: not detected; a method shifted by a clear
    margin (at KLs of its own) reads behind or ahead, the sign of the shift turning the verdict; the same values
    negated and read as lower-is-better keep the word (its difference's sign turns)"""
    rng = np.random.default_rng(1)
    base = synthetic(rng)
    for shift, word in ((-0.6, "behind"), (0.6, "ahead")):
        runs = {"none": base, "m": synthetic(np.random.default_rng(2), shift=shift, log_kl_shift=0.2)}
        null, cells = av.frontier_family(runs, "none", "final_reward")
        assert null["n"] == 5 and null["verdict"] == "not detected over 5 seeds" and null["p"] > 0.05
        assert cells["m"]["verdict"] == word and np.sign(cells["m"]["mean"]) == np.sign(shift)
        assert cells["m"]["mean"] == pytest.approx(shift, abs=0.25)
        mean = cells["m"]["mean"]
        # the values negated, read as a lower-is-better metric: the frontier turns nonincreasing, the word stays
        flip = {k: [(b, s, {"final_kl": v["final_kl"], "final_reward": -v["final_reward"]}) for b, s, v in r]
                for k, r in runs.items()}
        null, cells = av.frontier_family(flip, "none", "final_reward", lower_is_better=True)
        assert null["verdict"] == "not detected over 5 seeds"
        assert cells["m"]["verdict"] == word and cells["m"]["mean"] == pytest.approx(-mean)


def test_runs_outside_the_frontier_are_left_out():
    rng = np.random.default_rng(3)
    runs = {"none": synthetic(rng), "far": synthetic(rng, log_kl_shift=10.0), "m": synthetic(rng)}
    _, cells = av.frontier_family(runs, "none", "final_reward")
    assert cells["far"]["n"] == 0 and len(cells["far"]["outside"]) == 20 and "verdict" not in cells["far"]
    assert cells["m"]["n"] >= 2  # the family's Holm counts the methods with a difference only
    assert av.runs_left_out([(0.05, "3"), (0.05, "1"), (3.2, "5")]) == "β 0.05: seeds 1 3; β 3.2: seed 5"


def test_the_rule_holds_its_level_on_synthetic_nulls():
    """Over many synthetic nulls (the method drawn as PPO, at KLs half a step larger), the method's difference is
    called at about the test's 5 %, and PPO's own null check almost never; the upper envelope of the other seeds'
    runs, read the same way, leans below 0 (its left-out seeds sit under the others' running best). A family of
    one method: its Holm p is its p (frontier_cells and verdicts.p_value: statsmodels' Holm runs gc.collect())"""
    rng = np.random.default_rng(4)
    called = null_called = 0
    envelope_means = []
    sims = 300
    for _ in range(sims):
        runs = {"none": synthetic(rng), "m": synthetic(rng, log_kl_shift=0.35)}
        null, _, cells = av.frontier_cells(runs, "none", "final_reward")
        called += av.verdicts.p_value(cells["m"]["cell"]) < 0.05
        null_called += av.verdicts.p_value(list(null.values())) < 0.05
        if len(envelope_means) < 40:
            envelope_means.append(np.mean(list(av.envelope_null(runs["none"], "final_reward",
                                                                per_beta=False).values())))
    assert called / sims < 0.09  # 5 % and its Monte Carlo error (about 1.3 % at 300)
    assert null_called / sims < 0.05
    assert np.mean(envelope_means) < -0.1


def test_command_prints_the_rule(tmp_path):
    """frontier --rule runs end to end on synthetic run folders (final.json, and the metrics.csv load_runs finds)"""
    rng = np.random.default_rng(5)
    for label, runs in (("none", synthetic(rng)), ("influence", synthetic(rng, shift=-0.8))):
        for b, s, v in runs:
            d = tmp_path / f"ippo-detox__{label}-b{b:g}__{s}"
            d.mkdir()
            (d / "metrics.csv").write_text("round,kl\n0,0.1\n")
            (d / "final.json").write_text(json.dumps({**v, "final_toxicity": 0.5 - v["final_reward"] / 4}))
    out = io.StringIO()
    argv = ["analysis_variants.py", "frontier", "--rule", "runs", "--runs", str(tmp_path), "--env", "ippo-detox",
            "--out", str(tmp_path / "f.png")]
    with contextlib.redirect_stdout(out), mock.patch.object(sys, "argv", argv):
        av.main()
    text = out.getvalue()
    assert text.startswith("$ python research/analysis_variants.py frontier --rule runs")
    assert "| reward | monotone fit over runs (this rule) | 5 |" in text
    rows = [r for r in text.splitlines() if r.startswith("| ippo-detox | PPO |")]
    assert len(rows) == 2 and rows[0].split(" | ")[2:4] == ["reward", "IIF (f_seq)"] and rows[0].endswith("| behind |")
    assert rows[1].split(" | ")[2] == "test toxicity" and rows[1].endswith("| behind |")
    assert (tmp_path / "f.png").exists()
