"""OTLP/gRPC against a real `evalsi serve`, with the real grpc client and the generated TraceService stub.

One collector for the module (its gRPC receiver limited to 1 MiB messages); every bad call is followed by a
good one that must be stored.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from prometheus_client.parser import text_string_to_metric_families
from running_collector import FIXTURES, Collector, serve_config, start_collector

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
MAX_MIB = 1


def new_trace_id() -> bytes:
    return os.urandom(16)


def new_span_id() -> bytes:
    return os.urandom(8)


def request(*spans: tuple[bytes, bytes, str], padding: str = "") -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    kv = rs.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", "otlp-grpc-test"
    ss = rs.scope_spans.add()
    ss.scope.name = "tests.otlp_grpc"
    now = time.time_ns()
    for trace_id, span_id, name in spans:
        span = ss.spans.add()
        span.trace_id, span.span_id, span.name = trace_id, span_id, name
        span.kind = 1
        span.start_time_unix_nano, span.end_time_unix_nano = now, now + 1_000_000
        if padding:
            attr = span.attributes.add()
            attr.key, attr.value.string_value = "padding", padding
    return req


class Grpc:
    def __init__(self, collector: Collector) -> None:
        self.collector = collector
        self.channel = grpc.insecure_channel(collector.grpc)
        self.stub = TraceServiceStub(self.channel)
        self.expected = 0

    def wait_stored(self, added: int) -> None:
        self.expected += added
        got = self.collector.wait_stored(self.expected)
        assert got == self.expected, f"store holds {got} spans, expected {self.expected}"

    def follow_up(self, trace_id: bytes) -> str:
        """Right after a bad call: a good one on the same channel is taken and stored."""
        span_id = new_span_id()
        resp = self.stub.Export(request((trace_id, span_id, "after-bad-call")), timeout=10)
        assert not resp.HasField("partial_success")
        self.wait_stored(1)
        return span_id.hex()

    def assert_trace_holds_only(self, trace_id: bytes, span_ids: list[str]) -> None:
        res = self.collector.cli("traces", "show", trace_id.hex(), "--json")
        assert sorted(s["span_id"] for s in json.loads(res.stdout)["spans"]) == sorted(span_ids)


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collector]:
    tmp = tmp_path_factory.mktemp("otlp_grpc")
    cfg = serve_config(tmp / "store")
    cfg["receivers"]["otlp"]["protocols"]["grpc"]["max_recv_msg_size_mib"] = MAX_MIB
    c = start_collector(tmp, cfg)
    yield c
    c.stop()


@pytest.fixture(scope="module")
def client(collector: Collector) -> Iterator[Grpc]:
    g = Grpc(collector)
    yield g
    g.channel.close()


def fixture_request(name: str) -> tuple[ExportTraceServiceRequest, str, list[str]]:
    req = ExportTraceServiceRequest()
    req.ParseFromString((FIXTURES / name).read_bytes())
    spans = [s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
    [trace_id] = {s.trace_id.hex() for s in spans}
    return req, trace_id, [s.name for s in spans]


def stored_names(collector: Collector, trace_id: str) -> list[str]:
    resp = httpx.get(f"{collector.api}/api/v1/traces/{trace_id}", timeout=10)
    assert resp.status_code == 200, resp.text
    return sorted(s["name"] for s in resp.json()["spans"])


def test_fixture_accepted_and_stored(client: Grpc, collector: Collector) -> None:
    req, trace_id, names = fixture_request("otel-openai-v2/chat_tools.pb")

    resp = client.stub.Export(req, timeout=10)

    assert isinstance(resp, ExportTraceServiceResponse)
    assert not resp.HasField("partial_success")  # full success leaves it unset
    client.wait_stored(len(names))
    assert stored_names(collector, trace_id) == sorted(names)


def test_gzip_compressed_call_accepted(client: Grpc, collector: Collector) -> None:
    req, trace_id, names = fixture_request("openinference/chat_tools.pb")

    resp = client.stub.Export(req, timeout=10, compression=grpc.Compression.Gzip)

    assert not resp.HasField("partial_success")
    client.wait_stored(len(names))
    assert stored_names(collector, trace_id) == sorted(names)


def test_partial_success_for_bad_trace_id(client: Grpc) -> None:
    trace_id, good = new_trace_id(), new_span_id()
    req = request((os.urandom(15), new_span_id(), "bad-trace-id"), (trace_id, good, "good"))

    resp = client.stub.Export(req, timeout=10)

    assert resp.partial_success.rejected_spans == 1
    assert "'bad-trace-id': trace id must be 16 bytes, got 15" in resp.partial_success.error_message
    client.wait_stored(1)
    client.assert_trace_holds_only(trace_id, [good.hex(), client.follow_up(trace_id)])


def test_garbage_bytes_are_invalid_argument(client: Grpc) -> None:
    raw = client.channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
    trace_id = new_trace_id()
    truncated = request((trace_id, new_span_id(), "truncated")).SerializeToString()[:-7]
    followed = []
    for body in (b"\xff\xff\xff\xff", truncated):
        with pytest.raises(grpc.RpcError) as info:
            raw(body, timeout=10)

        err: Any = info.value
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT  # not retryable, per the spec's table
        assert "not a valid OTLP ExportTraceServiceRequest protobuf" in err.details()
        followed.append(client.follow_up(trace_id))
    client.assert_trace_holds_only(trace_id, followed)


def test_message_over_max_recv_size_is_refused(client: Grpc) -> None:
    trace_id = new_trace_id()
    req = request((trace_id, new_span_id(), "too-big"), padding="x" * (MAX_MIB * 1024 * 1024 + 1))

    with pytest.raises(grpc.RpcError) as info:
        client.stub.Export(req, timeout=10)

    err: Any = info.value
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max" in err.details().lower()
    # no RetryInfo: the spec says a client must then treat RESOURCE_EXHAUSTED as not retryable
    assert "grpc-status-details-bin" not in dict(err.trailing_metadata() or ())
    client.assert_trace_holds_only(trace_id, [client.follow_up(trace_id)])


def test_metrics_count_grpc_spans(client: Grpc, collector: Collector) -> None:
    def counts() -> dict[tuple[str, str], float]:
        out = {}
        for family in text_string_to_metric_families(httpx.get(collector.metrics, timeout=10).text):
            for s in family.samples:
                if s.name.startswith("otelcol_receiver_") and s.labels.get("receiver") == "otlp":
                    out[(s.name, s.labels["transport"])] = s.value
        return out

    before = counts()
    t = new_trace_id()
    resp = client.stub.Export(
        request((t, new_span_id(), "a"), (t, new_span_id(), "b"), (t, bytes(8), "zero-span-id")), timeout=10
    )
    assert resp.partial_success.rejected_spans == 1
    client.wait_stored(2)
    after = counts()

    accepted, refused = "otelcol_receiver_accepted_spans_total", "otelcol_receiver_refused_spans_total"
    assert after[(accepted, "grpc")] - before.get((accepted, "grpc"), 0) == 2
    assert after[(refused, "grpc")] - before.get((refused, "grpc"), 0) == 1
    assert after.get((accepted, "http"), 0) == before.get((accepted, "http"), 0)
