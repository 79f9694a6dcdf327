"""Late feedback as the policies see it: the human and external scores on one trace, summed up into the `feedback`
CEL variable (`negative`, `positive`, `count`, `scores`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from evalsi.model.score import Score

__all__ = [
    "EMPTY", "FEEDBACK_SOURCES", "NEGATIVE_BELOW", "NEGATIVE_LABELS", "POSITIVE_LABELS", "feedback_variable",
    "is_feedback", "verdict",
]  # fmt: skip

FEEDBACK_SOURCES = frozenset({"human", "external"})
"""Score sources that are feedback: `POST /v1/feedback` (human) and `gen_ai.evaluation.result` log records
(external)."""

NEGATIVE_BELOW = 0.5
"""A numeric feedback value below this is negative, at or above it positive (the `evaluate` processor's
`late_signals.negative_below` changes it, e.g. to 3 for 1-5 star ratings)."""

# labels compare lowercased, with `-` and spaces read as `_`
NEGATIVE_LABELS = frozenset(
    {"negative", "thumbs_down", "thumbsdown", "👎", "incorrect", "wrong", "bad", "unhelpful", "not_helpful",
     "fail", "failed", "false", "no"}
)  # fmt: skip
POSITIVE_LABELS = frozenset(
    {"positive", "thumbs_up", "thumbsup", "👍", "correct", "right", "good", "helpful", "pass", "passed", "true",
     "yes"}
)  # fmt: skip


def is_feedback(score: Score) -> bool:
    """A scored human or external verdict (skipped and error scores say nothing about the trace)."""
    return score.source in FEEDBACK_SOURCES and score.outcome == "scored"


def verdict(score: Score, negative_below: float = NEGATIVE_BELOW) -> bool | None:
    """True for positive feedback, False for negative, None when it says neither (an unknown label).

    The verdict wins over the value, the value over the label: `passed`, then `value < negative_below`, then the
    label's membership in NEGATIVE_LABELS / POSITIVE_LABELS."""
    if score.passed is not None:
        return score.passed
    if score.value is not None:
        return score.value >= negative_below
    if score.label is not None:
        label = score.label.strip().lower().replace("-", "_").replace(" ", "_")
        if label in NEGATIVE_LABELS:
            return False
        if label in POSITIVE_LABELS:
            return True
    return None


def _value(score: Score) -> Any:
    if score.passed is not None:
        return score.passed
    if score.value is not None:
        return score.value
    return score.label


def feedback_variable(scores: Iterable[Score], negative_below: float = NEGATIVE_BELOW) -> dict[str, Any]:
    """`feedback` as CEL sees it, over the feedback scores among `scores` (in arrival order):

    - `negative` / `positive`: some feedback is negative / positive (both can hold: a thumbs up with a low rating);
    - `count`: how many feedback scores;
    - `scores`: score name → its latest verdict, value or label (`feedback.scores['stars'] < 3`).
    """
    negative = positive = False
    count = 0
    named: dict[str, Any] = {}
    for s in scores:
        if not is_feedback(s):
            continue
        count += 1
        v = verdict(s, negative_below)
        negative = negative or v is False
        positive = positive or v is True
        named[s.name] = _value(s)
    return {"negative": negative, "positive": positive, "count": count, "scores": named}


EMPTY = feedback_variable(())
"""What policies see online, before any feedback: nothing negative, nothing positive, no scores."""
