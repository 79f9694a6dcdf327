"""Backpressure through the OTLP receiver, in-process: a pipeline that refuses a batch makes the receiver answer
so that OTLP clients keep the data and retry (HTTP 429/503 + Retry-After, gRPC RESOURCE_EXHAUSTED/UNAVAILABLE
+ RetryInfo), and the real OpenTelemetry SDK exporter does retry.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
import httpx
from google.protobuf import json_format
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from evalsi.component import Next, Refused, Settings
from evalsi.model.span import SpanBatch
from evalsi.receivers.otlp import OtlpReceiver
from evalsi.receivers.otlp.config import OtlpReceiverConfig
from evalsi.runtime.telemetry import SelfMetrics

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
T = TypeVar("T")


class Refusing:
    """A next consumer that refuses the first `times` batches (all, by default), then takes the rest."""

    def __init__(self, *, retry_after: float = 3, unavailable: bool = False, times: int = 10**9) -> None:
        self.retry_after = retry_after
        self.unavailable = unavailable
        self.times = times
        self.calls: list[float] = []  # monotonic time of each batch offered
        self.taken: list[SpanBatch] = []

    async def consume(self, batch: SpanBatch) -> None:
        self.calls.append(time.monotonic())
        if len(self.calls) <= self.times:
            raise Refused("queue full", retry_after=self.retry_after, unavailable=self.unavailable)
        self.taken.append(batch)


def run_receiver(consumer: Refusing, client: Callable[[dict[str, str]], T]) -> tuple[T, SelfMetrics]:
    """Start an OtlpReceiver on free ports in a fresh loop, run the blocking `client(endpoints)` in a thread
    (so the receiver keeps serving), then shut the receiver down."""
    config = OtlpReceiverConfig.model_validate(
        {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}, "http": {"endpoint": "127.0.0.1:0"}}}
    )
    metrics = SelfMetrics()

    async def main() -> T:
        wired = Next()
        wired.traces = consumer
        receiver = OtlpReceiver(config, Settings(id="otlp", metrics=metrics, logger=logging.getLogger("t")), wired)
        await receiver.start()
        try:
            return await asyncio.to_thread(client, dict(receiver.endpoints))
        finally:
            await receiver.shutdown()

    return asyncio.run(main()), metrics


def two_spans() -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    ss = req.resource_spans.add().scope_spans.add()
    now = time.time_ns()
    for name in ("one", "two"):
        span = ss.spans.add()
        span.trace_id, span.span_id, span.name = os.urandom(16), os.urandom(8), name
        span.start_time_unix_nano, span.end_time_unix_nano = now, now + 1000
    return req


def refused_count(metrics: SelfMetrics, transport: str) -> float | None:
    labels = {"receiver": "otlp", "transport": transport}
    return metrics.registry.get_sample_value("otelcol_receiver_refused_spans_total", labels)


def accepted_count(metrics: SelfMetrics, transport: str) -> float | None:
    labels = {"receiver": "otlp", "transport": transport}
    return metrics.registry.get_sample_value("otelcol_receiver_accepted_spans_total", labels)


def retry_delay_s(status: status_pb2.Status) -> float:
    infos = [d for d in status.details if d.Is(error_details_pb2.RetryInfo.DESCRIPTOR)]
    assert len(infos) == 1, status
    info = error_details_pb2.RetryInfo()
    infos[0].Unpack(info)
    return info.retry_delay.ToNanoseconds() / 1e9


# --- HTTP -----------------------------------------------------------------------------------------


def post_both_encodings(endpoints: dict[str, str]) -> list[httpx.Response]:
    req = two_spans()
    # OTLP/JSON: hex ids, one span
    body_json = b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"%s","spanId":"%s","name":"j"}]}]}]}' % (
        os.urandom(16).hex().encode(),
        os.urandom(8).hex().encode(),
    )
    url = f"http://{endpoints['http']}/v1/traces"
    with httpx.Client(timeout=10) as c:
        return [
            c.post(url, content=req.SerializeToString(), headers={"content-type": PROTOBUF}),
            c.post(url, content=body_json, headers={"content-type": JSON}),
        ]


def http_status(resp: httpx.Response, media: str) -> status_pb2.Status:
    assert resp.headers["content-type"].split(";")[0] == media
    status = status_pb2.Status()
    if media == JSON:
        json_format.Parse(resp.text, status)
    else:
        status.ParseFromString(resp.content)
    return status


def test_http_queue_full_is_429_with_retry_after() -> None:
    consumer = Refusing(retry_after=3)

    (pb, js), metrics = run_receiver(consumer, post_both_encodings)

    for resp, media in ((pb, PROTOBUF), (js, JSON)):
        assert resp.status_code == 429, media
        assert resp.headers["retry-after"] == "3"
        status = http_status(resp, media)
        assert status.code == code_pb2.RESOURCE_EXHAUSTED
        assert status.message == "queue full"
        assert retry_delay_s(status) == 3
    assert len(consumer.calls) == 2 and not consumer.taken
    # refused by the pipeline: counted as refused, not accepted (2 spans + 1 span)
    assert refused_count(metrics, "http") == 3
    assert accepted_count(metrics, "http") == 0


def test_http_unavailable_is_503_with_retry_after() -> None:
    consumer = Refusing(retry_after=3, unavailable=True)

    (pb, js), metrics = run_receiver(consumer, post_both_encodings)

    for resp, media in ((pb, PROTOBUF), (js, JSON)):
        assert resp.status_code == 503, media
        assert resp.headers["retry-after"] == "3"
        status = http_status(resp, media)
        assert status.code == code_pb2.UNAVAILABLE
        assert status.message == "queue full"
    assert refused_count(metrics, "http") == 3


def test_http_retry_after_is_whole_seconds_at_least_one() -> None:
    """Retry-After (RFC 9110) is a whole number of seconds; a sub-second delay must not become 0."""
    consumer = Refusing(retry_after=0.2)

    (pb, _), _ = run_receiver(consumer, post_both_encodings)

    assert pb.status_code == 429
    assert pb.headers["retry-after"] == "1"
    assert retry_delay_s(http_status(pb, PROTOBUF)) == 0.2  # RetryInfo keeps the precise delay


# --- gRPC -----------------------------------------------------------------------------------------


def grpc_export(endpoints: dict[str, str]) -> grpc.RpcError:
    with grpc.insecure_channel(endpoints["grpc"]) as channel:
        try:
            TraceServiceStub(channel).Export(two_spans(), timeout=10)
        except grpc.RpcError as e:
            return e
    raise AssertionError("the export was accepted")


def grpc_status(err: Any) -> status_pb2.Status:
    details = dict(err.trailing_metadata())["grpc-status-details-bin"]
    return status_pb2.Status.FromString(details)


def test_grpc_queue_full_is_resource_exhausted_with_retry_info() -> None:
    consumer = Refusing(retry_after=3)

    err, metrics = run_receiver(consumer, grpc_export)

    e: Any = err
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert e.details() == "queue full"
    status = grpc_status(e)
    # RetryInfo is what tells an OTLP client RESOURCE_EXHAUSTED is worth retrying
    assert status.code == code_pb2.RESOURCE_EXHAUSTED
    assert status.message == "queue full"
    assert retry_delay_s(status) == 3
    assert refused_count(metrics, "grpc") == 2
    assert accepted_count(metrics, "grpc") == 0


def test_grpc_unavailable_with_retry_info() -> None:
    consumer = Refusing(retry_after=3, unavailable=True)

    err, metrics = run_receiver(consumer, grpc_export)

    e: Any = err
    assert e.code() == grpc.StatusCode.UNAVAILABLE
    status = grpc_status(e)
    assert status.code == code_pb2.UNAVAILABLE
    assert retry_delay_s(status) == 3
    assert refused_count(metrics, "grpc") == 2


# --- the real OpenTelemetry SDK exporter ----------------------------------------------------------


def sdk_spans(names: list[str]) -> list[Any]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "sdk-backpressure"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("tests.backpressure")
    for name in names:
        with tracer.start_as_current_span(name):
            pass
    provider.shutdown()
    return list(memory.get_finished_spans())


def test_sdk_exporter_retries_after_429_and_delivers() -> None:
    consumer = Refusing(retry_after=1, times=1)  # refuse once, then take
    spans = sdk_spans(["first", "second"])

    def export(endpoints: dict[str, str]) -> SpanExportResult:
        exporter = OTLPSpanExporter(endpoint=f"http://{endpoints['http']}/v1/traces", timeout=8)
        try:
            return exporter.export(spans)
        finally:
            exporter.shutdown()

    result, metrics = run_receiver(consumer, export)

    assert result == SpanExportResult.SUCCESS
    assert len(consumer.calls) == 2
    # the SDK honoured Retry-After: 1 rather than retrying at once
    assert consumer.calls[1] - consumer.calls[0] >= 0.9
    [batch] = consumer.taken
    assert sorted(s.name for s in batch) == ["first", "second"]
    assert {s.trace_id for s in batch} == {format(s.context.trace_id, "032x") for s in spans}
    assert {s.service_name for s in batch} == {"sdk-backpressure"}
    assert refused_count(metrics, "http") == 2
    assert accepted_count(metrics, "http") == 2


def test_sdk_exporter_gives_up_when_retry_after_exceeds_its_timeout() -> None:
    """Retry-After: 3 against a 1 s export timeout: the SDK reports failure instead of waiting past it."""
    consumer = Refusing(retry_after=3)
    spans = sdk_spans(["dropped"])

    def export(endpoints: dict[str, str]) -> tuple[SpanExportResult, float]:
        exporter = OTLPSpanExporter(endpoint=f"http://{endpoints['http']}/v1/traces", timeout=1)
        t0 = time.monotonic()
        try:
            return exporter.export(spans), time.monotonic() - t0
        finally:
            exporter.shutdown()

    (result, elapsed), _ = run_receiver(consumer, export)

    assert result == SpanExportResult.FAILURE
    assert len(consumer.calls) == 1  # no retry sooner than the server asked
    assert elapsed < 2.5
