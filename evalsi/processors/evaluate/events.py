"""Evaluation results other tools send as `gen_ai.evaluation.result` log records (GenAI semantic conventions), read
as external scores."""

from __future__ import annotations

import time

from evalsi.model.log_record import LogRecord
from evalsi.model.score import Score

EVALUATION_EVENT = "gen_ai.evaluation.result"


def score_from_event(record: LogRecord) -> Score | None:
    """A `gen_ai.evaluation.result` log record as an external score; None for any other record."""
    a = record.attributes
    name = a.get("gen_ai.evaluation.name")
    if record.event_name != EVALUATION_EVENT or not isinstance(name, str) or not name or not record.trace_id:
        return None
    value = a.get("gen_ai.evaluation.score.value")
    label = a.get("gen_ai.evaluation.score.label")
    explanation = a.get("gen_ai.evaluation.explanation")
    error = a.get("error.type")
    score = Score(
        name,
        value=float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None,
        passed=value if isinstance(value, bool) else None,
        label=label if isinstance(label, str) else None,
        explanation=explanation if isinstance(explanation, str) else None,
        outcome="error" if error else "scored",
        reason=str(error) if error else None,
        trace_id=record.trace_id,
        span_id=record.span_id,
        policy=str(a.get("evalsi.policy") or "external"),
        evaluator=str(a.get("evalsi.evaluator") or record.scope_name or "external"),
        source="external",
        timestamp_unix_nano=record.timestamp or time.time_ns(),
    )
    response_id = a.get("gen_ai.response.id")
    if response_id:
        score.metadata["gen_ai.response.id"] = response_id
    return score
