"""The statistics behind regression alerts, anytime-valid windows and judge calibration: against scipy and
statsmodels where they compute the same thing, and by simulation (10,000 windows, fixed seeds) where they do not:
each interval holds its true value within 1.5 points of its nominal 95%."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.inter_rater import cohens_kappa
from statsmodels.stats.proportion import confint_proportions_2indep, proportion_confint
from statsmodels.stats.weightstats import CompareMeans, DescrStatsW

from evalsi.policies.calibration import calibrate, cohen_kappa, ppi_mean
from evalsi.policies.compare import Sample, compare, newcombe_interval, t_quantile_real, welch_interval
from evalsi.policies.intervals import wilson_interval
from evalsi.policies.sequences import BoundedMeanSequence

WINDOWS = 10_000
NOMINAL = 0.95
TOLERANCE = 0.015


def covered(hits: int) -> float:
    return hits / WINDOWS


# --- against scipy / statsmodels ------------------------------------------------------------------------------


@pytest.mark.parametrize("df", [0.7, 1.3, 2.5, 4.0, 9.81, 33.3, 250.5, 5000.25])
@pytest.mark.parametrize("p", [0.6, 0.9, 0.975, 0.995])
def test_t_quantile_for_real_degrees_of_freedom_is_scipys(df: float, p: float) -> None:
    assert t_quantile_real(p, df) == pytest.approx(stats.t.ppf(p, df), rel=1e-10, abs=1e-10)
    assert t_quantile_real(1 - p, df) == pytest.approx(stats.t.ppf(1 - p, df), rel=1e-10, abs=1e-10)


@pytest.mark.parametrize(
    ("x1", "n1", "x2", "n2"), [(40, 50, 30, 60), (0, 20, 3, 25), (19, 19, 10, 30), (980, 1000, 960, 1000), (1, 3, 2, 2)]
)
def test_newcombe_is_statsmodels_hybrid_score_interval(x1: int, n1: int, x2: int, n2: int) -> None:
    low, high = newcombe_interval(x1, n1, x2, n2)
    expected = confint_proportions_2indep(x1, n1, x2, n2, method="newcomb", compare="diff")
    assert (low, high) == pytest.approx(expected, abs=1e-12)


def test_welch_is_statsmodels_unequal_variance_interval() -> None:
    rng = np.random.default_rng(7)
    for n1, n2 in [(5, 40), (30, 31), (200, 12)]:
        a, b = rng.beta(2, 5, n1), rng.normal(0.4, 0.3, n2)
        low, high, df = welch_interval(a.mean(), a.std(ddof=1), n1, b.mean(), b.std(ddof=1), n2)
        expected = CompareMeans(DescrStatsW(a), DescrStatsW(b)).tconfint_diff(usevar="unequal")
        assert (low, high) == pytest.approx(expected, rel=1e-10)
        assert df == pytest.approx(stats.ttest_ind(a, b, equal_var=False).df, rel=1e-12)


@pytest.mark.parametrize(
    "table", [[[40, 10], [5, 45]], [[3, 12], [9, 76]], [[20, 5, 1], [4, 30, 6], [0, 7, 27]], [[0, 4], [6, 90]]]
)
def test_kappa_and_its_standard_error_are_statsmodels(table: list[list[int]]) -> None:
    found = cohen_kappa(table)
    expected = cohens_kappa(np.array(table))
    assert found is not None
    assert found.kappa == pytest.approx(expected.kappa, abs=1e-12)
    assert found.se == pytest.approx(expected.std_kappa, abs=1e-12)
    assert (found.low, found.high) == pytest.approx((expected.kappa_low, expected.kappa_upp), abs=1e-12)


def test_kappa_is_none_when_nobody_disagrees_about_one_class() -> None:
    assert cohen_kappa([[0, 0], [0, 30]]) is None
    assert cohen_kappa([[0, 0], [0, 0]]) is None


def test_sensitivity_and_specificity_have_statsmodels_wilson_intervals() -> None:
    # judge, human: 30 both fail, 10 the judge missed, 50 both pass, 10 the judge failed wrongly
    pairs = [(False, False)] * 30 + [(True, False)] * 10 + [(True, True)] * 50 + [(False, True)] * 10
    c = calibrate("p", "builtin/llm-judge", "faithfulness", pairs, (200, 200))
    assert c.confusion.table == [[30, 10], [10, 50]]
    assert c.sensitivity == pytest.approx((0.75, *proportion_confint(30, 40, method="wilson")), abs=1e-12)
    assert c.specificity == pytest.approx((50 / 60, *proportion_confint(50, 60, method="wilson")), abs=1e-12)
    assert c.kappa is not None
    assert c.kappa.kappa == pytest.approx(cohens_kappa(np.array(c.confusion.table)).kappa, abs=1e-12)


def test_comparison_picks_newcombe_for_rates_and_welch_for_means() -> None:
    rates = compare(Sample(pass_n=400, passed=340), Sample(pass_n=4000, passed=3800), margin=0.02)
    assert rates is not None and rates.method == "newcombe"
    assert (rates.low, rates.high) == pytest.approx(newcombe_interval(340, 400, 3800, 4000), abs=1e-12)
    assert rates.regressed  # 85% against 95%: the whole interval lies below -2 points
    means = compare(
        Sample(value_n=50, value_mean=0.8, value_sd=0.1),
        Sample(value_n=500, value_mean=0.81, value_sd=0.1),
        margin=0.02,
    )
    assert means is not None and means.method == "welch" and not means.regressed  # a 1-point dip: not beyond 2
    slower = compare(
        Sample(value_n=80, value_mean=1400, value_sd=300),
        Sample(value_n=900, value_mean=1000, value_sd=250),
        worse="higher",
    )
    assert slower is not None and slower.regressed and slower.low > 0


# --- coverage by simulation -------------------------------------------------------------------------------------


def test_wilson_covers_the_rate() -> None:
    rng = np.random.default_rng(1)
    p, n = 0.3, 200
    hits = 0
    for x in rng.binomial(n, p, WINDOWS):
        low, high = wilson_interval(int(x), n)
        hits += low <= p <= high
    assert abs(covered(hits) - NOMINAL) <= TOLERANCE, covered(hits)


def test_newcombe_covers_the_difference_of_rates() -> None:
    rng = np.random.default_rng(2)
    p1, p2, n1, n2 = 0.8, 0.72, 150, 400
    hits = 0
    for x1, x2 in zip(rng.binomial(n1, p1, WINDOWS), rng.binomial(n2, p2, WINDOWS), strict=True):
        low, high = newcombe_interval(int(x1), n1, int(x2), n2)
        hits += low <= p1 - p2 <= high
    assert abs(covered(hits) - NOMINAL) <= TOLERANCE, covered(hits)


def test_welch_covers_the_difference_of_means_with_unequal_variances() -> None:
    rng = np.random.default_rng(3)
    n1, n2 = 25, 60
    a = rng.beta(2, 2, (WINDOWS, n1))  # mean 0.5, sd 0.22
    b = rng.beta(8, 4, (WINDOWS, n2))  # mean 2/3, sd 0.13
    truth = 0.5 - 2 / 3
    m1, s1, m2, s2 = a.mean(1), a.std(1, ddof=1), b.mean(1), b.std(1, ddof=1)
    hits = 0
    for i in range(WINDOWS):
        low, high, _ = welch_interval(m1[i], s1[i], n1, m2[i], s2[i], n2)
        hits += low <= truth <= high
    assert abs(covered(hits) - NOMINAL) <= TOLERANCE, covered(hits)


def test_kappa_interval_covers_the_population_kappa() -> None:
    rng = np.random.default_rng(4)
    cells = np.array([[0.20, 0.06], [0.08, 0.66]])  # judge x human
    rows, cols = cells.sum(1), cells.sum(0)
    expected = (rows * cols).sum()
    truth = (np.trace(cells) - expected) / (1 - expected)
    hits = 0
    for counts in rng.multinomial(400, cells.ravel(), WINDOWS):
        found = cohen_kappa(counts.reshape(2, 2).tolist())
        hits += found is not None and found.low <= truth <= found.high
    assert abs(covered(hits) - NOMINAL) <= TOLERANCE, covered(hits)


def test_sensitivity_interval_covers_the_judges_hit_rate() -> None:
    rng = np.random.default_rng(5)
    sensitivity, failed_by_people = 0.82, 120
    hits = 0
    for caught in rng.binomial(failed_by_people, sensitivity, WINDOWS):
        pairs = [(False, False)] * int(caught) + [(True, False)] * (failed_by_people - int(caught))
        found = calibrate("p", "e", "n", pairs, (0, 0)).sensitivity
        assert found is not None
        hits += found[1] <= sensitivity <= found[2]
    assert abs(covered(hits) - NOMINAL) <= TOLERANCE, covered(hits)


def test_prediction_powered_interval_covers_the_true_rate_and_is_narrower_than_labels_alone() -> None:
    """A judge that errs on 10% of traces, more often towards passing: its own rate is biased, the PPI estimate
    corrects it with 150 human labels and covers the true rate; its interval is narrower than the labels' own."""
    rng = np.random.default_rng(6)
    truth, labeled, unlabeled = 0.7, 150, 3000

    def judge(y: np.ndarray) -> np.ndarray:
        flip = rng.random(y.shape) < np.where(y == 1, 0.04, 0.25)  # fails missed more than passes
        return np.where(flip, 1 - y, y)

    hits = narrower = 0
    for _ in range(WINDOWS):
        y = (rng.random(labeled) < truth).astype(float)
        f_unlabeled = judge((rng.random(unlabeled) < truth).astype(float))
        found = ppi_mean(f_unlabeled.tolist(), judge(y).tolist(), y.tolist())
        assert found is not None
        hits += found.low <= truth <= found.high
        narrower += (found.high - found.low) < (found.classical_high - found.classical_low)
    assert abs(covered(hits) - NOMINAL) <= TOLERANCE, covered(hits)
    assert narrower / WINDOWS > 0.99
    assert abs(f_unlabeled.mean() - truth) > 0.05  # the judge alone is biased: the correction is doing the work


# --- confidence sequences ------------------------------------------------------------------------------------------


def test_the_sequence_runs_alike_on_floats_and_on_numpy_arrays() -> None:
    rng = np.random.default_rng(8)
    x = rng.beta(3, 2, (4, 300))
    many = BoundedMeanSequence(0.05, xp=np)
    one = BoundedMeanSequence(0.05)
    for t in range(300):
        many.add(x[:, t])
        one.add(float(x[2, t]))
    assert (float(many.low[2]), float(many.high[2])) == pytest.approx(one.interval, abs=1e-12)


def test_the_sequence_holds_the_mean_at_every_look_where_the_repeated_interval_does_not() -> None:
    """10,000 streams of 500 values, each looked at after every value: the confidence sequence misses the mean at
    some time in at most 5% of streams; the fixed-sample t interval looked at as often misses it in far more."""
    rng = np.random.default_rng(9)
    steps, mean = 500, 0.8
    cs = BoundedMeanSequence(0.05, xp=np)
    ever_out_cs = np.zeros(WINDOWS, bool)
    ever_out_t = np.zeros(WINDOWS, bool)
    total = np.zeros(WINDOWS)
    squares = np.zeros(WINDOWS)
    for t in range(1, steps + 1):
        x = rng.beta(8, 2, WINDOWS)  # mean 0.8
        cs.add(x)
        ever_out_cs |= (cs.low > mean) | (cs.high < mean)
        total += x
        squares += x * x
        if t >= 10:
            m = total / t
            sd = np.sqrt(np.maximum(squares / t - m * m, 0) * t / (t - 1))
            half = stats.t.ppf(0.975, t - 1) * sd / math.sqrt(t)
            ever_out_t |= np.abs(m - mean) > half
    assert ever_out_cs.mean() <= 0.05 + TOLERANCE / 3, ever_out_cs.mean()
    assert ever_out_t.mean() > 0.2, ever_out_t.mean()
    assert float(np.median(cs.high - cs.low)) < 0.06  # and it still narrows: after 500 values, within ±3 points


def test_calibration_from_counts_gives_the_prediction_powered_estimate_of_the_verdicts() -> None:
    """The store hands over the judge's unlabeled verdicts as (passed, n): the same estimate as from the verdicts."""
    rng = np.random.default_rng(10)
    unlabeled = (rng.random(500) < 0.8).tolist()
    pairs = [(bool(j), bool(h)) for j, h in zip(rng.random(60) < 0.8, rng.random(60) < 0.7, strict=True)]
    from_counts = calibrate("p", "e", "n", pairs, (sum(unlabeled), len(unlabeled))).ppi
    from_verdicts = ppi_mean([float(v) for v in unlabeled], [float(j) for j, _ in pairs], [float(h) for _, h in pairs])
    assert from_counts is not None and from_verdicts is not None
    assert (from_counts.estimate, from_counts.low, from_counts.high) == pytest.approx(
        (from_verdicts.estimate, from_verdicts.low, from_verdicts.high), abs=1e-12
    )


def test_the_anytime_difference_holds_at_every_look() -> None:
    """In an anytime window, `regressed` takes the window's sequence at alpha/2 minus the baseline's Wilson interval
    at alpha/2: over 10,000 windows of 300 scores looked at after each, against baselines of 2,000, the difference
    leaves the interval at some look in at most 5% of windows; `compare` builds that interval."""
    rng = np.random.default_rng(11)
    p_now, p_base, steps, base_n = 0.85, 0.9, 300, 2000
    base = rng.binomial(base_n, p_base, WINDOWS)
    halves = [wilson_interval(int(k), base_n, 0.975) for k in base]
    base_low = np.array([h[0] for h in halves])
    base_high = np.array([h[1] for h in halves])
    cs = BoundedMeanSequence(0.025, xp=np)
    ever_out = np.zeros(WINDOWS, bool)
    for _ in range(steps):
        cs.add((rng.random(WINDOWS) < p_now).astype(float))
        ever_out |= (cs.low - base_high > p_now - p_base) | (cs.high - base_low < p_now - p_base)
    assert ever_out.mean() <= 0.05, ever_out.mean()
    found = compare(
        Sample(pass_n=steps, passed=255), Sample(pass_n=base_n, passed=int(base[0])),
        current_interval=(float(cs.low[0]), float(cs.high[0])), method="eb-cs",
    )  # fmt: skip
    assert found is not None and found.method == "eb-cs-wilson"
    assert (found.low, found.high) == pytest.approx((cs.low[0] - base_high[0], cs.high[0] - base_low[0]))
