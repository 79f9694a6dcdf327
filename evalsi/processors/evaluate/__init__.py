"""The `evaluate` processor: runs the online policies over every completed trace and session, hands on the scores,
and gives policies that read `feedback` a second look at a recent trace when human or external scores arrive late.

It needs whole traces, so it sits after `tail_sampling` (which hands on `BatchKind.TRACE` batches whatever its storage
decision); spans pass through unchanged to the exporters, scores go to the `scores` pipeline. Listed in the `scores`
pipeline too, it sees the feedback that flows there (`POST /v1/feedback`).
"""

from evalsi.processors.evaluate.config import DuplicateCallsConfig, EvaluateConfig, LateSignalsConfig
from evalsi.processors.evaluate.events import EVALUATION_EVENT, score_from_event
from evalsi.processors.evaluate.processor import Evaluate, _Work

__all__ = [
    "EVALUATION_EVENT", "DuplicateCallsConfig", "Evaluate", "EvaluateConfig", "LateSignalsConfig", "_Work",
    "score_from_event",
]  # fmt: skip
