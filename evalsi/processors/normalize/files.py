"""Normalizing OTLP files without a collector (what `evalsi normalize` shows): traces and logs, protobuf or JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from evalsi.model.log_record import LogBatch, LogRecord
from evalsi.model.span import Span, SpanBatch
from evalsi.processors.normalize import normalize_span
from evalsi.processors.normalize.events import apply_records, is_content_event, may_get_events
from evalsi.receivers.otlp.decode import (
    DecodeFailed,
    decode_logs_json,
    decode_logs_protobuf,
    decode_traces_json,
    decode_traces_protobuf,
)


@dataclass
class Normalized:
    spans: list[Span] = field(default_factory=list)
    records: list[LogRecord] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _read(path: Path) -> tuple[list[Span], list[LogRecord], str]:
    body = path.read_bytes()
    if body.lstrip()[:1] == b"{":
        head = body[:4096]
        decode = decode_logs_json if b"resourceLogs" in head or b"resource_logs" in head else decode_traces_json
    else:
        # protobuf says nothing of its type: the capture convention is `X.logs.pb`; else try traces, then logs
        decode = decode_logs_protobuf if ".logs." in path.name else decode_traces_protobuf
    decoded = decode(body)
    if decode is decode_traces_protobuf and not decoded.batch:
        decoded = decode_logs_protobuf(body)
    batch = decoded.batch
    if isinstance(batch, SpanBatch):
        return batch.spans, [], decoded.message
    assert isinstance(batch, LogBatch)
    return [], batch.records, decoded.message


def normalize_files(paths: list[Path]) -> Normalized:
    """Decode every file, normalize every span, join content events from the log files to their spans."""
    out = Normalized()
    for path in paths:
        try:
            spans, records, message = _read(path)
        except (OSError, DecodeFailed) as e:
            out.problems.append(f"{path}: {e}")
            continue
        if message:
            out.problems.append(f"{path}: {message}")
        out.spans.extend(spans)
        out.records.extend(records)
    by_key: dict[tuple[str, str], list[LogRecord]] = {}
    for r in out.records:
        if is_content_event(r):
            by_key.setdefault((r.trace_id, r.span_id), []).append(r)
    for span in out.spans:
        normalize_span(span)
        records = by_key.get((span.trace_id, span.span_id))
        if records and may_get_events(span):
            apply_records(span, records)
    out.spans.sort(key=lambda s: (s.trace_id, s.start_time_unix_nano))
    return out
