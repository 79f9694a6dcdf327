"""The otlp receiver's `limits` (docs/receivers/otlp.md#limits): what one request may carry.

Against a real `evalsi serve`, in-process and with 2 pipeline workers, fed by the real OpenTelemetry SDK exporters
(one `export()` call: one request), with small limits so each is cheap to pass:

- a string value over `max_attribute_value_length` is stored truncated at a UTF-8 boundary, named in the span's
  `evalsi.truncated`, and counted in `evalsi_receiver_truncated_attributes_total`; the other spans of the request
  are stored intact (HTTP and gRPC);
- attributes, events and links past their counts are dropped, listed in `evalsi.dropped` and counted;
- a request over `max_spans_per_request` / `max_log_records_per_request` is refused whole: 400 / INVALID_ARGUMENT
  naming the limit's key path, nothing of it stored, the refusal counted;
- log records: attributes cut alike (read back from the store once the collector has stopped);
- the request's size after decompression: `max_request_body_size` (413) and `max_recv_msg_size_mib`
  (RESOURCE_EXHAUSTED) apply to the inflated body;
- a limit of 0, a negative one, `true`, or an unknown key is a config error naming the key path.

In-process checks: the checking codec plus the workers' decoding cut exactly as full decoding does; the real
captures in tests/fixtures lose nothing to the default limits; the doc lists every key with its default.
"""

from __future__ import annotations

import base64
import gzip
import json
import logging
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml
from google.protobuf import json_format
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry._logs import LogRecord as ApiLogRecord
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, LogRecordExportResult, SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link
from prometheus_client.parser import text_string_to_metric_families
from running_collector import EVALSI, FIXTURES, Collector, serve_config, start_collector

from evalsi.collector.config import ConfigError, parse_config
from evalsi.exporters.clickhouse.backend import open_backend
from evalsi.model.encoded import EncodedBatch
from evalsi.receivers.otlp.config import Limits
from evalsi.receivers.otlp.decode import (
    LOGS,
    TRACES,
    checking_codec,
    decode_encoded,
    limited,
    split_limits,
)
from evalsi.runtime.telemetry import SelfMetrics

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "receivers" / "otlp.md"
PROTOBUF = {"Content-Type": "application/x-protobuf"}
TRACE_EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"

# the limits of this module's collectors: small, so that passing each is cheap
LIMITS = {
    "max_attribute_value_length": 1000,
    "max_attributes_per_span": 8,
    "max_events_per_span": 4,
    "max_links_per_span": 3,
    "max_attributes_per_log_record": 6,
    "max_spans_per_request": 50,
    "max_log_records_per_request": 20,
}
MAX_BODY = 4 * 1024 * 1024  # protocols.http.max_request_body_size
MAX_MIB = 1  # protocols.grpc.max_recv_msg_size_mib


def limited_config(store: Path, workers: int) -> dict[str, Any]:
    cfg = serve_config(store)
    otlp = cfg["receivers"]["otlp"]
    otlp["protocols"]["http"]["max_request_body_size"] = MAX_BODY
    otlp["protocols"]["grpc"]["max_recv_msg_size_mib"] = MAX_MIB
    otlp["limits"] = dict(LIMITS)
    cfg["service"]["workers"] = workers
    return cfg


@pytest.fixture(scope="module", params=[1, 2], ids=["in-process", "2-workers"])
def collector(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collector]:
    tmp = tmp_path_factory.mktemp(f"limits-{request.param}")
    c = start_collector(tmp, limited_config(tmp / "store", request.param))
    yield c
    assert c.stop() == 0, c.log_path.read_text()[-3000:]


# --- helpers ---------------------------------------------------------------------------------------------------


def metric(c: Collector, name: str, **labels: str) -> float:
    """The sum of a counter's samples with these labels (worker processes' counts are merged into /metrics)."""
    total = 0.0
    for family in text_string_to_metric_families(httpx.get(c.metrics, timeout=10).text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def wait_metric(c: Collector, name: str, expected: float, timeout: float = 10, **labels: str) -> float:
    """Poll until the counter reaches `expected` (workers report their counts every second); return its value."""
    deadline = time.monotonic() + timeout
    value = metric(c, name, **labels)
    while value < expected and time.monotonic() < deadline:
        time.sleep(0.1)
        value = metric(c, name, **labels)
    return value


def make_spans(build: Callable[[Any], None], service: str = "limits-test") -> list[ReadableSpan]:
    """The spans `build(tracer)` makes, as the SDK hands them to an exporter (nothing is sent yet)."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    build(provider.get_tracer("tests.limits", "1.0"))
    provider.shutdown()
    return list(memory.get_finished_spans())


def export(c: Collector, spans: list[ReadableSpan], transport: str) -> SpanExportResult:
    """One SDK export call: the whole list in one request."""
    if transport == "grpc":
        exporter: Any = GrpcSpanExporter(endpoint=c.grpc, insecure=True, timeout=10)
    else:
        exporter = HttpSpanExporter(endpoint=c.http + "/v1/traces", timeout=10)
    try:
        return exporter.export(spans)
    finally:
        exporter.shutdown()


def trace_hex(spans: list[ReadableSpan]) -> str:
    [trace_id] = {s.context.trace_id for s in spans}
    return format(trace_id, "032x")


def stored(c: Collector, trace_id: str, n: int, timeout: float = 15) -> dict[str, dict[str, Any]]:
    """The trace's stored spans by name, once `n` are stored."""
    deadline = time.monotonic() + timeout
    spans: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        r = httpx.get(f"{c.api}/api/v1/traces/{trace_id}", timeout=10)
        spans = r.json()["spans"] if r.status_code == 200 else []
        if len(spans) >= n:
            break
        time.sleep(0.05)
    assert len(spans) == n, f"{len(spans)} of {n} spans stored"
    return {s["name"]: s for s in spans}


def marker(attributes: dict[str, Any], key: str) -> list[str]:
    """A marker attribute as stored (a list, kept as JSON text as the OTel ClickHouse exporter keeps arrays)."""
    return json.loads(attributes[key])


def status_of(response: httpx.Response) -> status_pb2.Status:
    return status_pb2.Status.FromString(response.content)


def bad_request_of(status: status_pb2.Status) -> error_details_pb2.BadRequest:
    [detail] = [d for d in status.details if d.Is(error_details_pb2.BadRequest.DESCRIPTOR)]
    bad = error_details_pb2.BadRequest()
    detail.Unpack(bad)
    return bad


# --- value length -----------------------------------------------------------------------------------------------

# the module's limit is 1000 bytes: each value and what is stored of it
LONG_VALUES = {
    "app.ascii": ("a" * 5000, "a" * 1000),
    "app.two_byte": ("x" + "é" * 2000, "x" + "é" * 499),  # byte 1000 is the first half of an é: it goes
    "app.three_byte": ("€" * 400, "€" * 333),  # 999 bytes; the 334th € would end at byte 1002
    "app.four_byte": ("🙂" * 300, "🙂" * 250),  # exactly 1000 bytes
}
KEPT_VALUES = {"app.at_limit": "b" * 1000, "app.below": "é" * 499, "app.number": 7}


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_a_long_value_is_stored_truncated_at_a_utf8_boundary_and_marked(collector: Collector, transport: str) -> None:
    labels = {"receiver": "otlp", "signal": "traces"}
    before = metric(collector, "evalsi_receiver_truncated_attributes_total", **labels)

    def build(tracer: Any) -> None:
        with tracer.start_as_current_span("root"):
            with tracer.start_as_current_span("long") as span:
                for key, (sent, _) in LONG_VALUES.items():
                    span.set_attribute(key, sent)
                span.set_attribute("app.list", ["c" * 1500, "short"])
                for key, value in KEPT_VALUES.items():
                    span.set_attribute(key, value)
                span.add_event("gen_ai.user.message", {"content": "d" * 3000, "role": "user"})
            for i in range(3):
                with tracer.start_as_current_span(f"intact-{i}") as span:
                    span.set_attribute("app.value", "v" * 999)
                    span.add_event("gen_ai.choice", {"content": "e" * 1000})

    spans = make_spans(build, f"limits-{transport}")
    assert export(collector, spans, transport) == SpanExportResult.SUCCESS

    got = stored(collector, trace_hex(spans), 5)
    long = got["long"]["attributes"]
    for key, (_, kept) in LONG_VALUES.items():
        assert long[key] == kept, key
        assert len(kept.encode()) <= 1000
    assert json.loads(long["app.list"]) == ["c" * 1000, "short"]
    for key, value in KEPT_VALUES.items():
        assert long[key] == str(value), key  # at the limit, or under it: as sent
    [event] = got["long"]["events"]
    assert event["attributes"] == {"content": "d" * 1000, "role": "user"}
    expected = [*LONG_VALUES, "app.list", "events[0].content"]
    assert sorted(marker(long, "evalsi.truncated")) == sorted(expected)
    assert "evalsi.dropped" not in long
    for name in ("root", "intact-0", "intact-1", "intact-2"):
        attrs = got[name]["attributes"]
        assert "evalsi.truncated" not in attrs and "evalsi.dropped" not in attrs, name
        if name != "root":
            assert attrs["app.value"] == "v" * 999
            assert got[name]["events"][0]["attributes"]["content"] == "e" * 1000

    after = wait_metric(collector, "evalsi_receiver_truncated_attributes_total", before + len(expected), **labels)
    assert after - before == len(expected)


def test_a_long_resource_attribute_marks_every_span_of_the_resource(collector: Collector) -> None:
    labels = {"receiver": "otlp", "signal": "traces"}
    before = metric(collector, "evalsi_receiver_truncated_attributes_total", **labels)
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "limits-resource", "host.note": "r" * 2000}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("tests.limits")
    with tracer.start_as_current_span("parent"), tracer.start_as_current_span("child"):
        pass
    provider.shutdown()
    spans = list(memory.get_finished_spans())

    assert export(collector, spans, "http") == SpanExportResult.SUCCESS

    got = stored(collector, trace_hex(spans), 2)
    for span in got.values():
        assert span["resource_attributes"]["host.note"] == "r" * 1000
        assert span["service_name"] == "limits-resource"
        assert marker(span["attributes"], "evalsi.truncated") == ["resource.host.note"]
    # counted once for each span stored with it
    assert wait_metric(collector, "evalsi_receiver_truncated_attributes_total", before + 2, **labels) - before == 2


# --- counts -----------------------------------------------------------------------------------------------------


def test_attributes_events_and_links_past_their_limits_are_dropped_and_marked(collector: Collector) -> None:
    counters = {
        "evalsi_receiver_dropped_attributes_total": {"receiver": "otlp", "signal": "traces"},
        "evalsi_receiver_dropped_events_total": {"receiver": "otlp"},
        "evalsi_receiver_dropped_links_total": {"receiver": "otlp"},
    }
    before = {name: metric(collector, name, **labels) for name, labels in counters.items()}
    linked = make_spans(lambda t: [t.start_span(f"linked-{i}").end() for i in range(5)], "limits-linked")

    def build(tracer: Any) -> None:
        with tracer.start_as_current_span("root"):
            with tracer.start_as_current_span("many-attributes") as span:
                for i in range(20):
                    span.set_attribute(f"app.a{i:02}", i)
            with tracer.start_as_current_span("eight-attributes") as span:
                for i in range(8):
                    span.set_attribute(f"app.a{i:02}", i)
            with tracer.start_as_current_span("many-events") as span:
                span.add_event("e0", {f"app.k{i:02}": i for i in range(12)})
                for i in range(1, 10):
                    span.add_event(f"e{i}")
            links = [Link(s.context, {"app.n": i}) for i, s in enumerate(linked)]
            with tracer.start_as_current_span("many-links", links=links):
                pass
            with tracer.start_as_current_span("three-links", links=links[:3]):
                pass

    spans = make_spans(build, "limits-counts")
    assert export(collector, spans, "http") == SpanExportResult.SUCCESS

    got = stored(collector, trace_hex(spans), 6)
    many = got["many-attributes"]["attributes"]
    assert {k for k in many if k.startswith("app.")} == {f"app.a{i:02}" for i in range(8)}  # the first 8, as sent
    assert marker(many, "evalsi.dropped") == ["attributes:12"]
    assert {k for k in got["eight-attributes"]["attributes"] if k.startswith("app.")} == {
        f"app.a{i:02}" for i in range(8)
    }
    events = got["many-events"]
    assert [e["name"] for e in events["events"]] == ["e0", "e1", "e2", "e3"]
    assert set(events["events"][0]["attributes"]) == {f"app.k{i:02}" for i in range(8)}
    assert sorted(marker(events["attributes"], "evalsi.dropped")) == ["events:6", "events[0].attributes:4"]
    many_links = got["many-links"]
    assert [ln["span_id"] for ln in many_links["links"]] == [format(s.context.span_id, "016x") for s in linked[:3]]
    assert marker(many_links["attributes"], "evalsi.dropped") == ["links:2"]
    for name in ("root", "eight-attributes", "three-links"):
        assert "evalsi.dropped" not in got[name]["attributes"], name
    assert len(got["three-links"]["links"]) == 3

    expected = {
        "evalsi_receiver_dropped_attributes_total": 12 + 4,
        "evalsi_receiver_dropped_events_total": 6,
        "evalsi_receiver_dropped_links_total": 2,
    }
    for name, labels in counters.items():
        after = wait_metric(collector, name, before[name] + expected[name], **labels)
        assert after - before[name] == expected[name], name


# --- spans per request ------------------------------------------------------------------------------------------


def many_spans(n: int, service: str) -> list[ReadableSpan]:
    def build(tracer: Any) -> None:
        with tracer.start_as_current_span("root"):
            for i in range(n - 1):
                tracer.start_span(f"child-{i}").end()

    return make_spans(build, service)


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_a_request_over_max_spans_per_request_is_refused_whole(collector: Collector, transport: str) -> None:
    refused = {"receiver": "otlp", "signal": "traces", "limit": "max_spans_per_request"}
    before = metric(collector, "evalsi_receiver_refused_requests_total", **refused)
    before_spans = metric(collector, "otelcol_receiver_refused_spans_total", receiver="otlp", transport=transport)
    too_many = many_spans(51, f"too-many-{transport}")

    assert export(collector, too_many, transport) == SpanExportResult.FAILURE  # not retried: a 400 / INVALID_ARGUMENT

    # what the sender is told
    body = encode_spans(too_many).SerializeToString()
    if transport == "http":
        r = httpx.post(collector.http + "/v1/traces", content=body, headers=PROTOBUF, timeout=10)
        assert r.status_code == 400
        status = status_of(r)
        message = status.message
        assert status.code == code_pb2.INVALID_ARGUMENT
        [violation] = bad_request_of(status).field_violations
        assert violation.reason == "TOO_MANY_SPANS"
    else:
        with grpc.insecure_channel(collector.grpc) as channel:
            call = channel.unary_unary(TRACE_EXPORT, request_serializer=None, response_deserializer=None)
            with pytest.raises(grpc.RpcError) as info:
                call(body, timeout=10)
        err: Any = info.value
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        message = err.details()
    assert "receivers.otlp.limits.max_spans_per_request" in message
    assert "51 spans" in message and "(50)" in message

    # at the limit: taken, every span stored
    at_limit = many_spans(50, f"at-limit-{transport}")
    assert export(collector, at_limit, transport) == SpanExportResult.SUCCESS
    assert len(stored(collector, trace_hex(at_limit), 50)) == 50
    # nothing of the refused request was stored
    assert httpx.get(f"{collector.api}/api/v1/traces/{trace_hex(too_many)}", timeout=10).status_code == 404
    assert metric(collector, "evalsi_receiver_refused_requests_total", **refused) - before == 2
    after_spans = metric(collector, "otelcol_receiver_refused_spans_total", receiver="otlp", transport=transport)
    assert after_spans - before_spans == 2 * 51


# --- the request's size, after decompression --------------------------------------------------------------------


def big_request(size: int) -> bytes:
    spans = make_spans(lambda t: t.start_span("big").end(), "limits-big")
    req = encode_spans(spans)
    kv = req.resource_spans[0].scope_spans[0].spans[0].attributes.add()
    kv.key, kv.value.string_value = "app.padding", "0" * size
    return req.SerializeToString()


def test_http_body_size_applies_after_decompression(collector: Collector) -> None:
    body = gzip.compress(big_request(MAX_BODY + 1024))
    assert len(body) < MAX_BODY // 100  # far under the limit as sent

    r = httpx.post(
        collector.http + "/v1/traces", content=body, headers={**PROTOBUF, "Content-Encoding": "gzip"}, timeout=10
    )

    assert r.status_code == 413
    assert f"decompressed body exceeds the limit of {MAX_BODY} bytes" in status_of(r).message


def test_grpc_message_size_applies_after_decompression(collector: Collector) -> None:
    body = big_request(MAX_MIB * 1024 * 1024 + 1024)
    assert len(gzip.compress(body)) < 64 * 1024

    with grpc.insecure_channel(collector.grpc) as channel:
        call = channel.unary_unary(TRACE_EXPORT, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as info:
            call(body, timeout=10, compression=grpc.Compression.Gzip)

    err: Any = info.value
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "decompressed message larger than max" in err.details().lower()


# --- log records: read back from the store once the collector has stopped -----------------------------------------


def make_log_records(n: int, attributes: Callable[[int], dict[str, Any]], service: str) -> list[Any]:
    memory = InMemoryLogRecordExporter()
    provider = LoggerProvider(resource=Resource.create({"service.name": service}))
    provider.add_log_record_processor(SimpleLogRecordProcessor(memory))
    logger = provider.get_logger("tests.limits")
    for i in range(n):
        logger.emit(ApiLogRecord(body=f"record {i}", attributes=attributes(i)))
    provider.shutdown()
    return list(memory.get_finished_logs())


@pytest.fixture(scope="module", params=[1, 2], ids=["in-process", "2-workers"])
def logs_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Log records sent to a collector with the module's limits: the answers, the counters, the stored rows."""
    tmp = tmp_path_factory.mktemp(f"limits-logs-{request.param}")
    store = tmp / "store"
    cfg = limited_config(store, request.param)
    for pipeline in cfg["service"]["pipelines"].values():
        pipeline["processors"] = []
    c = start_collector(tmp, cfg)
    run: dict[str, Any] = {}
    try:
        cut = make_log_records(
            3,
            lambda i: {"app.text": "t" * 3000, **{f"app.a{k}": k for k in range(9)}} if i == 0 else {"app.i": i},
            "limits-logs",
        )
        exporter = OTLPLogExporter(endpoint=c.http + "/v1/logs", timeout=10)
        run["cut"] = exporter.export(cut)
        run["too_many"] = exporter.export(make_log_records(21, lambda i: {"app.i": i}, "limits-logs-too-many"))
        run["at_limit"] = exporter.export(make_log_records(20, lambda i: {"app.i": i}, "limits-logs-at-limit"))
        exporter.shutdown()
        body = encode_logs(make_log_records(21, lambda i: {}, "limits-logs-raw")).SerializeToString()
        run["raw"] = httpx.post(c.http + "/v1/logs", content=body, headers=PROTOBUF, timeout=10)
        names = {
            "truncated": "evalsi_receiver_truncated_attributes_total",
            "dropped": "evalsi_receiver_dropped_attributes_total",
        }
        run["metrics"] = {k: wait_metric(c, v, 1, receiver="otlp", signal="logs") for k, v in names.items()}
        refused = {"receiver": "otlp", "signal": "logs", "limit": "max_log_records_per_request"}
        run["refused"] = metric(c, "evalsi_receiver_refused_requests_total", **refused)
        sent = wait_metric(c, "otelcol_exporter_sent_log_records_total", 23, timeout=30)
        assert sent == 23, f"{sent} log records stored, expected 3 + 20"
    finally:
        assert c.stop() == 0, c.log_path.read_text()[-3000:]
    backend = open_backend(f"chdb://{store}", create=False)
    try:
        run["rows"] = backend.query("SELECT ServiceName, Body, LogAttributes FROM otel_logs")
    finally:
        backend.close()
    return run


def test_log_record_attributes_are_cut_to_the_limits(logs_run: dict[str, Any]) -> None:
    assert logs_run["cut"] == LogRecordExportResult.SUCCESS
    rows = {r["Body"]: r for r in logs_run["rows"] if r["ServiceName"] == "limits-logs"}
    assert set(rows) == {"record 0", "record 1", "record 2"}
    attrs = dict(rows["record 0"]["LogAttributes"])
    # the first 6 attributes as sent, the long one truncated, and the markers
    assert {k for k in attrs if k.startswith("app.")} == {"app.text", *(f"app.a{k}" for k in range(5))}
    assert attrs["app.text"] == "t" * 1000
    assert json.loads(attrs["evalsi.truncated"]) == ["app.text"]
    assert json.loads(attrs["evalsi.dropped"]) == ["attributes:4"]
    for body in ("record 1", "record 2"):
        kept = dict(rows[body]["LogAttributes"])
        assert "evalsi.truncated" not in kept and "evalsi.dropped" not in kept
    assert logs_run["metrics"] == {"truncated": 1, "dropped": 4}


def test_a_request_over_max_log_records_per_request_is_refused_whole(logs_run: dict[str, Any]) -> None:
    assert logs_run["too_many"] == LogRecordExportResult.FAILURE
    assert logs_run["at_limit"] == LogRecordExportResult.SUCCESS
    r = logs_run["raw"]
    assert r.status_code == 400
    status = status_of(r)
    assert "receivers.otlp.limits.max_log_records_per_request" in status.message and "21 log records" in status.message
    assert bad_request_of(status).field_violations[0].reason == "TOO_MANY_LOG_RECORDS"
    services = [r["ServiceName"] for r in logs_run["rows"]]
    assert services.count("limits-logs-at-limit") == 20
    assert "limits-logs-too-many" not in services and "limits-logs-raw" not in services
    assert logs_run["refused"] == 2


# --- in-process: the two decoding modes cut alike ---------------------------------------------------------------

SMALL = Limits(
    max_attribute_value_length=10,
    max_attributes_per_span=3,
    max_events_per_span=2,
    max_links_per_span=1,
    max_attributes_per_log_record=2,
    max_spans_per_request=100,
    max_log_records_per_request=100,
)


def cut_request() -> ExportTraceServiceRequest:
    """Spans of several traces, some over each limit, in two resources (one with a long attribute)."""
    req = ExportTraceServiceRequest()
    for r in range(2):
        rs = req.resource_spans.add()
        kv = rs.resource.attributes.add()
        kv.key, kv.value.string_value = "service.name", f"svc-{r}"
        if r:
            kv = rs.resource.attributes.add()
            kv.key, kv.value.bytes_value = "app.blob", bytes(range(40))
        ss = rs.scope_spans.add()
        for i in range(12):
            s = ss.spans.add()
            s.trace_id = (r * 100 + i % 5 + 1).to_bytes(16, "big")
            s.span_id = (r * 100 + i + 1).to_bytes(8, "big")
            s.name = f"span-{r}-{i}"
            s.start_time_unix_nano, s.end_time_unix_nano = 1_000, 2_000
            for k in range(i % 5):
                kv = s.attributes.add()
                kv.key = f"k{k}"
                if k == 1:
                    kv.value.kvlist_value.values.add(key="inner", value={"string_value": "ü" * 9})
                else:
                    kv.value.string_value = "é" * (k + i)
            for e in range(i % 4):
                ev = s.events.add(name=f"e{e}", time_unix_nano=1_500)
                ev.attributes.add(key="text", value={"string_value": "z" * (8 + e)})
            for _ in range(i % 3):
                s.links.add(trace_id=s.trace_id, span_id=s.span_id)
    return req


def as_rows(batch: Any) -> dict[str, tuple[Any, ...]]:
    return {
        s.span_id: (s.attributes, s.resource_attributes, [(e.name, e.attributes) for e in s.events], len(s.links))
        for s in batch
    }


def test_workers_cut_exactly_as_full_decoding_does() -> None:
    body = cut_request().SerializeToString()
    full = limited(TRACES, SMALL).from_protobuf(body)
    assert full.cuts is not None and full.cuts.items > 0

    checked = checking_codec(limited(TRACES, SMALL), 3).from_protobuf(body)
    assert isinstance(checked.batch, EncodedBatch)
    assert split_limits(checked.batch.body)[0] == SMALL  # the limits travel with the request
    metrics, decoded = SelfMetrics(), {}
    for shard in range(3):
        mine = decode_encoded(checked.batch, (1 << shard, 3), metrics=metrics, log=logging.getLogger("t"))
        decoded.update(as_rows(mine))

    assert decoded == as_rows(full.batch)
    counted = {
        f.name: sum(s.value for s in f.samples)
        for f in metrics.registry.collect()
        if f.name.startswith("evalsi_receiver_") and f.name != "evalsi_receiver_refused_requests"
    }
    assert counted == {
        "evalsi_receiver_truncated_attributes": full.cuts.truncated,
        "evalsi_receiver_dropped_attributes": full.cuts.dropped_attributes,
        "evalsi_receiver_dropped_events": full.cuts.dropped_events,
        "evalsi_receiver_dropped_links": full.cuts.dropped_links,
    }
    assert full.cuts.truncated and full.cuts.dropped_attributes and full.cuts.dropped_events and full.cuts.dropped_links


def test_what_the_small_limits_cut_of_one_span() -> None:
    by_name = {s.name: s for s in limited(TRACES, SMALL).from_protobuf(cut_request().SerializeToString()).batch}
    span = by_name["span-1-4"]  # 4 attributes (k1 a map), 0 events, 1 link, in the resource with the long bytes
    assert span.attributes["k0"] == "é" * 4  # 8 bytes: kept
    assert span.attributes["k1"] == {"inner": "ü" * 5}  # 18 bytes cut to 10
    assert span.attributes["k2"] == "é" * 5  # 12 bytes: a character boundary at 10
    assert "k3" not in span.attributes
    assert span.resource_attributes["app.blob"] == bytes(range(10))
    assert sorted(span.attributes["evalsi.truncated"]) == ["k1", "k2", "resource.app.blob"]
    assert span.attributes["evalsi.dropped"] == ["attributes:1"]
    plain = by_name["span-0-0"]
    assert plain.attributes == {} and plain.resource_attributes == {"service.name": "svc-0"}


def one_span_request(build: Callable[[Any], None]) -> bytes:
    req = ExportTraceServiceRequest()
    s = req.resource_spans.add().scope_spans.add().spans.add(name="one", trace_id=b"\x01" * 16, span_id=b"\x02" * 8)
    s.attributes.add(key="short", value={"string_value": "ok"})
    build(s)
    return req.SerializeToString()


@pytest.mark.parametrize("where", ["event", "link", "array"])
def test_a_long_value_is_found_wherever_it_is(where: str) -> None:
    """The fast path looks at every value of a request larger than the limit: one only in an event, a link or an
    array element is found."""

    def build(s: Any) -> None:
        if where == "event":
            s.events.add(name="e").attributes.add(key="text", value={"string_value": "€" * 100})
        elif where == "link":
            s.links.add(trace_id=b"\x03" * 16, span_id=b"\x04" * 8).attributes.add(
                key="note", value={"bytes_value": b"\xff" * 300}
            )
        else:
            kv = s.attributes.add(key="list")
            kv.value.array_value.values.add(int_value=1)
            kv.value.array_value.values.add(string_value="y" * 300)

    limits = Limits(max_attribute_value_length=100)
    [span] = limited(TRACES, limits).from_protobuf(one_span_request(build)).batch
    expected = {"event": "events[0].text", "link": "links[0].note", "array": "list"}[where]
    assert span.attributes["evalsi.truncated"] == [expected]
    if where == "event":
        assert span.events[0].attributes["text"] == "€" * 33
    elif where == "link":
        assert span.links[0].attributes["note"] == b"\xff" * 100
    else:
        assert span.attributes["list"] == [1, "y" * 100]


def test_count_limits_apply_to_requests_smaller_than_the_value_limit() -> None:
    def build(s: Any) -> None:
        for i in range(5):
            s.attributes.add(key=f"k{i}", value={"int_value": i})
            s.events.add(name=f"e{i}")

    body = one_span_request(build)
    limits = Limits(max_attributes_per_span=4, max_events_per_span=3)
    assert len(body) < limits.max_attribute_value_length
    [span] = limited(TRACES, limits).from_protobuf(body).batch
    assert list(span.attributes) == ["short", "k0", "k1", "k2", "evalsi.dropped"]
    assert span.attributes["evalsi.dropped"] == ["attributes:2", "events:2"]
    assert [e.name for e in span.events] == ["e0", "e1", "e2"]

    def crowded_event(s: Any) -> None:  # the span's own counts within the limits: found after the fast decoding
        s.events.add(name="quiet")
        crowded = s.events.add(name="crowded")
        for i in range(7):
            crowded.attributes.add(key=f"a{i}", value={"bool_value": True})

    [span] = limited(TRACES, limits).from_protobuf(one_span_request(crowded_event)).batch
    assert span.attributes["evalsi.dropped"] == ["events[1].attributes:3"]
    assert list(span.events[1].attributes) == ["a0", "a1", "a2", "a3"]


def test_json_requests_are_cut_alike() -> None:
    req = cut_request()
    doc = json_format.MessageToDict(req)
    for rs in doc["resourceSpans"]:  # OTLP/JSON ids are hex
        for ss in rs["scopeSpans"]:
            for s in ss["spans"]:
                for key in ("traceId", "spanId"):
                    s[key] = base64.b64decode(s[key]).hex()
                for ln in s.get("links", []):
                    for key in ("traceId", "spanId"):
                        ln[key] = base64.b64decode(ln[key]).hex()
    from_json = limited(TRACES, SMALL).from_json(json.dumps(doc).encode())
    assert as_rows(from_json.batch) == as_rows(limited(TRACES, SMALL).from_protobuf(req.SerializeToString()).batch)


def test_log_records_are_cut_alike_in_both_modes() -> None:
    req = ExportLogsServiceRequest()
    records = req.resource_logs.add().scope_logs.add().log_records
    for i in range(6):
        r = records.add(trace_id=(i + 1).to_bytes(16, "big"), span_id=(i + 1).to_bytes(8, "big"))
        for k in range(i):
            r.attributes.add(key=f"k{k}", value={"string_value": "L" * (5 * k)})
    body = req.SerializeToString()
    full = limited(LOGS, SMALL).from_protobuf(body)
    checked = checking_codec(limited(LOGS, SMALL), 2).from_protobuf(body)
    assert isinstance(checked.batch, EncodedBatch)
    worker = [
        r
        for shard in range(2)
        for r in decode_encoded(checked.batch, (1 << shard, 2), metrics=SelfMetrics(), log=logging.getLogger("t"))
    ]
    assert {r.span_id: r.attributes for r in worker} == {r.span_id: r.attributes for r in full.batch}
    last = {r.span_id: r for r in full.batch}[(6).to_bytes(8, "big").hex()]
    assert last.attributes == {
        "k0": "",
        "k1": "LLLLL",
        "evalsi.dropped": ["attributes:3"],
    }
    assert full.cuts is not None and full.cuts.dropped_attributes == 1 + 2 + 3


def test_a_body_without_limits_decodes_with_the_defaults() -> None:
    """A request a worker gets without the receiver's limits (e.g. logged before them) is cut to the defaults."""
    req = cut_request()
    body = req.SerializeToString()
    limits, rest = split_limits(body)
    assert limits == Limits() and rest == body
    batch = decode_encoded(
        EncodedBatch("traces", body, 0, frozenset()), (1, 1), metrics=SelfMetrics(), log=logging.getLogger("t")
    )
    assert len(batch) == 24 and not any("evalsi.truncated" in s.attributes for s in batch)


def test_the_real_captures_lose_nothing_to_the_default_limits() -> None:
    files = sorted(FIXTURES.glob("*/*.pb"))
    assert len(files) >= 20
    for path in files:
        codec = LOGS if ".logs." in path.name else TRACES
        decoded = codec.from_protobuf(path.read_bytes())
        assert decoded.cuts is None, f"{path.relative_to(FIXTURES)}: {decoded.cuts}"
        assert len(decoded.batch) > 0, path


# --- config ------------------------------------------------------------------------------------------------------


def config_with(otlp: dict[str, Any], receiver: str = "otlp") -> dict[str, Any]:
    return {
        "receivers": {receiver: otlp},
        "exporters": {"clickhouse": None},
        "service": {"pipelines": {"traces": {"receivers": [receiver], "exporters": ["clickhouse"]}}},
    }


def config_errors(otlp: dict[str, Any], receiver: str = "otlp") -> list[str]:
    try:
        parse_config(config_with(otlp, receiver))
    except ConfigError as e:
        return list(e.errors)
    return []


@pytest.mark.parametrize("key", list(Limits.model_fields))
@pytest.mark.parametrize("value", [0, -1, True])
def test_a_limit_of_zero_negative_or_true_is_a_config_error_naming_the_key(key: str, value: Any) -> None:
    errors = config_errors({"limits": {key: value}})
    assert len(errors) == 1 and errors[0].startswith(f"receivers.otlp.limits.{key}: "), errors
    assert ("at least 1" in errors[0]) and (str(value) in errors[0] or value is True)


SIZES = [(("grpc", "max_recv_msg_size_mib"), 0), (("grpc", "max_recv_msg_size_mib"), -1)]
SIZES += [(("http", "max_request_body_size"), 0)]


@pytest.mark.parametrize("path,value", SIZES)
def test_a_request_size_limit_of_zero_or_less_is_a_config_error(path: tuple[str, str], value: int) -> None:
    errors = config_errors({"protocols": {path[0]: {path[1]: value}}})
    assert errors == [f"receivers.otlp.protocols.{path[0]}.{path[1]}: {_at_least_one_message(value)}"]


def test_a_grpc_message_size_grpc_cannot_take_is_a_config_error() -> None:
    assert config_errors({"protocols": {"grpc": {"max_recv_msg_size_mib": 2047}}}) == []
    assert config_errors({"protocols": {"grpc": {"max_recv_msg_size_mib": 2048}}}) == [
        "receivers.otlp.protocols.grpc.max_recv_msg_size_mib: must be at most 2047 (gRPC's largest message is "
        "2 GiB - 1 byte), got 2048"
    ]


def _at_least_one_message(value: int) -> str:
    return f"must be at least 1, got {value} (a limit cannot be switched off; raise it instead)"


def test_an_unknown_limit_and_a_named_receiver_are_reported_by_key_path() -> None:
    assert config_errors({"limits": {"max_attributes": 5}}) == ["receivers.otlp.limits.max_attributes: unknown key"]
    errors = config_errors({"limits": {"max_spans_per_request": 0}}, receiver="otlp/tenant")
    assert errors == [f"receivers.otlp/tenant.limits.max_spans_per_request: {_at_least_one_message(0)}"]


def test_evalsi_validate_names_the_key(tmp_path: Path) -> None:
    path = tmp_path / "evalsi.yaml"
    path.write_text(yaml.safe_dump(config_with({"limits": {"max_events_per_span": -5}})))
    res = subprocess.run([*EVALSI, "validate", "-c", str(path)], capture_output=True, text=True, timeout=120)
    assert res.returncode != 0
    assert "receivers.otlp.limits.max_events_per_span: must be at least 1, got -5" in res.stdout + res.stderr


# --- the doc -----------------------------------------------------------------------------------------------------


def test_the_doc_lists_every_limit_with_its_default() -> None:
    text = DOC.read_text()
    start = text.index("## Limits")
    section = text[start : text.index("\n## ", start + 1)]
    rows = dict(re.findall(r"^\| `(max_\w+)` \| `([\d_,]+)`", section, re.M))
    defaults = Limits()
    assert set(rows) == set(Limits.model_fields), rows
    for key, shown in rows.items():
        assert int(shown.replace(",", "").replace("_", "")) == getattr(defaults, key), key


def test_the_doc_examples_are_valid_configs() -> None:
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)]
    limited_blocks = [b for b in blocks if "limits" in str(b)]
    assert limited_blocks, "the doc shows a limits section"
    for block in blocks:
        parse_config(block)
