"""The statistics of every verdict table, in one place (docs/results.md, "How a verdict is read").

Two arms are compared seed by seed: the arms of one seed share theta(0) and B(0), so each seed gives one difference
(arm minus baseline), and over the seeds:
- "mean [lo, hi]" is the mean difference and its 95 % t-interval, in every table of the project;
- p is the two-sided one-sample t-test of the differences against 0 (scipy), the paired test of the two arms;
- a verdict is one family (the environments of one README line, or the six against the paper): Holm's adjustment
  over its cells (statsmodels' multipletests);
- "ahead" or "behind" only where the Holm-adjusted p is below 0.05; else "not detected over N seeds".
SE_ave's reading is antisymmetric (`antisymmetric`): SE_ave over one arm's record levels leans below 0 even between
two copies of one run, since its levels sit on that arm's own upward noise. tests/test_verdicts.py checks the
reading on a synthetic pair and Holm against a hand computation; tests/test_analysis.py, that analysis.py's own
t-interval (a file a student copies alone) is this one.
"""
import gc
import math

import numpy as np
import scipy.stats
from statsmodels.stats.multitest import multipletests

ALPHA = 0.05  # the family-wise error rate of one verdict


def t_interval(x, level=0.95):
    """(mean, low, high): the 95 % t-interval of the mean; the mean alone (low = high = nan) below 2 values"""
    x = np.asarray(x, dtype=float)
    if len(x) < 2:
        return float(np.mean(x)) if len(x) else math.nan, math.nan, math.nan
    h = scipy.stats.t.ppf((1 + level) / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return float(x.mean()), float(x.mean() - h), float(x.mean() + h)


def p_value(x):
    """Two-sided one-sample t-test of mean 0 (nan below 2 values; 0 or 1 where every value is the same)"""
    x = np.asarray(x, dtype=float)
    if len(x) < 2:
        return math.nan
    if np.ptp(x) == 0:
        return 1.0 if x[0] == 0 else 0.0
    return float(scipy.stats.ttest_1samp(x, 0.0).pvalue)


def welch(x, mean, std, n=3):
    """Welch's two-sided p of our values x against a paper's mean +- std over its n seeds"""
    x = np.asarray(x, dtype=float)
    return float(scipy.stats.ttest_ind_from_stats(x.mean(), x.std(ddof=1), len(x), mean, std, n,
                                                  equal_var=False).pvalue)


def holm(ps):
    """Holm-adjusted p-values of one family; nan (a cell with no test) stays nan and is not counted"""
    ps = np.asarray(ps, dtype=float)
    out = np.full(len(ps), math.nan)
    ok = ~np.isnan(ps)
    if ok.any():
        gc.freeze()  # statsmodels' Holm calls gc.collect(), 0.2 s in a process holding torch: spare it the objects
        try:
            out[ok] = multipletests(ps[ok], alpha=ALPHA, method="holm")[1]
        finally:
            gc.unfreeze()
    return out


def verdict(mean, p_adjusted, n, above="ahead", below="behind", unit="seed"):
    """The one rule: the direction of the mean where the adjusted p is below ALPHA, else not detected (over n units:
    seeds, or the rounds of one run where those are the sample)"""
    if n >= 2 and p_adjusted < ALPHA:
        return above if mean > 0 else below
    return f"not detected over {n} {unit}{'' if n == 1 else 's'}"


def antisymmetric(se_over_base, se_over_other):
    """SE_ave's reading with no lean: (SE of the arm over the baseline's levels - SE of the baseline over the arm's
    levels) / 2. Swapping the arms flips its sign, so two exchangeable arms score 0 in expectation."""
    return (np.asarray(se_over_base, dtype=float) - np.asarray(se_over_other, dtype=float)) / 2


def family(cells, fmt=".1f", lower_is_better=False, words=("ahead", "behind"), unit="seed"):
    """One verdict's cells {name: per-seed differences} -> {name: dict(n, mean, lo, hi, p, p_holm, verdict, text)},
    Holm over the cells that have a test. words: the verdict above 0 and below it, turned where lower is better
    (a positive difference is then the second)"""
    names = list(cells)
    ps = [p_value(cells[k]) for k in names]
    adjusted = holm(ps)
    above, below = words[::-1] if lower_is_better else words
    out = {}
    for k, p, pa in zip(names, ps, adjusted):
        mean, lo, hi = t_interval(cells[k])
        n = len(cells[k])
        out[k] = dict(n=n, mean=mean, lo=lo, hi=hi, p=p, p_holm=pa, verdict=verdict(mean, pa, n, above, below, unit),
                      text=f"{mean:{fmt}} [{lo:{fmt}}, {hi:{fmt}}]" if n >= 2 else f"{mean:{fmt}} (1 {unit})")
    return out


def p_text(p):
    return "-" if math.isnan(p) else f"{p:.2g}" if p >= 0.001 else "<0.001"

