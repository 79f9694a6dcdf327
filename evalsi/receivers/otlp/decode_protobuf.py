"""OTLP request messages into batches: invalid items rejected one by one, out-of-range fields clamped, items cut
to the limits; and protobuf bodies parsed into those messages (OTLP/JSON bodies end up as the same
messages)."""

from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from evalsi.model.log_record import LogBatch, LogRecord
from evalsi.model.span import SPAN_KINDS, STATUS_CODES, Span, SpanBatch, SpanEvent, SpanLink
from evalsi.receivers.otlp.attributes import any_value, attributes, sized_attributes
from evalsi.receivers.otlp.config import Limits
from evalsi.receivers.otlp.cuts import ItemCut, cut_resource, cut_span, over_limits
from evalsi.receivers.otlp.decoded import CLAMPED, LIMITS, MAX_LOG_TIME_NS, MAX_TIME_NS, Cuts, Decoded, DecodeFailed
from evalsi.receivers.otlp.request_check import (
    TIME_TOO_LATE,
    ZERO_SPAN,
    ZERO_TRACE,
    answer,
    check_ids,
    check_log_count,
    check_log_ids,
    check_span_count,
)
from evalsi.receivers.otlp.sharding import shard_of


def _span_clamps(start: int, end: int, kind: int, code: int, event_times: Any) -> list[str]:
    """The fields of a span (already known to start in range) that the receiver clamps: an end out of range or
    before the start (the duration becomes 0), an event time out of range (it becomes the span's start), an enum
    number OTLP does not define (UNSPECIFIED / UNSET)."""
    clamped = []
    if end < start or end > MAX_TIME_NS:
        clamped.append("end_time_unix_nano")
    if any(t > MAX_TIME_NS for t in event_times):
        clamped.append("events.time_unix_nano")
    if not 0 <= kind < len(SPAN_KINDS):
        clamped.append("kind")
    if not 0 <= code < len(STATUS_CODES):
        clamped.append("status.code")
    return clamped


def _clamp_note(what: str, clamped: int, first_clamp: str) -> str:
    return f"{clamped} {what}(s) kept with out-of-range fields clamped ({CLAMPED}); first: {first_clamp}"


def spans_from_request(
    req: ExportTraceServiceRequest,
    shard: tuple[int, int] | None = None,
    limits: Limits = LIMITS,
    size: int | None = None,
    key: str = "limits",
) -> Decoded:
    """The request's valid spans, cut to `limits`; with `shard=(owned, n)` only those of traces in the slots, of `n`,
    that the bits of `owned` name (`shard_of`; the others are decoded by the worker owning them; invalid spans were
    already counted, and the request's span count checked, by the receiver). `size`: the request's encoded size,
    when known (no value in a smaller request can be over the value length limit, so then none is looked at);
    `key`: where the limits are in the config, for messages."""
    if shard is None:
        check_span_count(req, limits, key)
    spans: list[Span] = []
    rejected = clamped = out_of_range = 0
    first_error = first_clamp = ""
    n_kinds = len(SPAN_KINDS)
    max_attrs, max_length = limits.max_attributes_per_span, limits.max_attribute_value_length
    max_events, max_links = limits.max_events_per_span, limits.max_links_per_span
    check_sizes = size is None or size > max_length
    cuts = Cuts()
    # `shard_of` inline: a worker looks at every span of the request to find its own. With a power of two slots
    # (up to 256) the low 64 bits modulo their count are the last byte's low bits
    mine, shards = shard if shard is not None else (0, 0)
    mask = shards - 1 if 0 < shards <= 256 and not shards & (shards - 1) else -1
    # consecutive spans are often of one trace, and siblings: a trace's (a parent's) id is turned into hex once
    # for them
    last_trace, trace_hex = b"", ""
    last_parent, parent_hex = b"", ""
    for rs in req.resource_spans:
        resource_attributes, resource_cut = cut_resource(rs.resource, max_attrs, max_length, check_sizes)
        service = resource_attributes.get("service.name", "")
        service_name = service if isinstance(service, str) else str(service)
        for ss in rs.scope_spans:
            scope_name = ss.scope.name
            scope_version = ss.scope.version
            for s in ss.spans:
                trace_id = s.trace_id
                if (
                    shards
                    and not mine
                    >> (
                        (trace_id[15] & mask if mask >= 0 else int.from_bytes(trace_id[8:], "big") % shards)
                        if len(trace_id) == 16
                        else 0
                    )
                    & 1
                ):
                    continue
                span_id = s.span_id
                parent = s.parent_span_id
                start = s.start_time_unix_nano
                # `check_ids` inline for valid ids; its message for the others
                if (
                    len(trace_id) != 16
                    or len(span_id) != 8
                    or (parent and len(parent) != 8)
                    or trace_id == ZERO_TRACE
                    or span_id == ZERO_SPAN
                    or start > MAX_TIME_NS
                ):
                    rejected += 1
                    if not first_error:
                        problem = check_ids(trace_id, span_id, parent)
                        first_error = f"span {s.name!r}: {problem or f'start_time_unix_nano {start} {TIME_TOO_LATE}'}"
                    continue
                if trace_id != last_trace:
                    last_trace, trace_hex = trace_id, trace_id.hex()
                if parent != last_parent:
                    last_parent, parent_hex = parent, parent.hex()
                end = s.end_time_unix_nano
                kind = s.kind
                status = s.status
                code = status.code
                found_attributes, found_events, found_links = s.attributes, s.events, s.links
                cut = None
                # the limits cost the common span three lengths (and, in a request larger than the value length
                # limit, a look at each value's length): only a span over one is decoded again, the slow way
                if len(found_attributes) > max_attrs or len(found_events) > max_events or len(found_links) > max_links:
                    cut = ItemCut()
                    span_attributes, events, links = cut_span(s, limits, cut)
                else:
                    events = (
                        [SpanEvent(e.time_unix_nano, e.name, attributes(e.attributes)) for e in found_events[:]]
                        if found_events
                        else []
                    )
                    if check_sizes:
                        span_attributes, long = sized_attributes(found_attributes, max_length)
                    else:
                        span_attributes, long = attributes(found_attributes), False
                    links = (
                        [
                            SpanLink(ln.trace_id.hex(), ln.span_id.hex(), ln.trace_state, attributes(ln.attributes))
                            for ln in found_links[:]
                        ]
                        if found_links
                        else []
                    )
                    if (
                        long
                        or (events and over_limits(events, max_attrs, max_length, check_sizes))
                        or (links and over_limits(links, max_attrs, max_length, check_sizes))
                    ):
                        cut = ItemCut()
                        span_attributes, events, links = cut_span(s, limits, cut)
                if resource_cut is not None:
                    cut = cut or ItemCut()
                    cut.add(resource_cut)
                if cut:
                    clamped += 1
                    cut.mark(span_attributes, cuts, f"span {s.name!r} ({trace_hex}/{span_id.hex()})")
                if end < start or end > MAX_TIME_NS or not 0 <= kind < n_kinds or not 0 <= code < 3 or events:
                    fields = _span_clamps(start, end, kind, code, [e.time_unix_nano for e in events])
                    if fields:
                        out_of_range += 1
                        clamped += not cut
                        if not first_clamp:
                            first_clamp = f"span {s.name!r} ({trace_hex}/{span_id.hex()}): {', '.join(fields)}"
                        span_attributes[CLAMPED] = fields
                        if "end_time_unix_nano" in fields:
                            end = start
                        if "kind" in fields:
                            kind = 0  # UNSPECIFIED
                        if "status.code" in fields:
                            code = 0  # UNSET
                        for e in events:
                            if e.time_unix_nano > MAX_TIME_NS:
                                e.time_unix_nano = start
                # positional: this constructor runs once per span on the ingest path
                spans.append(
                    Span(
                        trace_hex,
                        span_id.hex(),
                        parent_hex,
                        s.name,
                        SPAN_KINDS[kind],
                        start,
                        end,
                        STATUS_CODES[code],
                        status.message,
                        s.trace_state,
                        service_name,
                        scope_name,
                        scope_version,
                        span_attributes,
                        resource_attributes,
                        events,
                        links,
                        s.flags,
                    )
                )
    note = _clamp_note("span", out_of_range, first_clamp) if out_of_range else ""
    return Decoded(
        SpanBatch(spans),
        rejected,
        answer("span", rejected, first_error),
        clamped,
        note,
        out_of_range,
        cuts if cuts.items else None,
    )


def _log_clamps(time_ns: int, observed_ns: int) -> list[str]:
    """A log record's times past the store's range: they become 0 (unknown), and the record's timestamp the other
    time when that one is in range."""
    return [
        name
        for name, t in (("time_unix_nano", time_ns), ("observed_time_unix_nano", observed_ns))
        if t > MAX_LOG_TIME_NS
    ]


def _clamp_time(t: int) -> int:
    return 0 if t > MAX_LOG_TIME_NS else t


def logs_from_request(
    req: ExportLogsServiceRequest,
    shard: tuple[int, int] | None = None,
    limits: Limits = LIMITS,
    size: int | None = None,
    key: str = "limits",
) -> Decoded:
    """The request's valid log records, their attributes cut to `limits` (the arguments as for `spans_from_request`;
    a record's body is not cut: the request's size bounds it)."""
    if shard is None:
        check_log_count(req, limits, key)
    records: list[LogRecord] = []
    rejected = clamped = out_of_range = 0
    first_error = first_clamp = ""
    max_attrs, max_length = limits.max_attributes_per_log_record, limits.max_attribute_value_length
    check_sizes = size is None or size > max_length
    cuts = Cuts()
    for rl in req.resource_logs:
        resource_attributes, resource_cut = cut_resource(rl.resource, max_attrs, max_length, check_sizes)
        service = resource_attributes.get("service.name", "")
        service_name = service if isinstance(service, str) else str(service)
        for sl in rl.scope_logs:
            scope_name = sl.scope.name
            scope_version = sl.scope.version
            for r in sl.log_records:
                trace_id, span_id = r.trace_id, r.span_id
                if shard is not None and not shard[0] >> shard_of(trace_id, shard[1]) & 1:
                    continue
                problem = check_log_ids(trace_id, span_id)
                if problem:
                    rejected += 1
                    if not first_error:
                        first_error = f"log record: {problem}"
                    continue
                found = r.attributes
                cut = None
                if len(found) > max_attrs:
                    cut = ItemCut()
                    attrs = cut.attrs(found, max_attrs, max_length, "")
                else:
                    attrs, long = sized_attributes(found, max_length) if check_sizes else (attributes(found), False)
                    if long:
                        cut = ItemCut()
                        attrs = cut.attrs(found, max_attrs, max_length, "")
                if resource_cut is not None:
                    cut = cut or ItemCut()
                    cut.add(resource_cut)
                if cut:
                    clamped += 1
                    cut.mark(attrs, cuts, f"log record ({trace_id.hex() or 'no trace'}/{span_id.hex() or 'no span'})")
                event_name = r.event_name or attrs.get("event.name", "")
                time_ns, observed_ns = r.time_unix_nano, r.observed_time_unix_nano
                if time_ns > MAX_LOG_TIME_NS or observed_ns > MAX_LOG_TIME_NS:
                    fields = _log_clamps(time_ns, observed_ns)
                    out_of_range += 1
                    clamped += not cut
                    if not first_clamp:
                        first_clamp = f"log record: {', '.join(fields)}"
                    attrs[CLAMPED] = fields
                    time_ns, observed_ns = _clamp_time(time_ns), _clamp_time(observed_ns)
                records.append(
                    LogRecord(
                        time_unix_nano=time_ns,
                        observed_time_unix_nano=observed_ns,
                        trace_id=trace_id.hex(),
                        span_id=span_id.hex(),
                        flags=r.flags,
                        severity_number=r.severity_number,
                        severity_text=r.severity_text,
                        body=any_value(r.body) if r.HasField("body") else None,
                        event_name=event_name if isinstance(event_name, str) else str(event_name),
                        attributes=attrs,
                        resource_attributes=resource_attributes,
                        service_name=service_name,
                        scope_name=scope_name,
                        scope_version=scope_version,
                    )
                )
    note = _clamp_note("log record", out_of_range, first_clamp) if out_of_range else ""
    return Decoded(
        LogBatch(records),
        rejected,
        answer("log record", rejected, first_error),
        clamped,
        note,
        out_of_range,
        cuts if cuts.items else None,
    )


def parse_protobuf(body: bytes, message: Message, what: str) -> None:
    try:
        message.ParseFromString(body)
    except DecodeError as e:
        raise DecodeFailed(f"body is not a valid OTLP {what} protobuf: {e}", "INVALID_PROTOBUF") from None


def decode_traces_protobuf(body: bytes, limits: Limits = LIMITS, key: str = "limits") -> Decoded:
    req = ExportTraceServiceRequest()
    parse_protobuf(body, req, "ExportTraceServiceRequest")
    return spans_from_request(req, None, limits, len(body), key)


def decode_logs_protobuf(body: bytes, limits: Limits = LIMITS, key: str = "limits") -> Decoded:
    req = ExportLogsServiceRequest()
    parse_protobuf(body, req, "ExportLogsServiceRequest")
    return logs_from_request(req, None, limits, len(body), key)
