"""Encoding for the `otlp` exporter: spans back to OTLP protobuf, scores as `gen_ai.evaluation.result` log records."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import SEVERITY_NUMBER_INFO, SEVERITY_NUMBER_WARN, LogRecord
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from evalsi.score import Score
from evalsi.span import SPAN_KINDS, STATUS_CODES, Span

EVENT_NAME = "gen_ai.evaluation.result"
SCOPE_NAME = "evalsi"
RESOURCE = {"service.name": "evalsi"}


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


def traces_request(spans: Iterable[Span]) -> ExportTraceServiceRequest:
    """Spans grouped back under their resource and scope, every OTLP field as it was received."""
    req = ExportTraceServiceRequest()
    resources: dict[int, Any] = {}
    scopes: dict[tuple[int, str, str], Any] = {}
    for span in spans:
        # spans of one OTLP resource share one attributes dict (see `Span`)
        rkey = id(span.resource_attributes)
        rs = resources.get(rkey)
        if rs is None:
            rs = resources[rkey] = req.resource_spans.add()
            _fill(rs.resource.attributes, span.resource_attributes)
        skey = (rkey, span.scope_name, span.scope_version)
        ss = scopes.get(skey)
        if ss is None:
            ss = scopes[skey] = rs.scope_spans.add()
            ss.scope.name = span.scope_name
            ss.scope.version = span.scope_version
        _encode_span(ss.spans.add(), span)
    return req


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


def logs_request(scores: Iterable[Score]) -> ExportLogsServiceRequest:
    """Scores as log records of one `service.name: evalsi` resource, each on its evaluated span's ids."""
    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    _fill(rl.resource.attributes, RESOURCE)
    sl = rl.scope_logs.add()
    sl.scope.name = SCOPE_NAME
    for score in scores:
        rec: LogRecord = sl.log_records.add()
        rec.time_unix_nano = score.timestamp_unix_nano
        rec.observed_time_unix_nano = score.timestamp_unix_nano
        rec.event_name = EVENT_NAME
        error = score.outcome == "error"
        rec.severity_number = SEVERITY_NUMBER_WARN if error else SEVERITY_NUMBER_INFO
        rec.severity_text = "WARN" if error else "INFO"
        rec.trace_id = _id(score.trace_id)
        rec.span_id = _id(score.span_id)
        _fill(rec.attributes, score_attributes(score))
    return req
