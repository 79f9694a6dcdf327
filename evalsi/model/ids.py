"""W3C trace context ids as evalsi spells them: 32 (trace) or 16 (span) hex digits, lowercase in the pipeline."""

from __future__ import annotations

import re

_TRACE_ID = re.compile(r"[0-9a-fA-F]{32}")
_SPAN_ID = re.compile(r"[0-9a-fA-F]{16}")


def is_trace_id(text: str) -> bool:
    """32 hex digits, either case (a user may paste either); nothing before or after, not even a newline."""
    return _TRACE_ID.fullmatch(text) is not None


def is_span_id(text: str) -> bool:
    """16 hex digits, either case; nothing before or after."""
    return _SPAN_ID.fullmatch(text) is not None


def is_canonical_trace_id(text: str) -> bool:
    """A trace id as spans carry it in the pipeline: 32 lowercase hex digits (what backends are sent)."""
    return len(text) == 32 and text == text.lower() and is_trace_id(text)


SOURCE_TRACE_ID = "evalsi.source.trace_id"
"""Span attribute: the trace's id in the tool a pull receiver imported it from, when that is not its OTel id."""
SOURCE_SPAN_ID = "evalsi.source.span_id"
"""Span attribute: the span's id there, when that is not its OTel id."""
