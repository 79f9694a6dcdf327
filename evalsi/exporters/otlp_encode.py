"""Encoding for the `otlp` exporter: spans back to OTLP protobuf, scores as `gen_ai.evaluation.result` log records,
and the OTLP service method each request goes to."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest, ExportLogsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import SEVERITY_NUMBER_INFO, SEVERITY_NUMBER_WARN, LogRecord
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from evalsi.model.score import Score
from evalsi.model.span import SPAN_KINDS, STATUS_CODES, Span

EVENT_NAME = "gen_ai.evaluation.result"
SCOPE_NAME = "evalsi"
RESOURCE = {"service.name": "evalsi"}
LOGS_METHOD = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"
TRACES_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def set_any_value(out: AnyValue, value: Any) -> None:
    """Fill an OTLP AnyValue from a plain Python value; the inverse of the receiver's `any_value`."""
    if value is None:
        return
    if isinstance(value, str):
        out.string_value = value
    elif isinstance(value, bool):  # before int: bool is an int
        out.bool_value = value
    elif isinstance(value, int):
        out.int_value = value
    elif isinstance(value, float):
        out.double_value = value
    elif isinstance(value, bytes | bytearray):
        out.bytes_value = bytes(value)
    elif isinstance(value, list | tuple):
        arr = out.array_value
        arr.SetInParent()
        for item in value:
            set_any_value(arr.values.add(), item)
    elif isinstance(value, Mapping):
        kvl = out.kvlist_value
        kvl.SetInParent()
        _fill(kvl.values, value)
    else:
        out.string_value = str(value)


def _fill(target: Any, attrs: Mapping[str, Any]) -> None:
    for key, value in attrs.items():
        kv: KeyValue = target.add()
        kv.key = key
        set_any_value(kv.value, value)


def _id(hex_id: str) -> bytes:
    return bytes.fromhex(hex_id) if hex_id else b""


# --- spans ----------------------------------------------------------------------------------------


def traces_request(
    spans: Iterable[Span], refused: list[tuple[Span, Exception]] | None = None
) -> ExportTraceServiceRequest:
    """Spans grouped back under their resource and scope, every OTLP field as it was received.

    A span that cannot be encoded (an id that is not hex, an integer out of int64, a string that is not UTF-8, ...)
    raises; with `refused` given, it is left out instead and appended there with its error, the others encoded."""
    req = ExportTraceServiceRequest()
    resources: dict[int, Any] = {}
    scopes: dict[tuple[int, str, str], Any] = {}
    for span in spans:
        try:
            # spans of one OTLP resource share one attributes dict (see `Span`)
            rkey = id(span.resource_attributes)
            rs = resources.get(rkey)
            if rs is None:
                rs = req.resource_spans.add()
                _or_remove(req.resource_spans, _fill, rs.resource.attributes, span.resource_attributes)
                resources[rkey] = rs
            skey = (rkey, span.scope_name, span.scope_version)
            ss = scopes.get(skey)
            if ss is None:
                ss = rs.scope_spans.add()
                _or_remove(rs.scope_spans, _set_scope, ss.scope, span)
                scopes[skey] = ss
            out = ss.spans.add()
            _or_remove(ss.spans, _encode_span, out, span)
        except Exception as e:
            if refused is None:
                raise
            refused.append((span, e))
    if refused:  # a resource or scope whose every span was refused
        for rs in list(req.resource_spans):
            for ss in list(rs.scope_spans):
                if not ss.spans:
                    rs.scope_spans.remove(ss)
            if not rs.scope_spans:
                req.resource_spans.remove(rs)
    return req


def _or_remove(container: Any, encode: Callable[..., None], *args: Any) -> None:
    """Run `encode(*args)` to fill the message just added last to `container`; when it raises, take it out again."""
    try:
        encode(*args)
    except Exception:
        del container[-1]
        raise


def _set_scope(scope: Any, span: Span) -> None:
    scope.name = span.scope_name
    scope.version = span.scope_version


def _encode_span(out: PbSpan, span: Span) -> None:
    out.trace_id = _id(span.trace_id)
    out.span_id = _id(span.span_id)
    out.parent_span_id = _id(span.parent_span_id)
    out.trace_state = span.trace_state
    out.name = span.name
    out.kind = SPAN_KINDS.index(span.kind) if span.kind in SPAN_KINDS else 0  # type: ignore[assignment]
    out.start_time_unix_nano = span.start_time_unix_nano
    out.end_time_unix_nano = span.end_time_unix_nano
    out.flags = span.flags
    _fill(out.attributes, span.attributes)
    for event in span.events:
        e = out.events.add()
        e.time_unix_nano = event.time_unix_nano
        e.name = event.name
        _fill(e.attributes, event.attributes)
    for link in span.links:
        ln = out.links.add()
        ln.trace_id = _id(link.trace_id)
        ln.span_id = _id(link.span_id)
        ln.trace_state = link.trace_state
        _fill(ln.attributes, link.attributes)
    code = STATUS_CODES.index(span.status_code) if span.status_code in STATUS_CODES else 0
    if code or span.status_message:
        out.status.code = code  # type: ignore[assignment]
        out.status.message = span.status_message


# --- scores ---------------------------------------------------------------------------------------


def score_attributes(score: Score) -> dict[str, Any]:
    """The `gen_ai.evaluation.result` event's attributes for one score, plus evalsi's own."""
    attrs: dict[str, Any] = {"gen_ai.evaluation.name": score.name}
    if score.value is not None and score.outcome == "scored":
        attrs["gen_ai.evaluation.score.value"] = float(score.value)
    label = score.label
    if label is None and score.passed is not None and score.outcome == "scored":
        label = "pass" if score.passed else "fail"
    if label is not None:
        attrs["gen_ai.evaluation.score.label"] = label
    if score.explanation:
        attrs["gen_ai.evaluation.explanation"] = score.explanation
    response_id = score.metadata.get("gen_ai.response.id") or score.metadata.get("response_id")
    if response_id:
        attrs["gen_ai.response.id"] = str(response_id)
    if score.outcome == "error":
        attrs["error.type"] = score.reason or "_OTHER"
    attrs["evalsi.policy"] = score.policy
    attrs["evalsi.evaluator"] = score.evaluator
    attrs["evalsi.outcome"] = score.outcome
    if score.outcome == "skipped" and score.reason:
        attrs["evalsi.reason"] = score.reason
    return attrs


def logs_request(
    scores: Iterable[Score], refused: list[tuple[Score, Exception]] | None = None
) -> ExportLogsServiceRequest:
    """Scores as log records of one `service.name: evalsi` resource, each on its evaluated span's ids.

    A score that cannot be encoded (an id that is not hex, a value that is not a number, a string that is not
    UTF-8, ...) raises; with `refused` given, it is left out instead and appended there with its error."""
    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    _fill(rl.resource.attributes, RESOURCE)
    sl = rl.scope_logs.add()
    sl.scope.name = SCOPE_NAME
    for score in scores:
        rec: LogRecord = sl.log_records.add()
        try:
            _or_remove(sl.log_records, _encode_record, rec, score)
        except Exception as e:
            if refused is None:
                raise
            refused.append((score, e))
    return req


def _encode_record(rec: LogRecord, score: Score) -> None:
    rec.time_unix_nano = score.timestamp_unix_nano
    rec.observed_time_unix_nano = score.timestamp_unix_nano
    rec.event_name = EVENT_NAME
    error = score.outcome == "error"
    rec.severity_number = SEVERITY_NUMBER_WARN if error else SEVERITY_NUMBER_INFO
    rec.severity_text = "WARN" if error else "INFO"
    rec.trace_id = _id(score.trace_id)
    rec.span_id = _id(score.span_id)
    _fill(rec.attributes, score_attributes(score))


# --- answers --------------------------------------------------------------------------------------


def rejected_in_answer(body: bytes, *, spans: bool, content_type: str = "application/x-protobuf") -> tuple[int, str]:
    """How many items an OTLP backend's successful answer says it rejected (`partial_success`), and its message;
    (0, "") when it rejected none or the answer cannot be read (an empty body is a full success)."""
    if not body:
        return 0, ""
    try:
        if content_type.split(";")[0].strip() == "application/json":
            partial = json.loads(body).get("partialSuccess") or {}
            rejected = partial.get("rejectedSpans" if spans else "rejectedLogRecords") or 0
            return int(rejected), str(partial.get("errorMessage") or "")
        answer = ExportTraceServiceResponse() if spans else ExportLogsServiceResponse()
        answer.ParseFromString(body)
    except (ValueError, TypeError, AttributeError, DecodeError):
        return 0, ""
    p = answer.partial_success
    return (p.rejected_spans if spans else p.rejected_log_records), p.error_message  # type: ignore[union-attr]
