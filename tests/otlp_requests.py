"""OTLP trace requests for tests: traces of a root span and the children under it, with the trace ids given."""

from __future__ import annotations

import time

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

T0 = time.time_ns() - 60_000_000_000
"""A minute before the tests started: every span's start, so none is in the future or too old."""


def chain_request(trace_ids: list[bytes], per_trace: int = 2, service: str = "test") -> ExportTraceServiceRequest:
    """One resource of `service`, with `per_trace` spans a trace: span 1 the root, the others its children."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.append(KeyValue(key="service.name", value={"string_value": service}))
    spans = rs.scope_spans.add().spans
    for trace_id in trace_ids:
        for n in range(per_trace):
            spans.append(
                Span(
                    trace_id=trace_id,
                    span_id=(n + 1).to_bytes(8, "big"),
                    parent_span_id=b"" if n == 0 else (1).to_bytes(8, "big"),
                    name=f"step {n}",
                    start_time_unix_nano=T0 + n,
                    end_time_unix_nano=T0 + n + 1_000,
                )
            )
    return req
