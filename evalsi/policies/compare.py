"""Intervals of a difference between two windows (the current one and a baseline): Newcombe's hybrid score interval
for two rates, Welch's t interval for two means, and the regression test the `regressed(...)` alert reads.

Pure Python, like `intervals.py`: Welch's degrees of freedom are not integers, so the t quantile for real df solves
the regularized incomplete beta function (continued fraction, Numerical Recipes 6.4) by safeguarded Newton steps.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from evalsi.policies.intervals import t_interval, t_quantile, wilson_interval, z_quantile

__all__ = [
    "Comparison", "Sample", "compare", "newcombe_interval", "t_quantile_real", "welch_interval",
]  # fmt: skip


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1, a - 1
    c, d = 1.0, 1 - qab * x / qap
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1 + aa * d
        d = 1 / (d if abs(d) > tiny else tiny)
        c = 1 + aa / c if abs(1 + aa / c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1 + aa * d
        d = 1 / (d if abs(d) > tiny else tiny)
        c = 1 + aa / c if abs(1 + aa / c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1 - front * _betacf(b, a, 1 - x) / b


def t_quantile_real(p: float, df: float) -> float:
    """The Student t quantile for real `df` > 0 (Welch's df); integer df go to `intervals.t_quantile`."""
    if not 0 < p < 1:
        raise ValueError(f"probability must be in (0, 1), not {p}")
    if not df > 0:
        raise ValueError(f"degrees of freedom must be above 0, not {df}")
    if df == int(df) and df <= 1e9:
        return t_quantile(p, int(df))
    if df > 1e7:
        return z_quantile(p)
    if p < 0.5:
        return -t_quantile_real(1 - p, df)
    if p == 0.5:
        return 0.0
    tail = 2 * (1 - p)  # P(|T| > t) = I_{df/(df+t^2)}(df/2, 1/2), decreasing in t
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    lo, hi = 0.0, 1.0
    while _betainc(df / 2, 0.5, df / (df + hi * hi)) > tail:
        lo, hi = hi, hi * 2
    t = (lo + hi) / 2
    for _ in range(100):  # Newton steps on the tail, bisection when one leaves the bracket
        f = _betainc(df / 2, 0.5, df / (df + t * t)) - tail
        if f > 0:
            lo = t
        else:
            hi = t
        density = math.exp(log_c - (df + 1) / 2 * math.log1p(t * t / df))
        nxt = t + f / (2 * density)
        if not lo < nxt < hi:
            nxt = (lo + hi) / 2
        if abs(nxt - t) <= 1e-14 * max(1.0, t):
            return nxt
        t = nxt
    return t


def newcombe_interval(x1: int, n1: int, x2: int, n2: int, confidence: float = 0.95) -> tuple[float, float] | None:
    """Newcombe's hybrid score interval (1998, method 10) for p1 - p2, from the two Wilson intervals:
    `d - sqrt((p1-l1)^2 + (u2-p2)^2) .. d + sqrt((u1-p1)^2 + (p2-l2)^2)`. None when a side has no observation."""
    w1, w2 = wilson_interval(x1, n1, confidence), wilson_interval(x2, n2, confidence)
    if w1 is None or w2 is None:
        return None
    p1, p2 = x1 / n1, x2 / n2
    d = p1 - p2
    low = d - math.sqrt((p1 - w1[0]) ** 2 + (w2[1] - p2) ** 2)
    high = d + math.sqrt((w1[1] - p1) ** 2 + (p2 - w2[0]) ** 2)
    return max(-1.0, low), min(1.0, high)


def welch_interval(
    mean1: float, sd1: float, n1: int, mean2: float, sd2: float, n2: int, confidence: float = 0.95
) -> tuple[float, float, float] | None:
    """Welch's t interval for mean1 - mean2 (unequal variances): `d ± t(df) · se`, with the Welch-Satterthwaite df.
    Returns (low, high, df); None below two observations on a side. With no variance on either side the interval is
    the difference itself (df: inf)."""
    if n1 < 2 or n2 < 2:
        return None
    v1, v2 = sd1 * sd1 / n1, sd2 * sd2 / n2
    d = mean1 - mean2
    se2 = v1 + v2
    if se2 <= 0:
        return d, d, math.inf
    df = se2 * se2 / (v1 * v1 / (n1 - 1) + v2 * v2 / (n2 - 1))
    half = t_quantile_real(1 - (1 - confidence) / 2, df) * math.sqrt(se2)
    return d - half, d + half, df


@dataclass(slots=True)
class Sample:
    """What a window (or a baseline period) knows of one score series: the values' count, mean and sample sd, how
    many are 0 or 1 and their range, and the verdicts' count and passes."""

    value_n: int = 0
    value_mean: float = 0.0
    value_sd: float = 0.0
    value_binary: int = 0
    value_min: float | None = None
    value_max: float | None = None
    pass_n: int = 0
    passed: int = 0

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Sample:
        """From a `score_window_stats` store row."""
        value_n = int(row.get("value_n") or 0)
        return cls(
            value_n=value_n, value_mean=float(row.get("value_mean") or 0.0) if value_n else 0.0,
            value_sd=float(row.get("value_sd") or 0.0) if value_n > 1 else 0.0,
            value_binary=int(row.get("value_binary") or 0), value_min=row.get("value_min"),
            value_max=row.get("value_max"), pass_n=int(row.get("pass_n") or 0), passed=int(row.get("passed") or 0),
        )  # fmt: skip

    @property
    def numeric(self) -> bool:
        return self.value_n > 0

    @property
    def proportion(self) -> tuple[int, int]:
        """(successes, n) when this sample is a proportion: verdicts, or values that are all 0 or 1."""
        if self.value_n:
            return round(self.value_mean * self.value_n), self.value_n
        return self.passed, self.pass_n

    @property
    def mean(self) -> float | None:
        if self.value_n:
            return self.value_mean
        return self.passed / self.pass_n if self.pass_n else None

    @property
    def n(self) -> int:
        return self.value_n or self.pass_n


@dataclass(slots=True)
class Comparison:
    """The current window against a baseline: the difference (current - baseline) with its interval, the test that
    gave it (`newcombe` for rates, `welch` for means), and whether it shows a regression beyond `margin`."""

    current_mean: float
    baseline_mean: float
    current_n: int
    baseline_n: int
    difference: float
    low: float
    high: float
    method: str
    margin: float
    worse: str
    """`lower` (a drop is a regression: pass rates, faithfulness) or `higher` (a rise is: latency, cost)."""
    confidence: float
    regressed: bool
    """The whole interval lies beyond the margin on the worse side: `high < -margin` (lower is worse) or
    `low > margin` (higher is worse)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare(
    current: Sample,
    baseline: Sample,
    *,
    margin: float = 0.0,
    worse: str = "lower",
    confidence: float = 0.95,
    current_interval: tuple[float, float] | None = None,
    method: str | None = None,
) -> Comparison | None:
    """Compare two samples of one score; None when either side is too small for an interval.

    Rates (verdicts, or values all 0 or 1 on both sides) use Newcombe's interval, other values Welch's. With
    `current_interval` (an anytime-valid interval of the current mean at level 1 - alpha/2, named by `method`), the
    difference's interval is that interval minus the baseline's own (level 1 - alpha/2): a union bound, valid at
    level 1 - alpha however often it is looked at.
    """
    if worse not in ("lower", "higher"):
        raise ValueError(f"worse: {worse!r} is neither 'lower' nor 'higher'")
    rates = (not current.numeric or current.value_binary >= current.value_n) and (
        not baseline.numeric or baseline.value_binary >= baseline.value_n
    )
    c_mean, b_mean = current.mean, baseline.mean
    if c_mean is None or b_mean is None:
        return None
    if current_interval is not None:
        half = 1 - (1 - confidence) / 2
        if rates:
            b = wilson_interval(*baseline.proportion, half)
        else:
            b = t_interval(baseline.value_mean, baseline.value_sd, baseline.value_n, half)
        if b is None:
            return None
        low, high = current_interval[0] - b[1], current_interval[1] - b[0]
        test = f"{method or 'anytime'}-{'wilson' if rates else 't'}"
    elif rates:
        found2 = newcombe_interval(*current.proportion, *baseline.proportion, confidence)
        if found2 is None:
            return None
        (low, high), test = found2, "newcombe"
    else:
        found3 = welch_interval(
            current.value_mean, current.value_sd, current.value_n, baseline.value_mean, baseline.value_sd,
            baseline.value_n, confidence,
        )  # fmt: skip
        if found3 is None:
            return None
        low, high, _ = found3
        test = "welch"
    regressed = high < -margin if worse == "lower" else low > margin
    return Comparison(
        current_mean=c_mean, baseline_mean=b_mean, current_n=current.n, baseline_n=baseline.n,
        difference=c_mean - b_mean, low=low, high=high, method=test, margin=margin, worse=worse,
        confidence=confidence, regressed=regressed,
    )  # fmt: skip
