"""The run statistics against scipy, statsmodels and numpy where they define the same thing, and by hand or by brute
force where they do not (pass@k, pass^k)."""

from __future__ import annotations

import json
import math
import random
from fractions import Fraction
from itertools import combinations
from typing import Any

import numpy as np
import pytest

from evalsi.run_harness.stats import (
    EXACT_BELOW,
    Observation,
    aggregate,
    bootstrap_mean_interval,
    mcnemar,
    mcnemar_chi2,
    mcnemar_exact,
    mean_pass_at_k,
    mean_pass_hat_k,
    paired_bootstrap,
    pass_at_k,
    pass_hat_k,
    quantile,
    resampled_means,
    variance_across_trials,
    wilson,
)


# the references load when a test asks them (scipy and statsmodels take ~2 s to import, in every xdist worker)
def sm_mcnemar(*args: Any, **kwargs: Any) -> Any:
    from statsmodels.stats.contingency_tables import mcnemar

    return mcnemar(*args, **kwargs)


def proportion_confint(*args: Any, **kwargs: Any) -> Any:
    from statsmodels.stats.proportion import proportion_confint as confint

    return confint(*args, **kwargs)


class _Scipy:
    def __getattr__(self, name: str) -> Any:
        from scipy import stats

        return getattr(stats, name)


scipy_stats = _Scipy()

# --- references ---------------------------------------------------------------------------------------------------


def numpy_bootstrap_means(values: list[float], seed: int, resamples: int) -> np.ndarray:
    """The resampling of `resampled_means`, written with numpy: the same random() stream, index ⌊u·n⌋."""
    rng = random.Random(seed)
    n = len(values)
    u = np.array([rng.random() for _ in range(resamples * n)]).reshape(resamples, n)
    idx = np.floor(u * n).astype(np.int64)
    return np.asarray(values, dtype=float)[idx].mean(axis=1)


def numpy_percentile_interval(means: np.ndarray, confidence: float) -> tuple[float, float]:
    alpha = 1 - confidence
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(low), float(high)


# --- Wilson and quantiles -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("confidence", [0.8, 0.9, 0.95, 0.99])
def test_wilson_matches_statsmodels(confidence: float) -> None:
    for n in (1, 2, 3, 5, 10, 37, 100, 1000):
        for k in sorted({0, 1, n // 3, n // 2, n - 1, n}):
            want = proportion_confint(k, n, alpha=1 - confidence, method="wilson")
            assert wilson(k, n, confidence) == pytest.approx(want, abs=1e-9, rel=0), (k, n)
    assert wilson(0, 0) is None


def test_quantile_matches_numpy_default() -> None:
    rng = random.Random(7)
    for n in (1, 2, 3, 4, 10, 997):
        values = [rng.gauss(10, 3) for _ in range(n)]
        for q in (0, 0.01, 0.05, 0.25, 0.5, 0.9, 0.95, 0.99, 1):
            assert quantile(values, q) == pytest.approx(float(np.quantile(values, q)), abs=1e-9, rel=0), (n, q)
    assert quantile([3, 1, 2], 0.5) == 2
    with pytest.raises(ValueError):
        quantile([], 0.5)
    with pytest.raises(ValueError):
        quantile([1.0], 95)


# --- McNemar ------------------------------------------------------------------------------------------------------

DISCORDANT = [(b, c) for b in range(31) for c in range(31)] + [(300, 250), (120, 80), (1000, 1001), (5, 60), (0, 200)]


def test_mcnemar_exact_matches_statsmodels_and_scipy_binomtest() -> None:
    for b, c in DISCORDANT:
        want = sm_mcnemar([[10, b], [c, 7]], exact=True).pvalue
        assert mcnemar_exact(b, c) == pytest.approx(want, abs=1e-9, rel=0), (b, c)
        if b + c:
            binomtest = scipy_stats.binomtest(min(b, c), b + c, 0.5, alternative="two-sided").pvalue
            assert mcnemar_exact(b, c) == pytest.approx(binomtest, abs=1e-9, rel=0), (b, c)
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(4, 4) == 1.0
    assert mcnemar_exact(0, 5) == 2 / 32  # 2 · P[X = 0], X ~ Binomial(5, 1/2)


def test_mcnemar_chi2_matches_statsmodels() -> None:
    for b, c in DISCORDANT:
        if b + c == 0:
            continue
        want = sm_mcnemar([[10, b], [c, 7]], exact=False, correction=True).pvalue
        assert mcnemar_chi2(b, c) == pytest.approx(want, abs=1e-9, rel=0), (b, c)
        assert mcnemar_chi2(b, c) == pytest.approx(scipy_stats.chi2.sf((abs(b - c) - 1) ** 2 / (b + c), 1), abs=1e-9)
    assert mcnemar_chi2(0, 0) == 1.0


def test_mcnemar_picks_exact_below_25_discordant_pairs() -> None:
    assert EXACT_BELOW == 25
    for b, c in DISCORDANT:
        expected = mcnemar_exact(b, c) if b + c < 25 else mcnemar_chi2(b, c)
        assert mcnemar(b, c) == expected
    assert mcnemar(12, 12) == mcnemar_exact(12, 12)  # 24 pairs: exact
    assert mcnemar(12, 13) == mcnemar_chi2(12, 13)  # 25 pairs: chi-square
    with pytest.raises(ValueError):
        mcnemar(-1, 3)


# --- bootstrap ----------------------------------------------------------------------------------------------------


def test_bootstrap_is_deterministic_for_a_seed() -> None:
    rng = random.Random(1)
    values = [rng.random() for _ in range(50)]
    first = bootstrap_mean_interval(values, seed=11, resamples=2000)
    assert bootstrap_mean_interval(values, seed=11, resamples=2000) == first
    assert bootstrap_mean_interval(values, seed=12, resamples=2000) != first
    assert bootstrap_mean_interval([4.0], seed=1, resamples=100) == (4.0, 4.0)
    with pytest.raises(ValueError):
        bootstrap_mean_interval([], seed=1)


@pytest.mark.parametrize(("n", "seed", "confidence"), [(1, 0, 0.95), (2, 1, 0.95), (37, 2, 0.9), (200, 3, 0.99)])
def test_bootstrap_matches_a_numpy_implementation_of_the_same_draws(n: int, seed: int, confidence: float) -> None:
    rng = random.Random(100 + n)
    values = [rng.expovariate(1.0) for _ in range(n)]
    ours = resampled_means(values, seed=seed, resamples=10_000)
    reference = numpy_bootstrap_means(values, seed, 10_000)
    assert np.allclose(ours, reference, rtol=0, atol=1e-12)
    low, high = bootstrap_mean_interval(values, seed=seed, confidence=confidence)
    assert (low, high) == pytest.approx(numpy_percentile_interval(reference, confidence), abs=1e-9, rel=0)


def test_bootstrap_is_close_to_scipy_percentile_bootstrap_on_a_large_sample() -> None:
    rng = random.Random(5)
    values = [rng.gauss(0, 1) for _ in range(1000)]
    low, high = bootstrap_mean_interval(values, seed=9)
    want = scipy_stats.bootstrap(
        (np.asarray(values),), np.mean, method="percentile", n_resamples=10_000, rng=np.random.default_rng(9)
    ).confidence_interval
    assert abs(low - want.low) < 0.01
    assert abs(high - want.high) < 0.01
    assert high - low == pytest.approx(2 * 1.96 * float(np.std(values)) / math.sqrt(1000), rel=0.1)


def test_paired_bootstrap_matches_a_numpy_implementation() -> None:
    rng = random.Random(21)
    diffs = [rng.gauss(0.05, 0.5) for _ in range(120)]
    mean_diff, low, high, p_value = paired_bootstrap(diffs, seed=4)
    means = numpy_bootstrap_means(diffs, 4, 10_000)
    assert mean_diff == pytest.approx(float(np.mean(diffs)), abs=1e-12)
    assert (low, high) == pytest.approx(numpy_percentile_interval(means, 0.95), abs=1e-9, rel=0)
    want_p = min(1.0, 2 * min(float(np.mean(means <= 0)), float(np.mean(means >= 0))))
    assert p_value == want_p
    assert 0 < p_value < 1
    assert paired_bootstrap(diffs, seed=4) == (mean_diff, low, high, p_value)


def test_paired_bootstrap_edge_cases() -> None:
    assert paired_bootstrap([0.0] * 10, seed=1, resamples=500) == (0.0, 0.0, 0.0, 1.0)
    mean_diff, low, high, p_value = paired_bootstrap([1.0, 2.0, 0.5, 1.5] * 10, seed=1, resamples=500)
    assert (mean_diff, p_value) == (1.25, 0.0)
    assert 0 < low < mean_diff < high


# --- pass@k and pass^k --------------------------------------------------------------------------------------------

HAND = [(3, 3), (3, 2), (3, 0), (3, 1)]  # (n, c): 4 tasks, 3 trials each


def test_pass_at_k_and_pass_hat_k_by_hand() -> None:
    # pass@k = 1 - C(n-c, k)/C(n, k) per task, then the mean over the 4 tasks
    # k=1: c/n = 1, 2/3, 0, 1/3                              -> 2/4 = 1/2
    # k=2: 1 - C(0,2)/3, 1 - C(1,2)/3, 1 - C(3,2)/3, 1 - C(2,2)/3 = 1, 1, 0, 2/3  -> (8/3)/4 = 2/3
    # k=3: 1 - C(n-c,3)/1 = 1, 1, 0, 1                        -> 3/4
    assert mean_pass_at_k(HAND, 1) == float(Fraction(1, 2))
    assert mean_pass_at_k(HAND, 2) == float(Fraction(2, 3))
    assert mean_pass_at_k(HAND, 3) == float(Fraction(3, 4))
    # pass^k = C(c, k)/C(n, k)
    # k=1: c/n                                                -> 1/2
    # k=2: C(3,2)/3, C(2,2)/3, C(0,2)/3, C(1,2)/3 = 1, 1/3, 0, 0 -> (4/3)/4 = 1/3
    # k=3: C(c,3)/1 = 1, 0, 0, 0                              -> 1/4
    assert mean_pass_hat_k(HAND, 1) == float(Fraction(1, 2))
    assert mean_pass_hat_k(HAND, 2) == float(Fraction(1, 3))
    assert mean_pass_hat_k(HAND, 3) == float(Fraction(1, 4))
    assert pass_at_k(3, 1, 2) == float(Fraction(2, 3))
    assert pass_hat_k(3, 2, 2) == float(Fraction(1, 3))


def test_pass_at_k_and_pass_hat_k_match_enumeration_of_all_k_subsets() -> None:
    rng = random.Random(2024)
    for _ in range(300):
        n = rng.randint(1, 8)
        c = rng.randint(0, n)
        k = rng.randint(1, n)
        trials = [True] * c + [False] * (n - c)
        subsets = list(combinations(trials, k))
        any_pass = Fraction(sum(any(s) for s in subsets), len(subsets))
        all_pass = Fraction(sum(all(s) for s in subsets), len(subsets))
        assert pass_at_k(n, c, k) == float(any_pass), (n, c, k)
        assert pass_hat_k(n, c, k) == float(all_pass), (n, c, k)


def test_mean_pass_at_k_leaves_out_tasks_with_fewer_than_k_trials() -> None:
    per_task = [(3, 1), (1, 1), (2, 0)]
    assert mean_pass_at_k(per_task, 1) == float((Fraction(1, 3) + 1 + 0) / 3)
    assert mean_pass_at_k(per_task, 2) == float((Fraction(2, 3) + 0) / 2)
    assert mean_pass_at_k(per_task, 3) == float(Fraction(1, 1))
    assert mean_pass_hat_k(per_task, 3) == 0.0
    assert mean_pass_at_k(per_task, 4) is None
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_hat_k(3, 1, 4)


# --- variance across trials ---------------------------------------------------------------------------------------


def test_variance_across_trials_is_the_mean_per_task_sample_variance() -> None:
    rng = random.Random(8)
    per_task = [[rng.random() for _ in range(rng.randint(1, 6))] for _ in range(40)]
    kept = [v for v in per_task if len(v) >= 2]
    want = float(np.mean([np.var(v, ddof=1) for v in kept]))
    assert variance_across_trials(per_task) == pytest.approx(want, abs=1e-12, rel=0)
    assert variance_across_trials([[1.0], [2.0]]) is None
    assert variance_across_trials([[1.0, 1.0, 1.0]]) == 0.0


# --- aggregate ----------------------------------------------------------------------------------------------------


def hand_observations() -> list[Observation]:
    out = []
    for t, (n, c) in enumerate(HAND):
        out.extend(Observation(f"task-{t}", trial, None, trial < c, "scored") for trial in range(n))
    return out


def test_aggregate_pass_fail() -> None:
    observations = [
        *hand_observations(),
        Observation("task-4", 0, None, None, "error"),
        Observation("task-4", 1, None, True, "scored"),
        Observation("task-5", 0, None, None, "skipped"),
    ]
    s = aggregate("correct", observations)
    assert (s.kind, s.n, s.errors, s.skipped, s.interval) == ("pass_fail", 13, 1, 1, "wilson")
    assert s.mean == 7 / 13
    assert (s.low, s.high) == pytest.approx(proportion_confint(7, 13, method="wilson"), abs=1e-9, rel=0)
    # task-4 has one scored trial: in k=1 only
    assert s.pass_at_k == {1: float((Fraction(2) + 1) / 5), 2: 2 / 3, 3: 0.75}
    assert s.pass_hat_k == {1: float((Fraction(2) + 1) / 5), 2: 1 / 3, 3: 0.25}
    # per task 0/1 variances c(n-c)/(n(n-1)): 0, 1/3, 0, 1/3
    assert s.variance_across_trials == pytest.approx(1 / 6, abs=1e-12)
    assert (s.p50, s.p95, s.seed) == (None, None, None)
    assert aggregate("correct", observations, trials=4).pass_at_k[4] is None
    assert json.loads(json.dumps(s.to_dict()))["pass_at_k"] == {"1": 0.6, "2": 2 / 3, "3": 0.75}


def test_aggregate_numeric_and_order_independence() -> None:
    rng = random.Random(3)
    observations = [
        Observation(f"t{t}", trial, rng.random(), rng.random() < 0.5 if trial else None, "scored")
        for t in range(30)
        for trial in range(3)
    ]
    observations += [Observation("t99", 0, math.nan, None, "scored"), Observation("t99", 1, None, None, "error")]
    s = aggregate("similarity", observations, seed=17, resamples=2000)
    scored = sorted((o for o in observations if o.value is not None and math.isfinite(o.value)), key=lambda o: o[:2])
    values = [o.value for o in scored]
    assert (s.kind, s.n, s.no_value, s.errors, s.skipped) == ("numeric", 90, 1, 1, 0)
    assert s.mean == pytest.approx(float(np.mean(values)), abs=1e-12)
    assert (s.low, s.high) == bootstrap_mean_interval(values, seed=17, resamples=2000)  # type: ignore[arg-type]
    assert (s.seed, s.resamples, s.interval) == (17, 2000, "bootstrap_percentile")
    assert s.p50 == pytest.approx(float(np.quantile(values, 0.5)), abs=1e-9)
    assert s.p95 == pytest.approx(float(np.quantile(values, 0.95)), abs=1e-9)
    per_task = [[o.value for o in scored if o.task_id == f"t{t}"] for t in range(30)]
    assert s.variance_across_trials == pytest.approx(float(np.mean([np.var(v, ddof=1) for v in per_task])), abs=1e-12)
    assert s.pass_at_k == {} and s.pass_hat_k == {}
    shuffled = list(observations)
    random.Random(1).shuffle(shuffled)
    assert aggregate("similarity", shuffled, seed=17, resamples=2000) == s
    json.dumps(s.to_dict())


def test_aggregate_without_scores_and_with_duplicates() -> None:
    s = aggregate("x", [("a", 0, None, None, "error"), ("a", 1, None, None, "skipped")])
    assert (s.kind, s.n, s.mean, s.low, s.high, s.errors, s.skipped) == ("pass_fail", 0, None, None, None, 1, 1)
    assert s.pass_at_k == {}
    labels = aggregate("label_only", [("a", 0, None, None, "scored")])
    assert (labels.kind, labels.n, labels.mean, labels.no_value) == ("numeric", 0, None, 1)
    with pytest.raises(ValueError, match="two observations"):
        aggregate("x", [("a", 0, 1.0, None, "scored"), ("a", 0, 2.0, None, "scored")])
    with pytest.raises(ValueError, match="outcome"):
        aggregate("x", [("a", 0, 1.0, None, "done")])
