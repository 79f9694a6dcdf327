"""Decoding OTLP trace and log requests (protobuf and OTLP/JSON) into batches, rejecting invalid items one by one."""

from __future__ import annotations

import base64
import binascii
import json
import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any

from google.protobuf import json_format, message_factory
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from evalsi.encoded import EncodedBatch
from evalsi.log_record import LogBatch, LogRecord
from evalsi.receivers.otlp.config import Limits
from evalsi.receivers.otlp.status import export_response, logs_export_response
from evalsi.span import SPAN_KINDS, STATUS_CODES, Span, SpanBatch, SpanEvent, SpanLink
from evalsi.telemetry import SelfMetrics

_ZERO_TRACE = bytes(16)
_ZERO_SPAN = bytes(8)

# The latest time the store holds: ClickHouse's DateTime64(9) and Arrow's timestamp[ns] are signed 64-bit
# nanoseconds since the epoch (2262-04-11T23:47:16.854775807Z); OTLP's fixed64 times go up to 2^64 - 1.
MAX_TIME_NS = (1 << 63) - 1
MAX_LOG_TIME_NS = 0xFFFFFFFF * 1_000_000_000
"""The last log record time the logs table orders by (`toUnixTimestamp`: UInt32 seconds, 2106-02-07T06:28:15Z)."""
# The marker attribute of a span or log record whose out-of-range fields the receiver clamped: the fields' names.
CLAMPED = "evalsi.clamped"
# The marker attributes of a span or log record cut to the receiver's `limits`: the keys of the attribute values
# truncated (`gen_ai.prompt`, `events[0].gen_ai.prompt`, `resource.x`), and what was dropped past a count limit with
# how many (`attributes:12`, `events:3`, `links:1`, `events[0].attributes:2`, `resource.attributes:7`).
TRUNCATED = "evalsi.truncated"
DROPPED = "evalsi.dropped"

LIMITS = Limits()  # the defaults


class DecodeFailed(ValueError):
    """The request body is not an OTLP message at all (answered 400 / INVALID_ARGUMENT, with a `BadRequest` naming
    `reason` and, where known, the `field` that could not be decoded)."""

    def __init__(self, message: str, reason: str, field: str = "") -> None:
        super().__init__(message)
        self.reason = reason
        self.field = field


class OverLimit(DecodeFailed):
    """A request holding more spans or log records than the receiver's limit: refused whole (400 /
    INVALID_ARGUMENT, which senders do not retry), its message naming the limit's key; the sender should send smaller
    batches."""

    def __init__(self, message: str, reason: str, limit: str, signal: str, count: int) -> None:
        super().__init__(message, reason)
        self.limit = limit  # the key, e.g. max_spans_per_request
        self.signal = signal
        self.count = count  # the items the request held


@dataclass(slots=True)
class Cuts:
    """What a decoding cut to the receiver's `limits` (each item cut is marked with `evalsi.truncated` /
    `evalsi.dropped`)."""

    items: int = 0  # spans or log records cut
    truncated: int = 0  # attribute values truncated
    dropped_attributes: int = 0
    dropped_events: int = 0
    dropped_links: int = 0
    note: str = ""  # the first item cut, for the log


@dataclass(slots=True)
class Decoded:
    """What a request held: the valid items as a batch, and how many were rejected and why."""

    batch: SpanBatch | LogBatch | EncodedBatch
    rejected: int = 0
    message: str = ""
    # items kept changed: out-of-range fields clamped (marked with `evalsi.clamped`) or cut to the receiver's limits
    # (`evalsi.truncated`, `evalsi.dropped`); where this is non-zero, `count_clamped` counts and logs them all
    clamped: int = 0
    clamp_note: str = ""  # the first item with fields clamped, for the log
    out_of_range: int = 0  # the items with fields clamped
    cuts: Cuts | None = None  # what was cut to the limits, when anything was


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


def _sized_attributes(kvs: Any, max_length: int) -> tuple[dict[str, Any], bool]:
    """`attributes(kvs)`, and whether a value may be longer than `max_length` bytes (a string of more than a quarter
    of that many characters, measured on the slow path; bytes, an array or a map holding a longer one), found while
    decoding: for a request larger than the limit, where every value is looked at (~30 ns a string)."""
    quarter = max_length >> 2
    out: dict[str, Any] = {}
    long = False
    for kv in kvs:
        v = kv.value
        which = v.WhichOneof("value")
        if which == "string_value":
            value = out[kv.key] = v.string_value
            if len(value) > quarter:
                long = True
        elif which == "int_value":
            out[kv.key] = v.int_value
        elif which == "double_value":
            out[kv.key] = v.double_value
        elif which == "bool_value":
            out[kv.key] = v.bool_value
        elif which == "array_value":
            items = out[kv.key] = [
                x.string_value if x.WhichOneof("value") == "string_value" else any_value(x)
                for x in v.array_value.values
            ]
            for x in items:
                if type(x) is str:
                    if len(x) > quarter:
                        long = True
                elif not long and _truncated(x, max_length) is not x:
                    long = True
        else:
            value = out[kv.key] = any_value(v)
            if not long and _truncated(value, max_length) is not value:
                long = True
    return out, long


def _truncated(value: Any, limit: int) -> Any:
    """`value` with every string or bytes in it (an array's or map's elements too) at most `limit` bytes long, a
    string cut at a UTF-8 character boundary; the same object when nothing in it is longer."""
    if isinstance(value, str):
        if len(value) * 4 <= limit:  # at most 4 bytes a character: short enough without encoding it
            return value
        if len(value) <= limit and len(value.encode("utf-8", "surrogatepass")) <= limit:
            return value
        # the first `limit` bytes lie within the first `limit` characters; a character cut in two is dropped
        return value[:limit].encode("utf-8", "surrogatepass")[:limit].decode("utf-8", "ignore")
    if isinstance(value, bytes):
        return value[:limit] if len(value) > limit else value
    if isinstance(value, list):
        items = [_truncated(v, limit) for v in value]
        return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
    if isinstance(value, dict):
        cut = {k: _truncated(v, limit) for k, v in value.items()}
        return cut if any(cut[k] is not v for k, v in value.items()) else value
    return value


class _Cut:
    """What the limits cut of one span or log record (or of a resource, for each of its items): the entries of its
    marker attributes and the counts."""

    __slots__ = ("attributes", "dropped", "events", "links", "truncated")

    def __init__(self) -> None:
        self.truncated: list[str] = []
        self.dropped: list[str] = []
        self.attributes = self.events = self.links = 0

    def __bool__(self) -> bool:
        return bool(self.truncated or self.dropped)

    def attrs(self, kvs: Any, max_count: int, max_length: int, where: str) -> dict[str, Any]:
        """Decode the first `max_count` attributes, their values truncated to `max_length` bytes; `where` prefixes
        what the markers name (`events[2].`)."""
        n = len(kvs)
        if n > max_count:
            self.dropped.append(f"{where}attributes:{n - max_count}")
            self.attributes += n - max_count
            kvs = kvs[:max_count]
        out = attributes(kvs)
        for key, value in out.items():
            cut = _truncated(value, max_length)
            if cut is not value:
                out[key] = cut  # the same keys: safe while iterating
                self.truncated.append(where + key)
        return out

    def add(self, other: _Cut | None) -> None:
        if other:
            self.truncated += other.truncated
            self.dropped += other.dropped
            self.attributes += other.attributes

    def mark(self, attrs: dict[str, Any], cuts: Cuts, what: str) -> None:
        """Mark the item's attributes (past the limit: the markers are extra) and count the cut in `cuts`."""
        if self.truncated:
            attrs[TRUNCATED] = self.truncated
        if self.dropped:
            attrs[DROPPED] = self.dropped
        cuts.items += 1
        cuts.truncated += len(self.truncated)
        cuts.dropped_attributes += self.attributes
        cuts.dropped_events += self.events
        cuts.dropped_links += self.links
        if not cuts.note:
            parts = [f"truncated {', '.join(self.truncated[:5])}" if self.truncated else ""]
            parts.append(f"dropped {', '.join(self.dropped[:5])}" if self.dropped else "")
            cuts.note = f"{what}: {'; '.join(p for p in parts if p)}"


def _resource(resource: Any, max_count: int, max_length: int, check_sizes: bool) -> tuple[dict[str, Any], _Cut | None]:
    """A resource's attributes, and what the limits cut of them (None: nothing)."""
    kvs = resource.attributes
    if len(kvs) <= max_count:
        out, long = _sized_attributes(kvs, max_length) if check_sizes else (attributes(kvs), False)
        if not long:
            return out, None
    cut = _Cut()
    out = cut.attrs(kvs, max_count, max_length, "resource.")
    return out, (cut or None)


def _over(items: list[SpanEvent] | list[SpanLink], max_count: int, max_length: int, check_sizes: bool) -> bool:
    """Whether an event or a link decoded the fast way holds more attributes than the limit (duplicate keys counted
    once: what is stored stays within it) or, with `check_sizes`, a value that may be too long."""
    for x in items:
        if len(x.attributes) > max_count:
            return True
        if check_sizes:
            for value in x.attributes.values():
                if _truncated(value, max_length) is not value:
                    return True
    return False


def _cut_span(s: Any, limits: Limits, cut: _Cut) -> tuple[dict[str, Any], list[SpanEvent], list[SpanLink]]:
    """A span's attributes, events and links within the limits; what was cut goes into `cut`."""
    max_attrs, max_length = limits.max_attributes_per_span, limits.max_attribute_value_length
    span_attributes = cut.attrs(s.attributes, max_attrs, max_length, "")
    found = s.events
    if len(found) > limits.max_events_per_span:
        dropped = len(found) - limits.max_events_per_span
        cut.dropped.append(f"events:{dropped}")
        cut.events += dropped
        found = found[: limits.max_events_per_span]
    events = [
        SpanEvent(e.time_unix_nano, e.name, cut.attrs(e.attributes, max_attrs, max_length, f"events[{i}]."))
        for i, e in enumerate(found)
    ]
    found = s.links
    if len(found) > limits.max_links_per_span:
        dropped = len(found) - limits.max_links_per_span
        cut.dropped.append(f"links:{dropped}")
        cut.links += dropped
        found = found[: limits.max_links_per_span]
    links = [
        SpanLink(
            ln.trace_id.hex(),
            ln.span_id.hex(),
            ln.trace_state,
            cut.attrs(ln.attributes, max_attrs, max_length, f"links[{i}]."),
        )
        for i, ln in enumerate(found)
    ]
    return span_attributes, events, links


def _over_request_limit(n: int, limit: int, what: str, key: str, signal: str) -> OverLimit:
    name = f"max_{what.replace(' ', '_')}s_per_request"
    return OverLimit(
        f"the request holds {n} {what}s, more than {key}.{name} ({limit}) allows; send them in smaller batches "
        f"(e.g. the SDK batch processor's max_export_batch_size)",
        f"TOO_MANY_{what.replace(' ', '_').upper()}S",
        name,
        signal,
        n,
    )


def _check_span_count(req: ExportTraceServiceRequest, limits: Limits, key: str) -> None:
    n = sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
    if n > limits.max_spans_per_request:
        raise _over_request_limit(n, limits.max_spans_per_request, "span", key, "traces")


def _check_log_count(req: ExportLogsServiceRequest, limits: Limits, key: str) -> None:
    n = sum(len(sl.log_records) for rl in req.resource_logs for sl in rl.scope_logs)
    if n > limits.max_log_records_per_request:
        raise _over_request_limit(n, limits.max_log_records_per_request, "log record", key, "logs")


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
    """Count and log the items a decoding kept changed (fields clamped, or cut to the limits), where it decoded them
    (the receiver, or a pipeline worker)."""
    if decoded.out_of_range:
        metrics.counter(
            "evalsi_receiver_clamped_items",
            "Spans and log records accepted with out-of-range fields clamped (marked with the evalsi.clamped "
            "attribute).",
            ["receiver", "signal"],
        ).labels(receiver, signal).inc(decoded.out_of_range)
        log.warning("clamped %s: %s", signal, decoded.clamp_note)
    cuts = decoded.cuts
    if cuts is not None and cuts.items:
        count_cuts(metrics, receiver, signal, cuts)
        what = "span" if signal == "traces" else "log record"
        log.warning(
            "cut %s to the receiver's limits: %d %s(s) kept with attributes, events or links cut (%s, %s); first: %s",
            signal, cuts.items, what, TRUNCATED, DROPPED, cuts.note,
        )  # fmt: skip


def count_cuts(metrics: SelfMetrics, receiver: str, signal: str, cuts: Cuts) -> None:
    if cuts.truncated:
        metrics.receiver_truncated_attributes.labels(receiver, signal).inc(cuts.truncated)
    if cuts.dropped_attributes:
        metrics.receiver_dropped_attributes.labels(receiver, signal).inc(cuts.dropped_attributes)
    if cuts.dropped_events:
        metrics.receiver_dropped_events.labels(receiver).inc(cuts.dropped_events)
    if cuts.dropped_links:
        metrics.receiver_dropped_links.labels(receiver).inc(cuts.dropped_links)


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


def spans_from_request(
    req: ExportTraceServiceRequest,
    shard: tuple[int, int] | None = None,
    limits: Limits = LIMITS,
    size: int | None = None,
    key: str = "limits",
) -> Decoded:
    """The request's valid spans, cut to `limits`; with `shard=(i, n)` only those of traces worker i of n owns (the
    others are decoded by their own worker; invalid spans were already counted, and the request's span count checked,
    by the receiver). `size`: the request's encoded size, when known (no value in a smaller request can be over
    the value length limit, so then none is looked at); `key`: where the limits are in the config, for messages."""
    if shard is None:
        _check_span_count(req, limits, key)
    spans: list[Span] = []
    rejected = clamped = out_of_range = 0
    first_error = first_clamp = ""
    n_kinds = len(SPAN_KINDS)
    max_attrs, max_length = limits.max_attributes_per_span, limits.max_attribute_value_length
    max_events, max_links = limits.max_events_per_span, limits.max_links_per_span
    check_sizes = size is None or size > max_length
    cuts = Cuts()
    for rs in req.resource_spans:
        resource_attributes, resource_cut = _resource(rs.resource, max_attrs, max_length, check_sizes)
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
                found_attributes, found_events, found_links = s.attributes, s.events, s.links
                cut = None
                # the limits cost the common span three lengths (and, in a request larger than the value length
                # limit, a look at each value's length): only a span over one is decoded again, the slow way
                if len(found_attributes) > max_attrs or len(found_events) > max_events or len(found_links) > max_links:
                    cut = _Cut()
                    span_attributes, events, links = _cut_span(s, limits, cut)
                else:
                    events = (
                        [SpanEvent(e.time_unix_nano, e.name, attributes(e.attributes)) for e in found_events]
                        if found_events
                        else []
                    )
                    if check_sizes:
                        span_attributes, long = _sized_attributes(found_attributes, max_length)
                    else:
                        span_attributes, long = attributes(found_attributes), False
                    links = (
                        [
                            SpanLink(ln.trace_id.hex(), ln.span_id.hex(), ln.trace_state, attributes(ln.attributes))
                            for ln in found_links
                        ]
                        if found_links
                        else []
                    )
                    if (
                        long
                        or (events and _over(events, max_attrs, max_length, check_sizes))
                        or (links and _over(links, max_attrs, max_length, check_sizes))
                    ):
                        cut = _Cut()
                        span_attributes, events, links = _cut_span(s, limits, cut)
                if resource_cut is not None:
                    cut = cut or _Cut()
                    cut.add(resource_cut)
                if cut:
                    clamped += 1
                    cut.mark(span_attributes, cuts, f"span {s.name!r} ({trace_id.hex()}/{span_id.hex()})")
                if end < start or end > MAX_TIME_NS or not 0 <= kind < n_kinds or not 0 <= code < 3 or events:
                    fields = _span_clamps(start, end, kind, code, [e.time_unix_nano for e in events])
                    if fields:
                        out_of_range += 1
                        clamped += not cut
                        if not first_clamp:
                            first_clamp = f"span {s.name!r} ({trace_id.hex()}/{span_id.hex()}): {', '.join(fields)}"
                        span_attributes[CLAMPED] = fields
                        if "end_time_unix_nano" in fields:
                            end = start
                        for e in events:
                            if e.time_unix_nano > MAX_TIME_NS:
                                e.time_unix_nano = start
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
    note = _clamp_note("span", out_of_range, first_clamp) if out_of_range else ""
    return Decoded(
        SpanBatch(spans),
        rejected,
        _answer("span", rejected, first_error),
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
        _check_log_count(req, limits, key)
    records: list[LogRecord] = []
    rejected = clamped = out_of_range = 0
    first_error = first_clamp = ""
    max_attrs, max_length = limits.max_attributes_per_log_record, limits.max_attribute_value_length
    check_sizes = size is None or size > max_length
    cuts = Cuts()
    for rl in req.resource_logs:
        resource_attributes, resource_cut = _resource(rl.resource, max_attrs, max_length, check_sizes)
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
                found = r.attributes
                cut = None
                if len(found) > max_attrs:
                    cut = _Cut()
                    attrs = cut.attrs(found, max_attrs, max_length, "")
                else:
                    attrs, long = _sized_attributes(found, max_length) if check_sizes else (attributes(found), False)
                    if long:
                        cut = _Cut()
                        attrs = cut.attrs(found, max_attrs, max_length, "")
                if resource_cut is not None:
                    cut = cut or _Cut()
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
        _answer("log record", rejected, first_error),
        clamped,
        note,
        out_of_range,
        cuts if cuts.items else None,
    )


def _parse_protobuf(body: bytes, message: Message, what: str) -> None:
    try:
        message.ParseFromString(body)
    except DecodeError as e:
        raise DecodeFailed(f"body is not a valid OTLP {what} protobuf: {e}", "INVALID_PROTOBUF") from None


def decode_traces_protobuf(body: bytes, limits: Limits = LIMITS, key: str = "limits") -> Decoded:
    req = ExportTraceServiceRequest()
    _parse_protobuf(body, req, "ExportTraceServiceRequest")
    return spans_from_request(req, None, limits, len(body), key)


def decode_logs_protobuf(body: bytes, limits: Limits = LIMITS, key: str = "limits") -> Decoded:
    req = ExportLogsServiceRequest()
    _parse_protobuf(body, req, "ExportLogsServiceRequest")
    return logs_from_request(req, None, limits, len(body), key)


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


def decode_traces_json(body: bytes, limits: Limits = LIMITS, key: str = "limits") -> Decoded:
    # an OTLP/JSON body is at least as long as any string or bytes value in it (escapes and base64 only lengthen
    # them): its length bounds them as a protobuf body's does
    req = ExportTraceServiceRequest()
    _parse_json(body, req, "ExportTraceServiceRequest", _fix_span_ids)
    return spans_from_request(req, None, limits, len(body), key)


def decode_logs_json(body: bytes, limits: Limits = LIMITS, key: str = "limits") -> Decoded:
    req = ExportLogsServiceRequest()
    _parse_json(body, req, "ExportLogsServiceRequest", _fix_log_ids)
    return logs_from_request(req, None, limits, len(body), key)


@dataclass(frozen=True)
class Codec:
    """How one OTLP signal is decoded and answered."""

    signal: str  # "traces" | "logs"
    grpc_service: str
    from_protobuf: Callable[[bytes], Decoded]
    from_json: Callable[[bytes], Decoded]
    response: Callable[[int, str], Message]  # the export response, with partial success when items were rejected
    limits: Limits = LIMITS  # what one request may carry
    key: str = "limits"  # where those limits are in the config (`receivers.otlp.limits`), for messages
    shards: int = 0  # a checking codec's worker count (see `checking_codec`); 0: a codec that decodes


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


def limited(codec: Codec, limits: Limits, key: str = "limits") -> Codec:
    """The same codec (decoding, or checking for pipeline workers) applying `limits`, found at `key` in the config."""
    if codec.signal == "traces":
        from_protobuf, from_json = decode_traces_protobuf, decode_traces_json
    else:
        from_protobuf, from_json = decode_logs_protobuf, decode_logs_json
    full = Codec(
        codec.signal,
        codec.grpc_service,
        partial(from_protobuf, limits=limits, key=key),
        partial(from_json, limits=limits, key=key),
        codec.response,
        limits,
        key,
    )
    return checking_codec(full, codec.shards) if codec.shards else full


# With pipeline workers, a request's limits go to the workers with it: its body (the protobuf request) is followed by
# one more field, of a number no OTLP message uses, holding them (so the body stays a valid request), which the
# worker's decoding reads back; a body without it is decoded with the defaults. So a worker never decodes with other
# limits than those of the receiver that checked the request, and with the default limits the body is not copied.
_LIMIT_KEYS = tuple(Limits.model_fields)
_LIMITS_FORMAT = struct.Struct(f"<{len(_LIMIT_KEYS)}q")
_TRAILER_FIELD = 0x7E5A1  # 517537
_TRAILER_MAGIC = b"evalsi.limits/1"


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_TRAILER_HEAD = _varint(_TRAILER_FIELD << 3 | 2) + _varint(len(_TRAILER_MAGIC) + _LIMITS_FORMAT.size) + _TRAILER_MAGIC
_TRAILER_SIZE = len(_TRAILER_HEAD) + _LIMITS_FORMAT.size


def limits_trailer(limits: Limits) -> bytes:
    """What follows a checked request's body on its way to a worker: the limits to decode it with."""
    return _TRAILER_HEAD + _LIMITS_FORMAT.pack(*(getattr(limits, k) for k in _LIMIT_KEYS))


@lru_cache(maxsize=64)
def _limits_of(values: tuple[int, ...]) -> Limits:
    return Limits.model_construct(**dict(zip(_LIMIT_KEYS, values, strict=True)))


def split_limits(body: bytes) -> tuple[Limits, bytes | memoryview]:
    """The limits a checked request's body carries, and the request without them (the defaults and the body as it
    is, when it carries none)."""
    end = len(body) - _LIMITS_FORMAT.size
    if len(body) < _TRAILER_SIZE or body[end - len(_TRAILER_HEAD) : end] != _TRAILER_HEAD:
        return LIMITS, body
    return _limits_of(_LIMITS_FORMAT.unpack_from(body, end)), memoryview(body)[: len(body) - _TRAILER_SIZE]


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
    """The same codec, but it only parses and checks ids (and the request's item count against the codec's
    limits), keeping the request encoded for worker processes, with the limits the workers cut it to: the answer
    (status, partial success) is the one full decoding would give."""
    if codec.signal == "traces":
        message_type: Any = ExportTraceServiceRequest
        check: Callable[[Any, int], _Checked] = _check_spans
        fix_ids: Any = _fix_span_ids
        check_count: Callable[[Any, Limits, str], None] = _check_span_count
    else:
        message_type, check, fix_ids = ExportLogsServiceRequest, _check_logs, _fix_log_ids
        check_count = _check_log_count
    what = message_type.DESCRIPTOR.name
    signal: Any = codec.signal
    limits, key = codec.limits, codec.key
    trailer = limits_trailer(limits) if limits != LIMITS else b""

    def checked(req: Message, body: bytes) -> Decoded:
        check_count(req, limits, key)
        valid, rejected, message, owners = check(req, shards)
        return Decoded(EncodedBatch(signal, body + trailer if trailer else body, valid, owners), rejected, message)

    def from_protobuf(body: bytes) -> Decoded:
        req = message_type()
        _parse_protobuf(body, req, what)
        return checked(req, body)

    def from_json(body: bytes) -> Decoded:
        req = message_type()
        _parse_json(body, req, what, fix_ids)
        return checked(req, req.SerializeToString())

    return Codec(codec.signal, codec.grpc_service, from_protobuf, from_json, codec.response, limits, key, shards)


def decode_encoded(
    batch: EncodedBatch, shard: tuple[int, int], *, metrics: SelfMetrics, log: logging.Logger
) -> SpanBatch | LogBatch:
    """In a pipeline worker: the spans or log records of a checked request that belong to this worker's traces,
    cut to the receiver's limits, with their clamps and cuts counted and logged here (the receiver's check read only
    ids, start times and the item count)."""
    limits, body = split_limits(batch.body)
    if batch.signal == "traces":
        result = spans_from_request(ExportTraceServiceRequest.FromString(body), shard, limits, len(body))
    else:
        result = logs_from_request(ExportLogsServiceRequest.FromString(body), shard, limits, len(body))
    if result.clamped:
        count_clamped(metrics, batch.receiver, batch.signal, result, log)
    assert not isinstance(result.batch, EncodedBatch)
    return result.batch


@dataclass(frozen=True)
class ReceiverLimits:
    """A receiver's limits as its transports apply them: the config section, where it is in the config (for
    messages), and the receiver's id and metrics (for the zero series and the refusals' counts)."""

    limits: Limits = LIMITS
    key: str = "limits"
    receiver: str = ""
    metrics: SelfMetrics | None = None

    def apply(self, codec: Codec) -> Codec:
        """The codec cutting to these limits; its counters shown from 0 on, so a rate works from the start."""
        m = self.metrics
        if m is not None:
            m.receiver_truncated_attributes.labels(self.receiver, codec.signal)
            m.receiver_dropped_attributes.labels(self.receiver, codec.signal)
            limit = "max_spans_per_request" if codec.signal == "traces" else "max_log_records_per_request"
            m.receiver_refused_requests.labels(self.receiver, codec.signal, limit)
            if codec.signal == "traces":
                m.receiver_dropped_events.labels(self.receiver)
                m.receiver_dropped_links.labels(self.receiver)
        return limited(codec, self.limits, self.key)

    def refused(self, e: OverLimit, transport: str) -> None:
        """Count a request refused for a count limit, and its items among the receiver's refused ones."""
        m = self.metrics
        if m is None:
            return
        m.receiver_refused_requests.labels(self.receiver, e.signal, e.limit).inc()
        items = m.receiver_refused_spans if e.signal == "traces" else m.receiver_refused_log_records
        items.labels(self.receiver, transport).inc(e.count)
