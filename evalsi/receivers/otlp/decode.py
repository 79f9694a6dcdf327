"""Decoding OTLP trace and log requests (protobuf and OTLP/JSON) into batches, rejecting invalid items one by one."""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format, message_factory
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from evalsi.encoded import EncodedBatch
from evalsi.log_record import LogBatch, LogRecord
from evalsi.receivers.otlp.status import export_response, logs_export_response
from evalsi.span import SPAN_KINDS, STATUS_CODES, Span, SpanBatch, SpanEvent, SpanLink
from evalsi.telemetry import SelfMetrics

_ZERO_TRACE = bytes(16)
_ZERO_SPAN = bytes(8)

# The latest time the store holds: ClickHouse's DateTime64(9) and Arrow's timestamp[ns] are signed 64-bit
# nanoseconds since the epoch (2262-04-11T23:47:16.854775807Z); OTLP's fixed64 times go up to 2^64 - 1.
MAX_TIME_NS = (1 << 63) - 1
# The marker attribute of a span or log record whose out-of-range fields the receiver clamped: the fields' names.
CLAMPED = "evalsi.clamped"


class DecodeFailed(ValueError):
    """The request body is not an OTLP message at all (answered 400 / INVALID_ARGUMENT, with a `BadRequest` naming
    `reason` and, where known, the `field` that could not be decoded)."""

    def __init__(self, message: str, reason: str, field: str = "") -> None:
        super().__init__(message)
        self.reason = reason
        self.field = field


@dataclass(slots=True)
class Decoded:
    """What a request held: the valid items as a batch, and how many were rejected and why."""

    batch: SpanBatch | LogBatch | EncodedBatch
    rejected: int = 0
    message: str = ""
    clamped: int = 0  # items kept with out-of-range fields clamped (and marked with `evalsi.clamped`)
    clamp_note: str = ""  # the first of those, for the log


def any_value(v: AnyValue) -> Any:
    """An OTLP AnyValue as a plain Python value (str, bool, int, float, bytes, list, dict or None)."""
    which = v.WhichOneof("value")
    if which == "string_value":
        return v.string_value
    if which == "int_value":
        return v.int_value
    if which == "bool_value":
        return v.bool_value
    if which == "double_value":
        return v.double_value
    if which == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in v.kvlist_value.values}
    if which == "bytes_value":
        return v.bytes_value
    return None


def attributes(kvs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in kvs:
        v = kv.value
        which = v.WhichOneof("value")
        # the common scalar cases inline: this loop is the hottest code of ingest
        if which == "string_value":
            out[kv.key] = v.string_value
        elif which == "int_value":
            out[kv.key] = v.int_value
        elif which == "double_value":
            out[kv.key] = v.double_value
        elif which == "bool_value":
            out[kv.key] = v.bool_value
        elif which == "array_value":
            out[kv.key] = [
                x.string_value if x.WhichOneof("value") == "string_value" else any_value(x)
                for x in v.array_value.values
            ]
        else:
            out[kv.key] = any_value(v)
    return out


def _check_ids(trace_id: bytes, span_id: bytes, parent: bytes) -> str:
    if len(trace_id) != 16:
        return f"trace id must be 16 bytes, got {len(trace_id)}"
    if trace_id == _ZERO_TRACE:
        return "trace id is all zeros"
    if len(span_id) != 8:
        return f"span id must be 8 bytes, got {len(span_id)}"
    if span_id == _ZERO_SPAN:
        return "span id is all zeros"
    if parent and len(parent) != 8:
        return f"parent span id must be empty or 8 bytes, got {len(parent)}"
    return ""


_TIME_TOO_LATE = "is after 2262-04-11, the latest time the store holds"


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


def _answer(what: str, rejected: int, first_error: str) -> str:
    """The partial success message: how many items were rejected, and why the first was. Items kept with fields
    clamped are not in the answer (the check in the collector process does not look at those fields: every field
    read there costs each span of every request); they carry `evalsi.clamped`, and are counted and logged."""
    return f"{rejected} {what}(s) rejected; first: {first_error}" if rejected else ""


def _clamp_note(what: str, clamped: int, first_clamp: str) -> str:
    return f"{clamped} {what}(s) kept with out-of-range fields clamped ({CLAMPED}); first: {first_clamp}"


def count_clamped(metrics: Any, receiver: str, signal: str, decoded: Decoded, log: logging.Logger) -> None:
    """Count and log the items a decoding kept with fields clamped, where it decoded them (the receiver, or a
    pipeline worker)."""
    metrics.counter(
        "evalsi_receiver_clamped_items",
        "Spans and log records accepted with out-of-range fields clamped (marked with the evalsi.clamped attribute).",
        ["receiver", "signal"],
    ).labels(receiver, signal).inc(decoded.clamped)
    log.warning("clamped %s: %s", signal, decoded.clamp_note)


def _check_log_ids(trace_id: bytes, span_id: bytes) -> str:
    if trace_id and len(trace_id) != 16:
        return f"trace id must be empty or 16 bytes, got {len(trace_id)}"
    if span_id and len(span_id) != 8:
        return f"span id must be empty or 8 bytes, got {len(span_id)}"
    return ""


def shard_of(trace_id: bytes, shards: int) -> int:
    """The worker that owns a trace: its id's low 64 bits (random in W3C ids) modulo the worker count, as
    `SpanBatch.shard` does with hex ids. Records without a trace id go to worker 0."""
    return int.from_bytes(trace_id[8:], "big") % shards if len(trace_id) == 16 else 0


def spans_from_request(req: ExportTraceServiceRequest, shard: tuple[int, int] | None = None) -> Decoded:
    """The request's valid spans; with `shard=(i, n)` only those of traces worker i of n owns (the others are
    decoded by their own worker; invalid spans were already counted by the receiver)."""
    spans: list[Span] = []
    rejected = clamped = 0
    first_error = first_clamp = ""
    n_kinds = len(SPAN_KINDS)
    for rs in req.resource_spans:
        resource_attributes = attributes(rs.resource.attributes)
        service = resource_attributes.get("service.name", "")
        service_name = service if isinstance(service, str) else str(service)
        for ss in rs.scope_spans:
            scope_name = ss.scope.name
            scope_version = ss.scope.version
            for s in ss.spans:
                trace_id = s.trace_id
                if shard is not None and shard_of(trace_id, shard[1]) != shard[0]:
                    continue
                span_id = s.span_id
                parent = s.parent_span_id
                problem = _check_ids(trace_id, span_id, parent)
                start = s.start_time_unix_nano
                if not problem and start > MAX_TIME_NS:
                    problem = f"start_time_unix_nano {start} {_TIME_TOO_LATE}"
                if problem:
                    rejected += 1
                    if not first_error:
                        first_error = f"span {s.name!r}: {problem}"
                    continue
                end = s.end_time_unix_nano
                kind = s.kind
                status = s.status
                code = status.code
                events = (
                    [SpanEvent(e.time_unix_nano, e.name, attributes(e.attributes)) for e in s.events]
                    if s.events
                    else []
                )
                span_attributes = attributes(s.attributes)
                if end < start or end > MAX_TIME_NS or not 0 <= kind < n_kinds or not 0 <= code < 3 or events:
                    fields = _span_clamps(start, end, kind, code, [e.time_unix_nano for e in events])
                    if fields:
                        clamped += 1
                        if not first_clamp:
                            first_clamp = f"span {s.name!r} ({trace_id.hex()}/{span_id.hex()}): {', '.join(fields)}"
                        span_attributes[CLAMPED] = fields
                        if "end_time_unix_nano" in fields:
                            end = start
                        for e in events:
                            if e.time_unix_nano > MAX_TIME_NS:
                                e.time_unix_nano = start
                links = (
                    [
                        SpanLink(ln.trace_id.hex(), ln.span_id.hex(), ln.trace_state, attributes(ln.attributes))
                        for ln in s.links
                    ]
                    if s.links
                    else []
                )
                # positional: this constructor runs once per span on the ingest path
                spans.append(
                    Span(
                        trace_id.hex(),
                        span_id.hex(),
                        parent.hex(),
                        s.name,
                        SPAN_KINDS[kind] if 0 <= kind < n_kinds else "UNSPECIFIED",
                        start,
                        end,
                        STATUS_CODES[code] if 0 <= code < 3 else "UNSET",
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
    note = _clamp_note("span", clamped, first_clamp) if clamped else ""
    return Decoded(SpanBatch(spans), rejected, _answer("span", rejected, first_error), clamped, note)


def _log_clamps(time_ns: int, observed_ns: int) -> list[str]:
    """A log record's times past the store's range: they become 0 (unknown), and the record's timestamp the other
    time when that one is in range."""
    return [
        name for name, t in (("time_unix_nano", time_ns), ("observed_time_unix_nano", observed_ns)) if t > MAX_TIME_NS
    ]


def _clamp_time(t: int) -> int:
    return 0 if t > MAX_TIME_NS else t


def logs_from_request(req: ExportLogsServiceRequest, shard: tuple[int, int] | None = None) -> Decoded:
    records: list[LogRecord] = []
    rejected = clamped = 0
    first_error = first_clamp = ""
    for rl in req.resource_logs:
        resource_attributes = attributes(rl.resource.attributes)
        service = resource_attributes.get("service.name", "")
        service_name = service if isinstance(service, str) else str(service)
        for sl in rl.scope_logs:
            scope_name = sl.scope.name
            scope_version = sl.scope.version
            for r in sl.log_records:
                trace_id, span_id = r.trace_id, r.span_id
                if shard is not None and shard_of(trace_id, shard[1]) != shard[0]:
                    continue
                problem = _check_log_ids(trace_id, span_id)
                if problem:
                    rejected += 1
                    if not first_error:
                        first_error = f"log record: {problem}"
                    continue
                attrs = attributes(r.attributes)
                event_name = r.event_name or attrs.get("event.name", "")
                time_ns, observed_ns = r.time_unix_nano, r.observed_time_unix_nano
                if time_ns > MAX_TIME_NS or observed_ns > MAX_TIME_NS:
                    fields = _log_clamps(time_ns, observed_ns)
                    clamped += 1
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
    note = _clamp_note("log record", clamped, first_clamp) if clamped else ""
    return Decoded(LogBatch(records), rejected, _answer("log record", rejected, first_error), clamped, note)


def _parse_protobuf(body: bytes, message: Message, what: str) -> None:
    try:
        message.ParseFromString(body)
    except DecodeError as e:
        raise DecodeFailed(f"body is not a valid OTLP {what} protobuf: {e}", "INVALID_PROTOBUF") from None


def decode_traces_protobuf(body: bytes) -> Decoded:
    req = ExportTraceServiceRequest()
    _parse_protobuf(body, req, "ExportTraceServiceRequest")
    return spans_from_request(req)


def decode_logs_protobuf(body: bytes) -> Decoded:
    req = ExportLogsServiceRequest()
    _parse_protobuf(body, req, "ExportLogsServiceRequest")
    return logs_from_request(req)


def _hex_to_b64(value: Any) -> Any:
    """OTLP/JSON carries ids as hex; protobuf JSON expects base64. A bad id becomes bytes of a length no id
    has, which validation then rejects (so one bad id never fails the whole request)."""
    if not isinstance(value, str):
        return value
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raw = b"\xff"
    return base64.b64encode(raw).decode()


_ID_KEYS = ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id")


def _fix_ids(obj: dict[str, Any]) -> None:
    for key in _ID_KEYS:
        if key in obj:
            obj[key] = _hex_to_b64(obj[key])


def _items(obj: dict[str, Any], camel: str, snake: str) -> list[Any]:
    return obj.get(camel, obj.get(snake)) or []


# Where in an OTLP/JSON body the parser failed is searched for, by parsing parts of it again, in bodies up to this
# size (a few parses of the body: tenths of a second) and this many messages deep; the message names the problem in
# any case.
_LOCATE_BYTES = 256 * 1024
_LOCATE_LEVELS = 12


def _failed_field(doc: dict[str, Any], message: Message, size: int) -> str:
    """The path (`resourceSpans[0].scopeSpans[0].spans[3].startTimeUnixNano`) of the field protobuf's JSON parser
    fails on, found by parsing each field, then each element of the failing list, again on the way down (a lone one
    is the failing one); it stops where no single part fails alone, so it never names a wrong field. "" when not
    searched or not found."""
    if size > _LOCATE_BYTES:
        return ""
    path, node, cls = "", doc, type(message)
    for _ in range(_LOCATE_LEVELS):
        keys = list(node)
        key = keys[0] if len(keys) == 1 else next((k for k in keys if not _parses({k: node[k]}, cls)), None)
        field = None if key is None else _field_named(cls, key)
        if key is None or field is None:
            break
        path = f"{path}.{key}" if path else key
        value = node[key]
        if field.message_type is None or field.message_type.GetOptions().map_entry:
            break  # a scalar (or a map, which OTLP has none of): the field itself
        cls = message_factory.GetMessageClass(field.message_type)
        if field.is_repeated:
            if not isinstance(value, list) or not value:
                break
            index = 0 if len(value) == 1 else next((i for i, v in enumerate(value) if not _parses(v, cls)), None)
            if index is None:
                break
            path, value = f"{path}[{index}]", value[index]
        if not isinstance(value, dict):
            break
        node = value
    return path


def _field_named(cls: Any, key: str) -> Any:
    return cls.DESCRIPTOR.fields_by_camelcase_name.get(key) or cls.DESCRIPTOR.fields_by_name.get(key)


def _parses(item: Any, cls: Any) -> bool:
    try:
        json_format.ParseDict(item, cls(), ignore_unknown_fields=True)
        return True
    except Exception:
        return False


def _parse_json(body: bytes, message: Message, what: str, fix_ids: Any) -> None:
    """Parse OTLP/JSON into `message`; anything wrong with the body, whatever part of the parser finds it, is a
    `DecodeFailed` naming the problem."""

    def lone_surrogate(doc: Any) -> tuple[str, str]:
        """What and where (its path) the first string (object key or value) holding a lone UTF-16 surrogate is, or
        ("", ""). JSON escapes (`"\\ud800"`), or surrogates encoded as UTF-8 bytes, decode to such strings, which no
        UTF-8 text can hold: protobuf refuses them in values and fails inside its C code on them in keys."""
        # cheap screens first: such a string needs a `\ud`/`\uD` escape or an 0xED byte in UTF-8 (a UTF-16/32
        # body, which `json.loads` also takes, is checked in full), and then fails to encode as a whole
        if json.detect_encoding(body).startswith("utf-8") and not (
            b"\\ud" in body or b"\\uD" in body or b"\xed" in body
        ):
            return "", ""
        try:
            json.dumps(doc, ensure_ascii=False).encode("utf-8")
            return "", ""
        except UnicodeEncodeError:
            pass

        def shown(s: str) -> str:  # lone surrogates as `\udXXXX` text
            return s.encode("utf-8", "backslashreplace").decode("utf-8")

        stack: list[tuple[Any, str]] = [(doc, "")]
        while stack:
            node, path = stack.pop()
            for k, v in node.items() if isinstance(node, dict) else enumerate(node):
                if isinstance(k, str):
                    name = shown(k)
                    if name != k:
                        return f"the object key '{name[:60]}' in {path or 'the top-level object'}", path
                    at = f"{path}.{name}" if path else name
                else:
                    at = f"{path}[{k}]"
                if isinstance(v, str):
                    text = shown(v)
                    if text != v:
                        return f"the string '{text[:60]}' at {at}", at
                elif isinstance(v, dict | list):
                    stack.append((v, at))
        return "a string", ""  # not reached: encoding the whole document failed on one

    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise DecodeFailed(f"body is not valid JSON: {e}", "INVALID_JSON") from None
    if not isinstance(doc, dict):
        raise DecodeFailed(f"body must be a JSON object (an OTLP {what})", "INVALID_JSON")
    invalid = f"body is not a valid OTLP/JSON {what}"
    try:
        where, field = lone_surrogate(doc)
    except (RecursionError, MemoryError) as e:
        raise DecodeFailed(f"{invalid}: {type(e).__name__}: {e}", "INVALID_OTLP_JSON") from None
    if where:
        raise DecodeFailed(f"{invalid}: invalid Unicode escape (lone surrogate) in {where}", "INVALID_OTLP_JSON", field)
    try:
        fix_ids(doc)
        json_format.ParseDict(doc, message, ignore_unknown_fields=True)
    except json_format.ParseError as e:
        try:
            field = _failed_field(doc, message, len(body))
        except (RecursionError, MemoryError):
            field = ""
        raise DecodeFailed(f"{invalid}: {e}", "INVALID_OTLP_JSON", field) from None
    except (AttributeError, TypeError, ValueError, RecursionError, binascii.Error) as e:
        raise DecodeFailed(f"{invalid}: {e}", "INVALID_OTLP_JSON") from None
    except Exception as e:  # protobuf's parser fails in other ways on some input (e.g. a SystemError from upb)
        raise DecodeFailed(f"{invalid}: {type(e).__name__}: {e}", "INVALID_OTLP_JSON") from None


def _fix_span_ids(doc: dict[str, Any]) -> None:
    for rs in _items(doc, "resourceSpans", "resource_spans"):
        for ss in _items(rs, "scopeSpans", "scope_spans"):
            for s in ss.get("spans") or []:
                _fix_ids(s)
                for link in s.get("links") or []:
                    _fix_ids(link)


def _fix_log_ids(doc: dict[str, Any]) -> None:
    for rl in _items(doc, "resourceLogs", "resource_logs"):
        for sl in _items(rl, "scopeLogs", "scope_logs"):
            for r in _items(sl, "logRecords", "log_records"):
                _fix_ids(r)


def decode_traces_json(body: bytes) -> Decoded:
    req = ExportTraceServiceRequest()
    _parse_json(body, req, "ExportTraceServiceRequest", _fix_span_ids)
    return spans_from_request(req)


def decode_logs_json(body: bytes) -> Decoded:
    req = ExportLogsServiceRequest()
    _parse_json(body, req, "ExportLogsServiceRequest", _fix_log_ids)
    return logs_from_request(req)


@dataclass(frozen=True)
class Codec:
    """How one OTLP signal is decoded and answered."""

    signal: str  # "traces" | "logs"
    grpc_service: str
    from_protobuf: Callable[[bytes], Decoded]
    from_json: Callable[[bytes], Decoded]
    response: Callable[[int, str], Message]  # the export response, with partial success when items were rejected


TRACES = Codec(
    "traces",
    "opentelemetry.proto.collector.trace.v1.TraceService",
    decode_traces_protobuf,
    decode_traces_json,
    export_response,
)
LOGS = Codec(
    "logs",
    "opentelemetry.proto.collector.logs.v1.LogsService",
    decode_logs_protobuf,
    decode_logs_json,
    logs_export_response,
)


_Checked = tuple[int, int, str, frozenset[int]]


def _check_spans(req: ExportTraceServiceRequest, shards: int) -> _Checked:
    """Valid spans, rejected spans, the answer's message, and the shards owning the valid spans: what a receiver
    answers without decoding attributes (the workers decode, clamp and count the clamped)."""
    valid = rejected = 0
    first_error = ""
    owners: set[int] = set()
    # the checks of `_check_ids` and `shard_of` inline, the shard only until every worker owns a span: this loop
    # runs in the collector process for every span received (~0.7 µs a span instead of ~1.3)
    for rs in req.resource_spans:
        for ss in rs.scope_spans:
            for s in ss.spans:
                trace_id = s.trace_id
                span_id = s.span_id
                parent = s.parent_span_id
                if (
                    len(trace_id) != 16
                    or len(span_id) != 8
                    or (parent and len(parent) != 8)
                    or trace_id == _ZERO_TRACE
                    or span_id == _ZERO_SPAN
                ):
                    rejected += 1
                    if not first_error:
                        first_error = f"span {s.name!r}: {_check_ids(trace_id, span_id, parent)}"
                    continue
                start = s.start_time_unix_nano
                if start > MAX_TIME_NS:
                    rejected += 1
                    if not first_error:
                        first_error = f"span {s.name!r}: start_time_unix_nano {start} {_TIME_TOO_LATE}"
                    continue
                valid += 1
                if len(owners) < shards:
                    owners.add(int.from_bytes(trace_id[8:], "big") % shards)
    return valid, rejected, _answer("span", rejected, first_error), frozenset(owners)


def _check_logs(req: ExportLogsServiceRequest, shards: int) -> _Checked:
    valid = rejected = 0
    first_error = ""
    owners: set[int] = set()
    for rl in req.resource_logs:
        for sl in rl.scope_logs:
            for r in sl.log_records:
                trace_id, span_id = r.trace_id, r.span_id
                problem = _check_log_ids(trace_id, span_id)
                if problem:
                    rejected += 1
                    if not first_error:
                        first_error = f"log record: {problem}"
                    continue
                valid += 1
                owners.add(shard_of(trace_id, shards))
    return valid, rejected, _answer("log record", rejected, first_error), frozenset(owners)


def checking_codec(codec: Codec, shards: int) -> Codec:
    """The same codec, but it only parses and checks ids, keeping the request encoded for worker processes:
    the answer (status, partial success) is the one full decoding would give."""
    if codec.signal == "traces":
        message_type: Any = ExportTraceServiceRequest
        check: Callable[[Any, int], _Checked] = _check_spans
        fix_ids: Any = _fix_span_ids
    else:
        message_type, check, fix_ids = ExportLogsServiceRequest, _check_logs, _fix_log_ids
    what = message_type.DESCRIPTOR.name
    signal: Any = codec.signal

    def checked(req: Message, body: bytes) -> Decoded:
        valid, rejected, message, owners = check(req, shards)
        return Decoded(EncodedBatch(signal, body, valid, owners), rejected, message)

    def from_protobuf(body: bytes) -> Decoded:
        req = message_type()
        _parse_protobuf(body, req, what)
        return checked(req, body)

    def from_json(body: bytes) -> Decoded:
        req = message_type()
        _parse_json(body, req, what, fix_ids)
        return checked(req, req.SerializeToString())

    return Codec(codec.signal, codec.grpc_service, from_protobuf, from_json, codec.response)


def decode_encoded(
    batch: EncodedBatch, shard: tuple[int, int], *, metrics: SelfMetrics, log: logging.Logger
) -> SpanBatch | LogBatch:
    """In a pipeline worker: the spans or log records of a checked request that belong to this worker's traces,
    with their clamps counted and logged here (the receiver's check read only ids and start times)."""
    if batch.signal == "traces":
        result = spans_from_request(ExportTraceServiceRequest.FromString(batch.body), shard)
    else:
        result = logs_from_request(ExportLogsServiceRequest.FromString(batch.body), shard)
    if result.clamped:
        count_clamped(metrics, batch.receiver, batch.signal, result, log)
    assert not isinstance(result.batch, EncodedBatch)
    return result.batch
