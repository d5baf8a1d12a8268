"""research/verdicts.py: the reading of every verdict table against scipy and hand computations."""
import math
import os
import sys

import numpy as np
import pytest
import scipy.stats

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "research"))
import verdicts  # noqa: E402


def test_t_interval_and_p_value_against_scipy():
    x = np.array([4.0, 1.0, 3.0, 8.0])
    mean, lo, hi = verdicts.t_interval(x)
    assert (mean, lo, hi) == pytest.approx((4.0, *scipy.stats.t.interval(0.95, 3, 4.0, scipy.stats.sem(x))), rel=1e-12)
    assert verdicts.p_value(x) == pytest.approx(scipy.stats.ttest_1samp(x, 0).pvalue, rel=1e-12)
    assert verdicts.t_interval([2.0])[0] == 2.0 and math.isnan(verdicts.t_interval([2.0])[1])  # one seed: no interval
    assert math.isnan(verdicts.p_value([2.0]))
    assert verdicts.p_value([0.0, 0.0]) == 1.0 and verdicts.p_value([3.0, 3.0]) == 0.0  # no spread


def test_holm_against_a_hand_computation():
    # sorted 0.01, 0.02, 0.04 times 3, 2, 1, kept non-decreasing: 0.03, 0.04, 0.04; nan stays out of the count
    assert verdicts.holm([0.04, 0.01, math.nan, 0.02])[[0, 1, 3]] == pytest.approx([0.04, 0.03, 0.04])
    assert math.isnan(verdicts.holm([0.04, 0.01, math.nan, 0.02])[2])
    assert verdicts.holm([0.3, 0.6]) == pytest.approx([0.6, 0.6])


def test_verdict_words():
    assert verdicts.verdict(1.2, 0.049, 3) == "ahead" and verdicts.verdict(-1.2, 0.01, 5) == "behind"
    assert verdicts.verdict(1.2, 0.05, 3) == "not detected over 3 seeds"
    assert verdicts.verdict(1.2, 0.0, 1) == "not detected over 1 seed"  # one seed has no test
    assert verdicts.verdict(-0.5, 0.01, 5, "above random", "below random", "round") == "below random"
    assert verdicts.verdict(0.5, 0.2, 5, unit="round") == "not detected over 5 rounds"


def test_family_holds_a_weak_cell_once_holm_counts_two():
    strong, weak = [3.0, 3.5, 4.0, 4.5], [0.4, 1.1, 0.5, 1.3]
    alone = verdicts.family({"weak": weak})["weak"]
    assert 0.025 < alone["p"] < 0.05 and alone["verdict"] == "ahead" and alone["p_holm"] == alone["p"]
    fam = verdicts.family({"strong": strong, "weak": weak, "another": weak})
    assert fam["strong"]["verdict"] == "ahead" and fam["weak"]["verdict"] == "not detected over 4 seeds"
    assert fam["weak"]["p_holm"] == pytest.approx(2 * alone["p"])  # sorted: strong x 3, then weak x 2 and x 1
    mean, lo, hi = verdicts.t_interval(weak)
    assert fam["weak"]["text"] == f"{mean:.1f} [{lo:.1f}, {hi:.1f}]"
    assert verdicts.family({"one": [2.0]}, "+.2f")["one"]["text"] == "+2.00 (1 seed)"


def test_family_turns_its_words_where_lower_is_better():
    toxicity = [0.1, 0.12, 0.09, 0.11, 0.13]  # a method's toxicity minus the baseline's: higher, so behind
    assert verdicts.family({"m": toxicity}, lower_is_better=True)["m"]["verdict"] == "behind"
    assert verdicts.family({"m": toxicity})["m"]["verdict"] == "ahead"
    assert verdicts.family({"m": toxicity}, words=("higher", "lower"), lower_is_better=True)["m"]["verdict"] == "lower"


def test_welch_and_antisymmetric():
    x = np.array([10.0, 12.0, 11.0, 15.0])
    ref = scipy.stats.ttest_ind_from_stats(x.mean(), x.std(ddof=1), 4, 14.0, 2.0, 3, equal_var=False).pvalue
    assert verdicts.welch(x, 14.0, 2.0) == pytest.approx(ref, rel=1e-12)
    a, b = np.array([10.0, -20.0]), np.array([-5.0, 4.0])
    np.testing.assert_allclose(verdicts.antisymmetric(a, b), -verdicts.antisymmetric(b, a))  # swapped: sign flips
    np.testing.assert_allclose(verdicts.antisymmetric(a, b), [7.5, -12.0])


def test_p_text():
    assert verdicts.p_text(math.nan) == "-" and verdicts.p_text(0.0004) == "<0.001" and verdicts.p_text(0.0123) == "0.012"
