"""Confidence intervals and percentiles for window aggregates: Wilson for pass rates, and for means an interval
within the values' bounds (`mean_interval`: Wilson, Student t clamped to [0, 1], log-scale t, or plain t).

Pure Python (no scipy): the t quantile solves the exact Student t distribution for integer degrees of freedom
(Abramowitz & Stegun 26.7.3/26.7.4) by safeguarded Newton steps, and uses the Cornish-Fisher expansion in 1/df
(26.7.5, error below 1e-13) past 1,000 degrees of freedom. Both agree with scipy to better than 1e-12.
"""

from __future__ import annotations

import math
from functools import lru_cache
from statistics import NormalDist

__all__ = [
    "log_interval", "mean_interval", "percentile", "t_interval", "t_quantile", "wilson_interval",
    "z_quantile",
]  # fmt: skip

_EXPANSION_FROM = 1000


def z_quantile(p: float) -> float:
    """The standard normal quantile (inverse CDF)."""
    return NormalDist().inv_cdf(p)


def _two_sided(t: float, df: int) -> float:
    """A(t|df) = P(|T| < t) for t >= 0, exactly, by the finite series for integer df."""
    theta = math.atan(t / math.sqrt(df))
    sin, cos = math.sin(theta), math.cos(theta)
    c2 = cos * cos
    if df % 2:  # odd: (2/pi) [theta + sin cos (1 + 2/3 c2 + 2*4/(3*5) c2^2 + ... up to c2^((df-3)/2))]
        if df == 1:
            return 2 * theta / math.pi
        term = total = 1.0
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        return 2 / math.pi * (theta + sin * cos * total)
    # even: sin (1 + 1/2 c2 + 1*3/(2*4) c2^2 + ... up to c2^((df-2)/2))
    term = total = 1.0
    for k in range(1, df // 2):
        term *= c2 * (2 * k - 1) / (2 * k)
        total += term
    return sin * total


def _log_density_constant(df: int) -> float:
    return math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)


def _expansion(z: float, df: int) -> float:
    """Cornish-Fisher expansion of the t quantile in powers of 1/df (A&S 26.7.5)."""
    z2 = z * z
    g1 = (z2 + 1) * z / 4
    g2 = ((5 * z2 + 16) * z2 + 3) * z / 96
    g3 = (((3 * z2 + 19) * z2 + 17) * z2 - 15) * z / 384
    g4 = ((((79 * z2 + 776) * z2 + 1482) * z2 - 1920) * z2 - 945) * z / 92160
    g5 = (((((27 * z2 + 339) * z2 + 930) * z2 - 1782) * z2 - 765) * z2 + 17955) * z / 368640
    v = float(df)
    return z + (g1 + (g2 + (g3 + (g4 + g5 / v) / v) / v) / v) / v


@lru_cache(maxsize=4096)
def t_quantile(p: float, df: int) -> float:
    """The Student t quantile (inverse CDF) at probability `p` for `df` >= 1 integer degrees of freedom."""
    if not 0 < p < 1:
        raise ValueError(f"probability must be in (0, 1), not {p}")
    if df < 1 or int(df) != df:
        raise ValueError(f"degrees of freedom must be a positive integer, not {df}")
    df = int(df)
    if p < 0.5:
        return -t_quantile(1 - p, df)
    if p == 0.5:
        return 0.0
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    if df > _EXPANSION_FROM:
        return _expansion(z_quantile(p), df)
    target = 2 * p - 1
    log_c = _log_density_constant(df)
    # bracket [lo, hi] with A(lo) < target <= A(hi); Newton steps that leave it fall back to bisection
    lo, hi = 0.0, max(1.0, _expansion(z_quantile(p), df))
    while _two_sided(hi, df) < target:
        lo, hi = hi, hi * 2
    t = min(max(_expansion(z_quantile(p), df), lo), hi)
    for _ in range(200):
        f = _two_sided(t, df) - target
        if f < 0:
            lo = t
        else:
            hi = t
        density = math.exp(log_c - (df + 1) / 2 * math.log1p(t * t / df))
        step = f / (2 * density)
        nxt = t - step
        if not lo < nxt < hi:
            nxt = (lo + hi) / 2
        if abs(nxt - t) <= 1e-15 * max(1.0, abs(t)) or hi - lo <= 1e-15 * max(1.0, hi):
            return nxt
        t = nxt
    return t


def t_interval(mean: float, sd: float, n: int, confidence: float = 0.95) -> tuple[float, float] | None:
    """Mean ± t(1 - (1 - confidence)/2, n - 1) · sd / √n, the interval for a mean; None below two observations."""
    if n < 2:
        return None
    half = t_quantile(1 - (1 - confidence) / 2, n - 1) * sd / math.sqrt(n)
    return mean - half, mean + half


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float] | None:
    """The Wilson score interval for a proportion (no continuity correction); None without observations."""
    if n <= 0:
        return None
    z = z_quantile(1 - (1 - confidence) / 2)
    p = successes / n
    z2n = z * z / n
    denominator = 1 + z2n
    center = (p + z2n / 2) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z2n / (4 * n)) / denominator
    return max(0.0, center - half), min(1.0, center + half)


def log_interval(mean: float, sd: float, n: int, confidence: float = 0.95) -> tuple[float, float] | None:
    """For a mean of non-negative values (durations, tokens, cost): the t interval on the log scale (delta method),
    mean * or / exp(t · sd / (mean · √n)). It stays above 0, contains the mean, and is wider above it than below, as a
    skewed quantity's is; for large n it tends to the t interval. None below two observations; (0, 0) when every
    value is 0."""
    if n < 2:
        return None
    if mean <= 0:
        return 0.0, 0.0
    half = t_quantile(1 - (1 - confidence) / 2, n - 1) * sd / (mean * math.sqrt(n))
    half = min(half, 700.0)  # exp() past it overflows; the bounds are 0 and inf by then anyway
    return mean * math.exp(-half), mean * math.exp(half)


INTERVAL_METHODS = ("wilson", "t[0,1]", "log-t", "t")
"""What `mean_interval` may use, as the stats output names it."""


def mean_interval(
    n: int,
    mean: float,
    sd: float,
    *,
    minimum: float | None,
    maximum: float | None,
    binary: int = 0,
    confidence: float = 0.95,
) -> tuple[tuple[float, float] | None, str]:
    """The interval of a mean within what the values can be, and its method's name:

    - `wilson`: every value is 0 or 1 (`binary` of the `n`): a proportion, the Wilson interval of its count of 1s;
    - `t[0,1]`: every value lies in [0, 1] (a rate, an F1, a judge's score): Student t, clamped to [0, 1];
    - `log-t`: every value is >= 0 and some above 1 (durations, tokens, cost): `log_interval`, above 0;
    - `t`: some value is negative: Student t, unbounded.
    """
    if minimum is not None and minimum >= 0:
        if maximum is not None and maximum <= 1:
            if binary >= n > 0:
                return wilson_interval(round(mean * n), n, confidence), "wilson"
            found = t_interval(mean, sd, n, confidence)
            return (None if found is None else (max(0.0, found[0]), min(1.0, found[1]))), "t[0,1]"
        return log_interval(mean, sd, n, confidence), "log-t"
    return t_interval(mean, sd, n, confidence), "t"


def percentile(ordered: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) of sorted values by linear interpolation (numpy's default); None if empty."""
    if not ordered:
        return None
    h = (len(ordered) - 1) * q / 100
    i = math.floor(h)
    if i + 1 >= len(ordered):
        return ordered[-1]
    return ordered[i] + (h - i) * (ordered[i + 1] - ordered[i])
