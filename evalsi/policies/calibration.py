"""How far a judge agrees with people, from the traces both scored: the confusion matrix, Cohen's kappa with its
interval, the judge's sensitivity and specificity against people (Wilson intervals), and the prediction-powered
estimate of the true pass rate that combines many judge verdicts with few human ones (Angelopoulos et al. 2023).

A failing verdict is the positive class: sensitivity is the share of traces people failed that the judge failed too,
specificity the share people passed that the judge passed too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from evalsi.model.score import Score
from evalsi.policies.feedback import NEGATIVE_BELOW, verdict
from evalsi.policies.intervals import wilson_interval, z_quantile

__all__ = [
    "Agreement", "Calibration", "Kappa", "PredictionPowered", "calibrate", "cohen_kappa", "judge_calibrations",
    "ppi_mean",
]  # fmt: skip


@dataclass(slots=True)
class Kappa:
    kappa: float
    se: float
    """Large-sample standard error (Fleiss, Cohen & Everitt 1969), as statsmodels' `cohens_kappa` `std_kappa`."""
    low: float
    high: float


def cohen_kappa(table: Sequence[Sequence[float]], confidence: float = 0.95) -> Kappa | None:
    """Cohen's kappa of a k x k table of counts (rows: one rater, columns: the other) with its normal interval;
    None with no observation, or when both raters always say the same one thing (chance agreement 1)."""
    k = len(table)
    n = sum(sum(row) for row in table)
    if n <= 0:
        return None
    p = [[c / n for c in row] for row in table]
    rows = [sum(p[i]) for i in range(k)]
    cols = [sum(p[i][j] for i in range(k)) for j in range(k)]
    observed = sum(p[i][i] for i in range(k))
    expected = sum(rows[i] * cols[i] for i in range(k))
    if expected >= 1:
        return None
    kappa = (observed - expected) / (1 - expected)
    a = sum(p[i][i] * (1 - (rows[i] + cols[i]) * (1 - kappa)) ** 2 for i in range(k))
    b = (1 - kappa) ** 2 * sum(p[i][j] * (cols[i] + rows[j]) ** 2 for i in range(k) for j in range(k) if i != j)
    c = (kappa - expected * (1 - kappa)) ** 2
    variance = max(0.0, (a + b - c) / (1 - expected) ** 2 / n)
    se = math.sqrt(variance)
    z = z_quantile(1 - (1 - confidence) / 2)
    return Kappa(kappa, se, kappa - z * se, kappa + z * se)


@dataclass(slots=True)
class PredictionPowered:
    """The prediction-powered estimate of a mean and its interval: `judge_mean - rectifier ± z·sqrt(var_f/N +
    var_r/n)`, beside the classical estimate from the human labels alone."""

    estimate: float
    low: float
    high: float
    judge_mean: float
    rectifier: float
    """The judge's mean error on the labeled traces (judge - human): what the estimate corrects."""
    labeled: int
    unlabeled: int
    classical: float
    classical_low: float
    classical_high: float


def _mean_var(xs: Sequence[float]) -> tuple[float, float]:
    n = len(xs)
    mean = sum(xs) / n
    return mean, (sum((x - mean) ** 2 for x in xs) / (n - 1) if n > 1 else 0.0)


def ppi_mean(
    judge_unlabeled: Sequence[float],
    judge_labeled: Sequence[float],
    human_labeled: Sequence[float],
    confidence: float = 0.95,
) -> PredictionPowered | None:
    """Prediction-powered inference for a mean (Angelopoulos, Bates, Fannjiang, Jordan & Zrnic, "Prediction-powered
    inference", Science 382, 2023; the mean estimate of its Section 2 / Algorithm 1):

        theta_PP = mean(f(X~)) - mean(f(X) - Y),
        theta_PP ± z_{1-alpha/2} · sqrt(var(f(X~)) / N + var(f(X) - Y) / n),

    with f the judge's verdict (1 pass, 0 fail) on N traces people did not label and n traces they did (Y, their
    verdict). Valid when the labeled traces are a uniform sample of the same traffic; needs n >= 2 and N >= 2."""
    if len(judge_labeled) != len(human_labeled):
        raise ValueError("judge_labeled and human_labeled must pair up")
    if len(judge_unlabeled) < 2:
        return None
    f_mean, f_var = _mean_var(judge_unlabeled)
    return _ppi(f_mean, f_var, len(judge_unlabeled), judge_labeled, human_labeled, confidence)


def _ppi(
    f_mean: float,
    f_var: float,
    big_n: int,
    judge_labeled: Sequence[float],
    human_labeled: Sequence[float],
    confidence: float,
) -> PredictionPowered | None:
    n = len(judge_labeled)
    if n < 2 or big_n < 2:
        return None
    r_mean, r_var = _mean_var([f - y for f, y in zip(judge_labeled, human_labeled, strict=True)])
    y_mean, y_var = _mean_var(human_labeled)
    z = z_quantile(1 - (1 - confidence) / 2)
    half = z * math.sqrt(f_var / big_n + r_var / n)
    classical_half = z * math.sqrt(y_var / n)
    estimate = f_mean - r_mean
    return PredictionPowered(
        estimate=estimate, low=estimate - half, high=estimate + half, judge_mean=f_mean, rectifier=r_mean,
        labeled=n, unlabeled=big_n, classical=y_mean, classical_low=y_mean - classical_half,
        classical_high=y_mean + classical_half,
    )  # fmt: skip


@dataclass(slots=True)
class Agreement:
    """The confusion matrix of judge verdicts against human ones, on the traces both scored."""

    both_pass: int = 0
    both_fail: int = 0
    judge_pass_human_fail: int = 0
    judge_fail_human_pass: int = 0

    def add(self, judge: bool, human: bool) -> None:
        if judge and human:
            self.both_pass += 1
        elif not judge and not human:
            self.both_fail += 1
        elif judge:
            self.judge_pass_human_fail += 1
        else:
            self.judge_fail_human_pass += 1

    @property
    def n(self) -> int:
        return self.both_pass + self.both_fail + self.judge_pass_human_fail + self.judge_fail_human_pass

    @property
    def table(self) -> list[list[int]]:
        """Rows: the judge (fail, pass); columns: people (fail, pass)."""
        return [[self.both_fail, self.judge_fail_human_pass], [self.judge_pass_human_fail, self.both_pass]]


@dataclass(slots=True)
class Calibration:
    """One judge (policy, evaluator, score name) against people."""

    policy: str
    evaluator: str
    name: str
    feedback: str
    """The human feedback's score name (`thumbs`, `stars`) the judge is compared with."""
    confusion: Agreement
    kappa: Kappa | None
    sensitivity: tuple[float, float, float] | None
    """(value, low, high): of the traces people failed, the share the judge failed (Wilson interval)."""
    specificity: tuple[float, float, float] | None
    """(value, low, high): of the traces people passed, the share the judge passed (Wilson interval)."""
    ppi: PredictionPowered | None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["n"] = self.confusion.n
        return out


def _share(hits: int, n: int, confidence: float) -> tuple[float, float, float] | None:
    found = wilson_interval(hits, n, confidence)
    return None if found is None else (hits / n, found[0], found[1])


def calibrate(
    policy: str,
    evaluator: str,
    name: str,
    pairs: Sequence[tuple[bool, bool]],
    unlabeled: tuple[int, int],
    confidence: float = 0.95,
    feedback: str = "",
) -> Calibration:
    """From (judge verdict, human verdict) on the traces both scored, and (passed, n) of the judge's verdicts on
    the traces people did not label."""
    confusion = Agreement()
    for judge, human in pairs:
        confusion.add(judge, human)
    human_fail = confusion.both_fail + confusion.judge_pass_human_fail
    human_pass = confusion.both_pass + confusion.judge_fail_human_pass
    passed, big_n = unlabeled
    f_mean = passed / big_n if big_n else 0.0
    f_var = passed * (big_n - passed) / (big_n * (big_n - 1)) if big_n > 1 else 0.0
    return Calibration(
        policy=policy, evaluator=evaluator, name=name, feedback=feedback, confusion=confusion,
        kappa=cohen_kappa(confusion.table, confidence),
        sensitivity=_share(confusion.both_fail, human_fail, confidence),
        specificity=_share(confusion.both_pass, human_pass, confidence),
        ppi=_ppi(
            f_mean, f_var, big_n, [float(j) for j, _ in pairs], [float(h) for _, h in pairs], confidence
        ),
    )  # fmt: skip


def judge_calibrations(
    agreement: dict[str, list[dict[str, Any]]], negative_below: float = NEGATIVE_BELOW, confidence: float = 0.95
) -> list[dict[str, Any]]:
    """Judge calibration from the store's `judge_agreement` rows: per (policy, evaluator, name, feedback name), the
    confusion matrix, Cohen's kappa, sensitivity and specificity against people, and the prediction-powered rate.
    A person's feedback is a verdict as `feedback.negative`/`positive` reads it; feedback that is neither is left
    out."""
    totals = {(r["policy"], r["evaluator"], r["name"]): (r["passed"], r["n"]) for r in agreement["totals"]}
    groups: dict[tuple[str, str, str, str], list[tuple[bool, bool]]] = {}
    for r in agreement["pairs"]:
        score = Score(r["feedback"], value=r["human_value"], passed=r["human_passed"], label=r["human_label"])
        human = verdict(score, negative_below)
        if human is not None:
            groups.setdefault((r["policy"], r["evaluator"], r["name"], r["feedback"]), []).append((r["judge"], human))
    out = []
    for (policy, evaluator, name, feedback), pairs in groups.items():
        passed, n = totals.get((policy, evaluator, name), (0, 0))
        unlabeled = (max(0, passed - sum(j for j, _ in pairs)), max(0, n - len(pairs)))
        found = calibrate(policy, evaluator, name, pairs, unlabeled, confidence, feedback=feedback)
        out.append(found.as_dict())
    return out
