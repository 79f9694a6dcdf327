"""The OTLP codecs: how each signal is decoded (or, with pipeline workers, only checked) and answered, with the
receiver's limits; a worker's decoding of a checked request. The parts live in their own modules (decoded,
attributes, cuts, request_check, sharding, decode_protobuf, decode_json); the names other modules use are
re-exported here."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from evalsi.model.encoded import EncodedBatch
from evalsi.model.log_record import LogBatch
from evalsi.model.span import SpanBatch
from evalsi.receivers.otlp.attributes import any_value
from evalsi.receivers.otlp.config import Limits
from evalsi.receivers.otlp.decode_json import (
    decode_logs_json,
    decode_traces_json,
    fix_log_ids,
    fix_span_ids,
    parse_json,
)
from evalsi.receivers.otlp.decode_protobuf import (
    decode_logs_protobuf,
    decode_traces_protobuf,
    logs_from_request,
    parse_protobuf,
    spans_from_request,
)
from evalsi.receivers.otlp.decoded import (
    CLAMPED,
    LIMITS,
    MAX_LOG_TIME_NS,
    Decoded,
    DecodeFailed,
    OverLimit,
    count_clamped,
)
from evalsi.receivers.otlp.request_check import Checked, check_log_count, check_logs, check_span_count, check_spans
from evalsi.receivers.otlp.sharding import limits_trailer, shard_of, split_limits
from evalsi.receivers.otlp.status import export_response, logs_export_response
from evalsi.runtime.telemetry import SelfMetrics

__all__ = [
    "CLAMPED",
    "LOGS",
    "MAX_LOG_TIME_NS",
    "TRACES",
    "Codec",
    "DecodeFailed",
    "Decoded",
    "OverLimit",
    "ReceiverLimits",
    "any_value",
    "checking_codec",
    "count_clamped",
    "decode_encoded",
    "decode_logs_json",
    "decode_logs_protobuf",
    "decode_traces_json",
    "decode_traces_protobuf",
    "limited",
    "logs_from_request",
    "shard_of",
    "spans_from_request",
    "split_limits",
]


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


def checking_codec(codec: Codec, shards: int) -> Codec:
    """The same codec, but it only parses and checks ids (and the request's item count against the codec's
    limits), keeping the request encoded for worker processes, with the limits the workers cut it to: the answer
    (status, partial success) is the one full decoding would give."""
    if codec.signal == "traces":
        message_type: Any = ExportTraceServiceRequest
        check: Callable[[Any, int], Checked] = check_spans
        fix_ids: Any = fix_span_ids
        check_count: Callable[[Any, Limits, str], None] = check_span_count
    else:
        message_type, check, fix_ids = ExportLogsServiceRequest, check_logs, fix_log_ids
        check_count = check_log_count
    what = message_type.DESCRIPTOR.name
    signal: Any = codec.signal
    limits, key = codec.limits, codec.key
    trailer = limits_trailer(limits) if limits != LIMITS else b""

    def checked(req: Message, body: bytes) -> Decoded:
        check_count(req, limits, key)
        valid, rejected, message, owners = check(req, shards)
        return Decoded(EncodedBatch(signal, b"".join((body, trailer)) if trailer else body, valid, owners), rejected,
                       message)  # fmt: skip

    def from_protobuf(body: bytes) -> Decoded:
        req = message_type()
        parse_protobuf(body, req, what)
        return checked(req, body)

    def from_json(body: bytes) -> Decoded:
        req = message_type()
        parse_json(body, req, what, fix_ids)
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
