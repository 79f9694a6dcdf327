"""The data model every stage reads and writes: spans and their batches, scores, log records, W3C ids, a trace's
trajectory and message content, and requests kept encoded for pipeline workers. It imports nothing above it."""

from evalsi.model.content import last_text, tool_calls, tool_result
from evalsi.model.encoded import Decoder, EncodedBatch, EncodedConsumer
from evalsi.model.ids import SOURCE_SPAN_ID, SOURCE_TRACE_ID, is_canonical_trace_id, is_span_id, is_trace_id
from evalsi.model.log_record import LogBatch, LogRecord
from evalsi.model.score import Score, ScoreBatch
from evalsi.model.span import (
    DEFAULT_PROJECT,
    PROJECT_ATTRIBUTE,
    BatchKind,
    SessionKey,
    Span,
    SpanBatch,
    SpanEvent,
    SpanLink,
    TraceKey,
    project_of,
    span_from_canonical,
    trace_key,
)
from evalsi.model.trajectory import build_trajectories, build_trajectory, join_twins, span_tree

__all__ = [
    "DEFAULT_PROJECT", "PROJECT_ATTRIBUTE", "SOURCE_SPAN_ID", "SOURCE_TRACE_ID", "BatchKind", "Decoder", "EncodedBatch",
    "EncodedConsumer", "LogBatch", "LogRecord", "Score", "ScoreBatch", "SessionKey", "Span", "SpanBatch", "SpanEvent",
    "SpanLink", "TraceKey", "build_trajectories", "build_trajectory", "is_canonical_trace_id", "is_span_id",
    "is_trace_id", "join_twins", "last_text", "project_of", "span_from_canonical", "span_tree", "tool_calls",
    "tool_result", "trace_key",
]  # fmt: skip
