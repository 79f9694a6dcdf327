"""The `otlp` exporter against real OTLP receivers: gRPC LogsService/TraceService and HTTP /v1/logs, official protos."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import code_pb2
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from pydantic import ValidationError
from running_collector import serve_config, start_collector

from evalsi.component import REGISTRY, Settings
from evalsi.exporters.otlp import OtlpExporter, OtlpExporterConfig
from evalsi.exporters.otlp_encode import traces_request
from evalsi.model.score import Score, ScoreBatch
from evalsi.model.span import BatchKind, Span, SpanBatch, SpanLink
from evalsi.processors.normalize import normalize_span
from evalsi.receivers.otlp.decode import any_value, decode_traces_protobuf
from evalsi.receivers.otlp.status import status_message
from evalsi.runtime.telemetry import SelfMetrics

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TRACE = "0af7651916cd43dd8448eb211c80319c"
SPAN = "b7ad6b7169203331"
TS = 1_700_000_000_123_456_789
FAST_RETRY = {"initial_interval": "10ms", "max_interval": "50ms", "max_elapsed_time": "5s"}


# --- the receivers --------------------------------------------------------------------------------


class Script:
    """What a receiver answers: the failures first, in order, then OK; and every request that got OK.

    Like a backend that validates its data, it refuses a whole request (HTTP 400, gRPC INVALID_ARGUMENT) holding an
    item (log record or span) `refuse` is true for, and takes a request holding items `reject` is true for but leaves
    those out and says how many in the answer's `partial_success`."""

    def __init__(
        self,
        failures: list[str] | None = None,
        refuse: Callable[[Any], bool] | None = None,
        reject: Callable[[Any], bool] | None = None,
    ) -> None:
        self.failures = list(failures or [])
        self.refuse = refuse
        self.reject = reject
        self.attempts = 0
        self.bodies: list[bytes] = []  # every request, refused or not, as sent
        self.logs: list[logs_service_pb2.ExportLogsServiceRequest] = []
        self.traces: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.headers: list[dict[str, str]] = []

    def next_failure(self) -> str | None:
        self.attempts += 1
        return self.failures.pop(0) if self.failures else None

    def judge(self, request: Any) -> tuple[bool, int]:
        """Whether to refuse the whole request, else how many items to reject (removed from `request`)."""
        self.bodies.append(request.SerializeToString())
        if self.refuse is not None and any(self.refuse(item) for _, item in items_of(request)):
            return True, 0
        rejected = 0
        if self.reject is not None:
            for container, item in items_of(request):
                if self.reject(item):
                    container.remove(item)
                    rejected += 1
        return False, rejected


def items_of(request: Any) -> list[tuple[Any, Any]]:
    """(container, item) of every log record or span of an OTLP request."""
    if isinstance(request, logs_service_pb2.ExportLogsServiceRequest):
        return [(sl.log_records, r) for rl in request.resource_logs for sl in rl.scope_logs for r in sl.log_records]
    return [(ss.spans, s) for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]


def answer(request: Any, rejected: int) -> Any:
    if isinstance(request, logs_service_pb2.ExportLogsServiceRequest):
        reply = logs_service_pb2.ExportLogsServiceResponse()
        if rejected:
            reply.partial_success.rejected_log_records = rejected
    else:
        reply = trace_service_pb2.ExportTraceServiceResponse()
        if rejected:
            reply.partial_success.rejected_spans = rejected
    if rejected:
        reply.partial_success.error_message = "score value is not a finite number"
    return reply


class GrpcReceiver(logs_service_pb2_grpc.LogsServiceServicer, trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, script: Script, options: list[tuple[str, Any]] | None = None) -> None:
        self.script = script
        self.server = grpc.aio.server(options=options)
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(self, self.server)
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    async def _answer(self, context: grpc.aio.ServicerContext) -> None:
        self.script.headers.append(dict(context.invocation_metadata() or ()))
        failure = self.script.next_failure()
        if failure == "unavailable":
            details = status_message(code_pb2.UNAVAILABLE, "busy", retry_after=0.02).SerializeToString()
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, "busy", trailing_metadata=(("grpc-status-details-bin", details),)
            )
        if failure == "exhausted":  # no RetryInfo: permanent, per the OTLP spec
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "quota")
        if failure == "throttled":
            details = status_message(code_pb2.RESOURCE_EXHAUSTED, "slow down", retry_after=0.5).SerializeToString()
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "slow down",
                trailing_metadata=(("grpc-status-details-bin", details),),
            )
        if failure == "invalid":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad request")

    async def Export(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._answer(context)
        refused, rejected = self.script.judge(request)
        if refused:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a record is invalid")
        if isinstance(request, logs_service_pb2.ExportLogsServiceRequest):
            self.script.logs.append(request)
        else:
            self.script.traces.append(request)
        return answer(request, rejected)


class HttpReceiver:
    def __init__(self, script: Script) -> None:
        self.script = script
        script_ = script

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                script_.headers.append({k.lower(): v for k, v in self.headers.items()})
                failure = script_.next_failure()
                if failure == "unavailable":
                    self._reply(503, {"Retry-After": "0"})
                    return
                if failure == "throttled":
                    self._reply(429, {"Retry-After": "1"})
                    return
                if failure == "invalid":
                    self._reply(400)
                    return
                assert self.headers["Content-Type"] == "application/x-protobuf"
                request: Any
                if self.path == "/v1/logs":
                    request = logs_service_pb2.ExportLogsServiceRequest.FromString(body)
                elif self.path == "/v1/traces":
                    request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                else:
                    self._reply(404)
                    return
                refused, rejected = script_.judge(request)
                if refused:
                    self._reply(400)
                    return
                (script_.logs if self.path == "/v1/logs" else script_.traces).append(request)
                self._reply(200, body=answer(request, rejected).SerializeToString())

            def _reply(self, code: int, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def http_receiver() -> Iterator[HttpReceiver]:
    r = HttpReceiver(Script())
    yield r
    r.stop()


# --- helpers --------------------------------------------------------------------------------------


def make_exporter(**config: Any) -> tuple[OtlpExporter, SelfMetrics]:
    metrics = SelfMetrics()
    settings = Settings(id="otlp", metrics=metrics, logger=logging.getLogger("evalsi.exporter.otlp.test"))
    config.setdefault("retry_on_failure", FAST_RETRY)
    config.setdefault("flush_interval", "20ms")
    return OtlpExporter(OtlpExporterConfig.model_validate(config), settings), metrics


def metric(metrics: SelfMetrics, name: str) -> float:
    return metrics.registry.get_sample_value(name, {"exporter": "otlp"}) or 0.0


def refused(metrics: SelfMetrics, kind: str, reason: str) -> float:
    labels = {"exporter": "otlp", "kind": kind, "reason": reason}
    return metrics.registry.get_sample_value("evalsi_exporter_items_refused_total", labels) or 0.0


def scores() -> list[Score]:
    def placed(s: Score, **kw: Any) -> Score:
        return replace(
            s, trace_id=TRACE, span_id=SPAN, policy="support-quality", evaluator="judge.relevance",
            timestamp_unix_nano=TS, **kw,
        )  # fmt: skip

    return [
        placed(
            Score("relevance", value=0.8, passed=True, explanation="answers the question"),
            metadata={"gen_ai.response.id": "chatcmpl-123"},
        ),
        placed(Score("tone", label="polite", value=1.0, passed=True)),
        placed(Score("groundedness", passed=False)),
        placed(Score.skipped("toxicity", "no content")),
        placed(Score.error("faithfulness", "timeout", "judge timed out after 30s")),
    ]


EXPECTED = [
    {
        "gen_ai.evaluation.name": "relevance",
        "gen_ai.evaluation.score.value": 0.8,
        "gen_ai.evaluation.score.label": "pass",
        "gen_ai.evaluation.explanation": "answers the question",
        "gen_ai.response.id": "chatcmpl-123",
        "evalsi.policy": "support-quality",
        "evalsi.evaluator": "judge.relevance",
        "evalsi.outcome": "scored",
    },
    {
        "gen_ai.evaluation.name": "tone",
        "gen_ai.evaluation.score.value": 1.0,
        "gen_ai.evaluation.score.label": "polite",
        "evalsi.policy": "support-quality",
        "evalsi.evaluator": "judge.relevance",
        "evalsi.outcome": "scored",
    },
    {
        "gen_ai.evaluation.name": "groundedness",
        "gen_ai.evaluation.score.label": "fail",
        "evalsi.policy": "support-quality",
        "evalsi.evaluator": "judge.relevance",
        "evalsi.outcome": "scored",
    },
    {
        "gen_ai.evaluation.name": "toxicity",
        "evalsi.policy": "support-quality",
        "evalsi.evaluator": "judge.relevance",
        "evalsi.outcome": "skipped",
        "evalsi.reason": "no content",
    },
    {
        "gen_ai.evaluation.name": "faithfulness",
        "gen_ai.evaluation.explanation": "judge timed out after 30s",
        "error.type": "timeout",
        "evalsi.policy": "support-quality",
        "evalsi.evaluator": "judge.relevance",
        "evalsi.outcome": "error",
    },
]


def assert_evaluation_records(requests: list[logs_service_pb2.ExportLogsServiceRequest]) -> None:
    assert len(requests) == 1
    (rl,) = requests[0].resource_logs
    assert {kv.key: any_value(kv.value) for kv in rl.resource.attributes} == {"service.name": "evalsi"}
    (sl,) = rl.scope_logs
    assert sl.scope.name == "evalsi"
    records = list(sl.log_records)
    assert len(records) == len(EXPECTED)
    for record, expected in zip(records, EXPECTED, strict=True):
        assert record.event_name == "gen_ai.evaluation.result"
        assert record.trace_id.hex() == TRACE
        assert record.span_id.hex() == SPAN
        assert record.time_unix_nano == TS
        assert record.observed_time_unix_nano == TS
        error = expected["evalsi.outcome"] == "error"
        assert record.severity_text == ("WARN" if error else "INFO")
        assert record.severity_number == (13 if error else 9)
        assert not record.HasField("body")
        assert {kv.key: any_value(kv.value) for kv in record.attributes} == expected
        # the value is a double, as the convention types it
        for kv in record.attributes:
            if kv.key == "gen_ai.evaluation.score.value":
                assert kv.value.WhichOneof("value") == "double_value"


async def wait_for(check: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out waiting for the receiver"
        await asyncio.sleep(0.01)


# --- config ---------------------------------------------------------------------------------------


def test_registered_for_traces_and_scores() -> None:
    factory = REGISTRY[("exporter", "otlp")]
    assert factory.cls is OtlpExporter
    assert factory.signals == ("traces", "scores")


def test_config_defaults_and_errors_name_the_key() -> None:
    c = OtlpExporterConfig(endpoint="collector:4317")
    assert (c.protocol, c.compression, c.timeout, c.insecure) == ("grpc", "gzip", 5.0, True)
    assert OtlpExporterConfig(endpoint="https://otel.example.com").insecure is False
    assert OtlpExporterConfig(endpoint="http://otel:4318", protocol="http/protobuf").insecure is True
    assert OtlpExporterConfig(endpoint="https://x", tls={"insecure": True}).insecure is True
    with pytest.raises(ValidationError, match="endpoint"):
        OtlpExporterConfig(endpoint="ftp://x")
    with pytest.raises(ValidationError, match="protocol"):
        OtlpExporterConfig(endpoint="x:1", protocol="http/json")
    with pytest.raises(ValidationError, match="queue_size"):
        OtlpExporterConfig(endpoint="x:1", queue_size=0)
    with pytest.raises(ValidationError, match=r"retry_on_failure\.max_elapsed"):
        OtlpExporterConfig(endpoint="x:1", retry_on_failure={"max_elapsed": "1s"})


# --- scores as gen_ai.evaluation.result -----------------------------------------------------------


@pytest.mark.parametrize("compression", ["gzip", "none"])
def test_grpc_receiver_gets_every_field_of_the_evaluation_records(compression: str) -> None:
    async def run() -> None:
        script = Script()
        receiver = GrpcReceiver(script)
        await receiver.server.start()
        exp, metrics = make_exporter(
            endpoint=f"127.0.0.1:{receiver.port}", compression=compression, headers={"X-Tenant": "acme"}
        )
        await exp.start()
        await exp.consume_scores(ScoreBatch(scores()))
        await exp.shutdown()
        await receiver.server.stop(None)
        assert_evaluation_records(script.logs)
        assert script.headers[0]["x-tenant"] == "acme"
        assert metric(metrics, "otelcol_exporter_sent_log_records_total") == 5
        assert metric(metrics, "otelcol_exporter_send_failed_log_records_total") == 0
        assert metric(metrics, "otelcol_exporter_queue_size") == 0

    asyncio.run(run())


def test_http_receiver_gets_every_field_of_the_evaluation_records(http_receiver: HttpReceiver) -> None:
    async def run() -> None:
        exp, metrics = make_exporter(
            endpoint=f"http://127.0.0.1:{http_receiver.port}", protocol="http/protobuf", headers={"X-Tenant": "acme"}
        )
        await exp.start()
        await exp.consume_scores(ScoreBatch(scores()))
        await exp.shutdown()
        assert_evaluation_records(http_receiver.script.logs)
        assert http_receiver.script.headers[0]["x-tenant"] == "acme"
        assert http_receiver.script.headers[0]["content-encoding"] == "gzip"
        assert metric(metrics, "otelcol_exporter_sent_log_records_total") == 5

    asyncio.run(run())


def test_batches_by_batch_size() -> None:
    async def run() -> None:
        script = Script()
        receiver = GrpcReceiver(script)
        await receiver.server.start()
        exp, metrics = make_exporter(endpoint=f"127.0.0.1:{receiver.port}", batch_size=2)
        await exp.start()
        await exp.consume_scores(ScoreBatch(scores()))
        await exp.shutdown()
        await receiver.server.stop(None)
        sizes = [len(r.resource_logs[0].scope_logs[0].log_records) for r in script.logs]
        assert sizes == [2, 2, 1]
        assert metric(metrics, "otelcol_exporter_sent_log_records_total") == 5

    asyncio.run(run())


# --- retries --------------------------------------------------------------------------------------


def test_grpc_unavailable_twice_then_ok_is_delivered_once() -> None:
    async def run() -> None:
        script = Script(["unavailable", "unavailable"])
        receiver = GrpcReceiver(script)
        await receiver.server.start()
        exp, metrics = make_exporter(endpoint=f"127.0.0.1:{receiver.port}")
        await exp.start()
        await exp.consume_scores(ScoreBatch(scores()))
        await wait_for(lambda: script.logs)
        await exp.shutdown()
        await receiver.server.stop(None)
        assert script.attempts == 3
        assert_evaluation_records(script.logs)
        assert metric(metrics, "otelcol_exporter_sent_log_records_total") == 5
        assert metric(metrics, "otelcol_exporter_send_failed_log_records_total") == 0

    asyncio.run(run())


def test_http_503_twice_then_ok_is_delivered_once(http_receiver: HttpReceiver) -> None:
    http_receiver.script.failures = ["unavailable", "unavailable"]

    async def run() -> None:
        exp, metrics = make_exporter(endpoint=f"http://127.0.0.1:{http_receiver.port}", protocol="http/protobuf")
        await exp.start()
        await exp.consume_scores(ScoreBatch(scores()))
        await wait_for(lambda: http_receiver.script.logs)
        await exp.shutdown()
        assert http_receiver.script.attempts == 3
        assert_evaluation_records(http_receiver.script.logs)
        assert metric(metrics, "otelcol_exporter_sent_log_records_total") == 5

    asyncio.run(run())


def test_http_400_is_never_retried_as_is_and_each_refused_score_is_counted(http_receiver: HttpReceiver) -> None:
    http_receiver.script.refuse = lambda record: True  # a backend that takes none of them

    async def run() -> None:
        exp, metrics = make_exporter(endpoint=f"http://127.0.0.1:{http_receiver.port}", protocol="http/protobuf")
        await exp.start()
        await exp.consume_scores(ScoreBatch(scores()))
        await wait_for(lambda: metric(metrics, "otelcol_exporter_send_failed_log_records_total") == 5)
        await asyncio.sleep(0.1)  # time enough for a retry that must not come
        await exp.shutdown()
        # halves until each score is alone: 2n - 1 requests, none sent twice as it was
        assert http_receiver.script.attempts == 9
        assert len(set(http_receiver.script.bodies)) == 9
        assert http_receiver.script.logs == []
        assert metric(metrics, "otelcol_exporter_sent_log_records_total") == 0
        assert refused(metrics, "scores", "invalid") == 5

    asyncio.run(run())


def test_http_429_waits_as_long_as_retry_after_says(http_receiver: HttpReceiver) -> None:
    http_receiver.script.failures = ["throttled"]

    async def run() -> None:
        exp, _ = make_exporter(endpoint=f"http://127.0.0.1:{http_receiver.port}", protocol="http/protobuf")
        await exp.start()
        started = time.monotonic()
        await exp.consume_scores(ScoreBatch(scores()))
        await wait_for(lambda: http_receiver.script.logs)
        assert time.monotonic() - started >= 0.95  # not the 10 ms backoff
        await exp.shutdown()
        assert http_receiver.script.attempts == 2

    asyncio.run(run())


@pytest.mark.parametrize(("failure", "attempts", "sent"), [("throttled", 2, 5), ("exhausted", 1, 0)])
def test_grpc_resource_exhausted_is_retried_only_with_retry_info(failure: str, attempts: int, sent: int) -> None:
    async def run() -> None:
        script = Script([failure])
        receiver = GrpcReceiver(script)
        await receiver.server.start()
        exp, metrics = make_exporter(endpoint=f"127.0.0.1:{receiver.port}")
        await exp.start()
        started = time.monotonic()
        await exp.consume_scores(ScoreBatch(scores()))
        await exp.shutdown()
        await receiver.server.stop(None)
        assert script.attempts == attempts
        assert metric(metrics, "otelcol_exporter_sent_log_records_total") == sent
        assert metric(metrics, "otelcol_exporter_send_failed_log_records_total") == 5 - sent
        if sent:
            assert time.monotonic() - started >= 0.45  # RetryInfo's delay, not the 10 ms backoff

    asyncio.run(run())


def test_grpc_invalid_argument_is_not_retried_as_is_but_split() -> None:
    async def run() -> None:
        script = Script(["invalid"])  # the whole batch refused once: its halves pass
        receiver = GrpcReceiver(script)
        await receiver.server.start()
        exp, metrics = make_exporter(endpoint=f"127.0.0.1:{receiver.port}")
        await exp.start()
        await exp.consume_scores(ScoreBatch(scores()))
        await exp.shutdown()
        await receiver.server.stop(None)
        assert script.attempts == 3
        assert [len(items_of(r)) for r in script.logs] == [2, 3]
        assert script.bodies[0] not in script.bodies[1:]  # never sent again as it was
        assert metric(metrics, "otelcol_exporter_sent_log_records_total") == 5
        assert metric(metrics, "otelcol_exporter_send_failed_log_records_total") == 0

    asyncio.run(run())


# --- one bad item never blocks the others ---------------------------------------------------------


def not_finite(record: Any) -> bool:
    """A record a backend that validates its data refuses: a score value that is NaN or infinite."""
    return any(kv.key == "gen_ai.evaluation.score.value" and not math.isfinite(kv.value.double_value)
               for kv in record.attributes)  # fmt: skip


def good_and_poison(n: int = 7, at: int = 3) -> tuple[list[Score], Score]:
    good = [replace(scores()[0], name=f"check-{i}", value=i / 10) for i in range(n)]
    poison = replace(scores()[0], name="poison", value=float("nan"))
    return [*good[:at], poison, *good[at:]], poison


def received_names(requests: list[Any]) -> list[str]:
    return [
        {kv.key: any_value(kv.value) for kv in record.attributes}["gen_ai.evaluation.name"]
        for req in requests
        for _, record in items_of(req)
    ]


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_score_the_backend_refuses_is_dropped_alone_and_the_others_arrive(
    protocol: str, http_receiver: HttpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    async def run() -> None:
        receiver: GrpcReceiver | None = None
        if protocol == "grpc":
            receiver = GrpcReceiver(Script(refuse=not_finite))
            await receiver.server.start()
            endpoint, script = f"127.0.0.1:{receiver.port}", receiver.script
        else:
            http_receiver.script.refuse = not_finite
            endpoint, script = f"http://127.0.0.1:{http_receiver.port}", http_receiver.script
        batch, poison = good_and_poison()
        exp, metrics = make_exporter(endpoint=endpoint, protocol=protocol, batch_size=8)
        await exp.start()
        started = time.monotonic()
        await exp.consume_scores(ScoreBatch(batch))
        await wait_for(lambda: metric(metrics, "otelcol_exporter_send_failed_log_records_total") == 1)
        took = time.monotonic() - started
        await exp.shutdown()
        if receiver is not None:
            await receiver.server.stop(None)
        assert sorted(received_names(script.logs)) == sorted(s.name for s in batch if s is not poison)
        assert metric(metrics, "otelcol_exporter_sent_log_records_total") == 7
        assert refused(metrics, "scores", "invalid") == 1
        # 8 -> 4 + 4 -> 2 + 2 -> 1 + 1: seven requests, none retried as it was, no backoff waited
        assert script.attempts == 7
        assert len(set(script.bodies)) == 7
        assert took < 1.0
        assert exp.held == 0

    with caplog.at_level(logging.ERROR, logger="evalsi.exporter.otlp.test"):
        asyncio.run(run())
    [logged] = [r for r in caplog.records if "refused" in r.getMessage()]
    assert (logged.trace_id, logged.span_id, logged.score, logged.reason) == (TRACE, SPAN, "poison", "invalid")


def test_a_score_too_large_for_a_grpc_backend_is_dropped_alone() -> None:
    async def run() -> None:
        # the server's own limit: gRPC answers RESOURCE_EXHAUSTED "Received message larger than max"
        receiver = GrpcReceiver(Script(), options=[("grpc.max_receive_message_length", 4096)])
        await receiver.server.start()
        batch, _ = good_and_poison()
        huge = replace(batch[0], name="huge", explanation="x" * 10_000)
        exp, metrics = make_exporter(endpoint=f"127.0.0.1:{receiver.port}", compression="none")
        await exp.start()
        await exp.consume_scores(ScoreBatch([*batch[:4], huge, *batch[4:]]))
        await exp.shutdown()
        await receiver.server.stop(None)
        assert sorted(received_names(receiver.script.logs)) == sorted(s.name for s in batch)
        assert refused(metrics, "scores", "too large") == 1
        assert metric(metrics, "otelcol_exporter_sent_log_records_total") == len(batch)

    asyncio.run(run())


def test_a_score_that_cannot_be_encoded_is_left_out_alone(http_receiver: HttpReceiver) -> None:
    async def run() -> None:
        good = scores()
        bad_id = replace(good[0], name="bad-id", trace_id="not-hex")
        bad_text = replace(good[0], name="bad-text", explanation="half a surrogate pair \ud800")
        exp, metrics = make_exporter(endpoint=f"http://127.0.0.1:{http_receiver.port}", protocol="http/protobuf")
        await exp.start()
        await exp.consume_scores(ScoreBatch([bad_id, *good[:2], bad_text, *good[2:]]))
        await exp.shutdown()
        assert_evaluation_records(http_receiver.script.logs)  # every good one, in one request
        assert http_receiver.script.attempts == 1
        assert refused(metrics, "scores", "encode") == 2
        assert metric(metrics, "otelcol_exporter_send_failed_log_records_total") == 2
        assert metric(metrics, "otelcol_exporter_sent_log_records_total") == 5

    asyncio.run(run())


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_partial_success_counts_the_rejected_scores(protocol: str, http_receiver: HttpReceiver) -> None:
    async def run() -> None:
        receiver: GrpcReceiver | None = None
        if protocol == "grpc":
            receiver = GrpcReceiver(Script(reject=not_finite))
            await receiver.server.start()
            endpoint, script = f"127.0.0.1:{receiver.port}", receiver.script
        else:
            http_receiver.script.reject = not_finite
            endpoint, script = f"http://127.0.0.1:{http_receiver.port}", http_receiver.script
        batch, poison = good_and_poison()
        exp, metrics = make_exporter(endpoint=endpoint, protocol=protocol)
        await exp.start()
        await exp.consume_scores(ScoreBatch(batch))
        await exp.shutdown()
        if receiver is not None:
            await receiver.server.stop(None)
        assert script.attempts == 1  # per the OTLP spec, a partial success is not retried
        assert sorted(received_names(script.logs)) == sorted(s.name for s in batch if s is not poison)
        assert metric(metrics, "otelcol_exporter_sent_log_records_total") == 7
        assert metric(metrics, "otelcol_exporter_send_failed_log_records_total") == 1
        assert refused(metrics, "scores", "partial success") == 1

    asyncio.run(run())


def test_a_span_the_backend_refuses_or_that_cannot_be_encoded_is_dropped_alone(http_receiver: HttpReceiver) -> None:
    spans = [
        s for scenario in ("chat_tools", "chat_simple", "chat_error") for s in fixture_spans("otel-openai-v2", scenario)
    ]
    refused_span, unencodable = spans[1], spans[4]
    refused_span.attributes = {**refused_span.attributes, "poison": True}
    unencodable.attributes = {**unencodable.attributes, "too.big": 2**70}  # not an int64
    http_receiver.script.refuse = lambda span: any(kv.key == "poison" for kv in span.attributes)

    async def run() -> None:
        exp, metrics = make_exporter(endpoint=f"http://127.0.0.1:{http_receiver.port}", protocol="http/protobuf")
        await exp.start()
        await exp.consume(SpanBatch(spans))
        await exp.shutdown()
        got = [
            s
            for req in http_receiver.script.traces
            for s in decode_traces_protobuf(req.SerializeToString()).batch.spans
        ]
        assert sorted((s.trace_id, s.span_id) for s in got) == sorted(
            (s.trace_id, s.span_id) for s in spans if s not in (refused_span, unencodable)
        )
        assert refused(metrics, "spans", "invalid") == 1
        assert refused(metrics, "spans", "encode") == 1
        assert metric(metrics, "otelcol_exporter_sent_spans_total") == len(spans) - 2
        assert metric(metrics, "otelcol_exporter_send_failed_spans_total") == 2

    asyncio.run(run())


def test_the_sender_survives_an_unexpected_error_and_says_so(
    http_receiver: HttpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    class Flaky(asyncio.Event):
        """The sender loop's wake-up event, failing once: a bug outside any one send."""

        failed = False

        def clear(self) -> None:
            if not Flaky.failed:
                Flaky.failed = True
                raise RuntimeError("a bug in the loop")
            super().clear()

    async def run() -> None:
        exp, metrics = make_exporter(endpoint=f"http://127.0.0.1:{http_receiver.port}", protocol="http/protobuf")
        exp._queue._senders[0].wake = Flaky()
        real_send = exp._send
        calls = 0

        async def send_failing_once(queue: Any, chunk: list[Any]) -> None:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("a bug in one send")
            await real_send(queue, chunk)

        exp._send = send_failing_once  # type: ignore[method-assign]
        await exp.start()
        await exp.consume_scores(ScoreBatch(scores()[:2]))  # lost to the bug in one send, and counted
        await wait_for(lambda: metric(metrics, "evalsi_exporter_sender_errors_total") == 2)
        await exp.consume_scores(ScoreBatch(scores()))
        await wait_for(lambda: http_receiver.script.logs)
        await exp.shutdown()
        assert_evaluation_records(http_receiver.script.logs)
        assert metric(metrics, "otelcol_exporter_send_failed_log_records_total") == 2
        assert metric(metrics, "otelcol_exporter_sent_log_records_total") == 5

    with caplog.at_level(logging.ERROR, logger="evalsi.exporter.otlp.test"):
        asyncio.run(run())
    tracebacks = [r.exc_text or "" for r in caplog.records if r.exc_info]
    assert any("a bug in the loop" in t for t in tracebacks)
    assert any("a bug in one send" in t for t in tracebacks)


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_dead_endpoint_never_blocks_consume(protocol: str) -> None:
    async def run() -> None:
        # port 1 on loopback: nothing listens, every attempt fails and is retried
        endpoint = "127.0.0.1:1" if protocol == "grpc" else "http://127.0.0.1:1"
        exp, metrics = make_exporter(
            endpoint=endpoint, protocol=protocol, queue_size=100, batch_size=10, shutdown_timeout="300ms",
            retry_on_failure={"initial_interval": "50ms", "max_interval": "200ms", "max_elapsed_time": "1m"},
        )  # fmt: skip
        await exp.start()
        slowest = 0.0
        for _ in range(50):
            started = time.perf_counter()
            await exp.consume_scores(ScoreBatch(scores()))
            slowest = max(slowest, time.perf_counter() - started)
            await asyncio.sleep(0.002)  # let the sender run between batches, as ingest would
        assert slowest < 0.05
        assert exp.held <= 100
        # the queue kept the newest and dropped (and counted) the oldest
        dropped = metric(metrics, "otelcol_exporter_enqueue_failed_log_records_total")
        assert dropped >= 250 - 100 - 10
        started = time.perf_counter()
        await exp.shutdown()
        assert time.perf_counter() - started < 2.0
        failed = metric(metrics, "otelcol_exporter_send_failed_log_records_total")
        assert dropped + failed == 250
        assert metric(metrics, "otelcol_exporter_sent_log_records_total") == 0

    asyncio.run(run())


# --- spans tee-through ----------------------------------------------------------------------------


def fixture_spans(folder: str, scenario: str) -> list[Span]:
    decoded = decode_traces_protobuf((FIXTURES / folder / f"{scenario}.pb").read_bytes())
    assert decoded.rejected == 0
    return decoded.batch.spans


@pytest.mark.parametrize(
    ("folder", "scenario"),
    [("otel-openai-v2", "chat_tools"), ("otel-openai-v2-latest", "chat_tools"), ("openinference", "chat_tools")],
)
def test_spans_round_trip_through_the_encoder(folder: str, scenario: str) -> None:
    assert (FIXTURES / folder / f"{scenario}.pb").exists(), f"the {folder}/{scenario}.pb capture is missing"
    original = fixture_spans(folder, scenario)
    body = traces_request(original).SerializeToString()
    again = decode_traces_protobuf(body)
    assert again.rejected == 0
    assert again.batch.spans == original  # every OTLP field: ids, times, status, events, links, resource, scope
    for a, b in zip(original, again.batch.spans, strict=True):
        normalize_span(a)
        normalize_span(b)
        assert a.canonical() == b.canonical()


def test_encoder_keeps_links_status_and_all_value_types() -> None:
    (span,) = fixture_spans("otel-openai-v2", "chat_simple")[:1]
    span.links = [SpanLink("5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174", "k=v", {"n": 1})]
    span.status_code, span.status_message = "ERROR", "boom"
    span.attributes = {
        "s": "x", "b": True, "i": 7, "f": 1.5, "bytes": b"\x00\x01", "list": ["a", 2], "map": {"k": {"n": None}},
    }  # fmt: skip
    again = decode_traces_protobuf(traces_request([span]).SerializeToString())
    assert again.batch.spans == [span]


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_tee_through_forwards_sampled_spans_only(protocol: str, http_receiver: HttpReceiver) -> None:
    async def run() -> None:
        receiver: GrpcReceiver | None = None
        if protocol == "grpc":
            receiver = GrpcReceiver(Script())
            await receiver.server.start()
            endpoint, script = f"127.0.0.1:{receiver.port}", receiver.script
        else:
            endpoint, script = f"http://127.0.0.1:{http_receiver.port}", http_receiver.script
        spans = fixture_spans("otel-openai-v2", "chat_tools")
        spans[0].sampled = False
        exp, metrics = make_exporter(endpoint=endpoint, protocol=protocol)
        await exp.start()
        await exp.consume(SpanBatch(spans))
        await exp.consume(SpanBatch(fixture_spans("otel-openai-v2", "chat_simple"), kind=BatchKind.SESSION))
        await exp.consume(SpanBatch(spans[1:], revision=True))
        await exp.shutdown()
        if receiver is not None:
            await receiver.server.stop(None)
        received = [s for req in script.traces for s in decode_traces_protobuf(req.SerializeToString()).batch.spans]
        for s in spans:
            s.sampled = True  # the flag is evalsi's, not OTLP's: compare the rest
        assert received == spans[1:]
        assert metric(metrics, "otelcol_exporter_sent_spans_total") == len(spans) - 1

    asyncio.run(run())


# --- end to end: `evalsi serve` evaluates, the otlp exporter forwards -------------------------------

POLICY = """
apiVersion: evals.si/v1alpha1
kind: OnlineEvalPolicy
metadata: {name: support-answers}
spec:
  selector: span.attributes['gen_ai.operation.name'] == 'chat'
  sampling: {rate: 1.0}
  cascade:
    - ref: builtin/contains
      params: {any: [Paris]}
"""


def test_serve_sends_scores_and_spans_to_an_otlp_backend(tmp_path: Path, http_receiver: HttpReceiver) -> None:
    (tmp_path / "support.yaml").write_text(POLICY)
    cfg = serve_config(tmp_path / "store")
    cfg["processors"]["tail_sampling"] = {"decision_wait": "300ms"}
    cfg["processors"]["evaluate"] = {"policies": ["support.yaml"]}
    cfg["exporters"]["otlp"] = {
        "endpoint": f"http://127.0.0.1:{http_receiver.port}",
        "protocol": "http/protobuf",
        "flush_interval": "50ms",
    }
    pipelines = cfg["service"]["pipelines"]
    pipelines["traces"]["processors"] = ["normalize", "tail_sampling", "evaluate"]
    pipelines["traces"]["exporters"] = ["clickhouse", "otlp"]
    pipelines["scores"] = {"exporters": ["otlp"]}
    c = start_collector(tmp_path, cfg)
    try:
        provider = TracerProvider(resource=Resource.create({"service.name": "support"}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=c.http + "/v1/traces")))
        with provider.get_tracer("support.app").start_as_current_span("chat gpt-4o-mini") as chat:
            chat.set_attribute("gen_ai.operation.name", "chat")
            chat.set_attribute("gen_ai.request.model", "gpt-4o-mini")
            reply = [{"role": "assistant", "parts": [{"type": "text", "content": "Paris."}]}]
            chat.set_attribute("gen_ai.output.messages", json.dumps(reply))
            trace_id = format(chat.get_span_context().trace_id, "032x")
            span_id = format(chat.get_span_context().span_id, "016x")
        assert provider.force_flush(10_000)
        provider.shutdown()
        script = http_receiver.script
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (script.logs and script.traces):
            time.sleep(0.1)
    finally:
        assert c.stop() == 0
    records = [r for req in script.logs for rl in req.resource_logs for sl in rl.scope_logs for r in sl.log_records]
    assert len(records) == 1
    (record,) = records
    assert record.event_name == "gen_ai.evaluation.result"
    assert (record.trace_id.hex(), record.span_id.hex()) == (trace_id, span_id)
    attrs = {kv.key: any_value(kv.value) for kv in record.attributes}
    assert attrs["gen_ai.evaluation.name"] == "contains"
    assert attrs["gen_ai.evaluation.score.label"] == "pass"
    assert attrs["evalsi.policy"] == "support-answers"
    assert attrs["evalsi.evaluator"] == "builtin/contains"
    assert attrs["evalsi.outcome"] == "scored"
    forwarded = [s for req in script.traces for s in decode_traces_protobuf(req.SerializeToString()).batch.spans]
    assert [(s.trace_id, s.span_id, s.name, s.service_name) for s in forwarded] == [
        (trace_id, span_id, "chat gpt-4o-mini", "support")
    ]
