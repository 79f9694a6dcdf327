"""Anytime-valid confidence sequences for the mean of a stream of values in [0, 1]: an interval that holds the mean
at every moment at once with probability 1 - alpha, so an alert may look at it after every score.

The sequence is the predictable plug-in empirical-Bernstein confidence sequence (PrPl-EB) of Waudby-Smith & Ramdas,
"Estimating means of bounded random variables by betting", JRSS B 86(1), 2023, Theorem 2 (Section 3.2), with the
running intersection of Section 3 (itself a valid confidence sequence):

    C_t = ( sum_i l_i X_i / sum_i l_i  ±  (log(2/alpha) + sum_i v_i psi_E(l_i)) / sum_i l_i ),
    v_i = 4 (X_i - mu_{i-1})^2,  psi_E(l) = (-log(1 - l) - l) / 4,
    l_t = min( sqrt(2 log(2/alpha) / (sigma2_{t-1} t log(1 + t))), c ),  c = 1/2,
    mu_t = (1/2 + sum_{i<=t} X_i) / (t + 1),  sigma2_t = (1/4 + sum_{i<=t} (X_i - mu_i)^2) / (t + 1).

Checked against the authors' reference code (`confseq`: `lambda_predmix_eb`, `predmix_empbern_cs`), which uses
the same bets and the same margin. The guarantee needs only that each value lies in [0, 1] and has the same
conditional mean given the past; no independence and no distribution is assumed.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["BoundedMeanSequence"]


class _Scalars:
    """The four functions the update needs, for floats; numpy passes itself (`np`) to run many streams at once."""

    log = staticmethod(math.log)
    sqrt = staticmethod(math.sqrt)
    minimum = staticmethod(min)
    maximum = staticmethod(max)


class BoundedMeanSequence:
    """A PrPl-EB confidence sequence at level 1 - `alpha` for the mean of values in [0, 1], updated one value at a time
    in O(1). `add` takes a float, or (with `xp=numpy`) an array holding the next value of many independent streams."""

    __slots__ = (
        "alpha", "high", "low", "n", "sum_bet", "sum_bet_x", "sum_penalty", "sum_sq", "sum_x", "truncation", "xp",
    )  # fmt: skip

    def __init__(self, alpha: float = 0.05, *, truncation: float = 0.5, xp: Any = None) -> None:
        if not 0 < alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), not {alpha}")
        if not 0 < truncation < 1:
            raise ValueError(f"truncation must be in (0, 1), not {truncation}")
        self.alpha = alpha
        self.truncation = truncation
        self.xp = xp if xp is not None else _Scalars
        self.n = 0
        self.sum_x: Any = 0.0
        self.sum_sq: Any = 0.0
        self.sum_bet: Any = 0.0
        self.sum_bet_x: Any = 0.0
        self.sum_penalty: Any = 0.0
        self.low: Any = 0.0
        self.high: Any = 1.0

    def add(self, x: Any) -> None:
        """One more value in [0, 1] (values outside are the caller's error: the guarantee would not hold)."""
        xp = self.xp
        t = self.n + 1
        log_term = math.log(2 / self.alpha)
        mu_prev = (0.5 + self.sum_x) / t
        sigma2_prev = (0.25 + self.sum_sq) / t
        bet = xp.minimum(xp.sqrt(2 * log_term / (sigma2_prev * t * math.log1p(t))), self.truncation)
        self.sum_bet = self.sum_bet + bet
        self.sum_bet_x = self.sum_bet_x + bet * x
        self.sum_penalty = self.sum_penalty + (x - mu_prev) ** 2 * (-xp.log(1 - bet) - bet)
        self.sum_x = self.sum_x + x
        self.sum_sq = self.sum_sq + (x - (0.5 + self.sum_x) / (t + 1)) ** 2
        self.n = t
        center = self.sum_bet_x / self.sum_bet
        margin = (log_term + self.sum_penalty) / self.sum_bet
        self.low = xp.maximum(self.low, center - margin)
        self.high = xp.minimum(self.high, center + margin)

    @property
    def interval(self) -> tuple[Any, Any]:
        """(low, high): the running intersection so far; (0, 1) before any value."""
        return self.low, self.high
