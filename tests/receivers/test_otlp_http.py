"""OTLP/HTTP against a real `evalsi serve`: what the OTLP spec asks of a server, and that a bad request never
breaks the next one.

One collector serves the whole module (with a 64 KiB `max_request_body_size`, so the 413 cases are cheap);
every test follows each bad request with a valid one and checks, through `evalsi traces show --json`, that
the valid span was stored and nothing of the bad request was.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import zstandard
from google.protobuf import json_format
from google.rpc import code_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from prometheus_client.parser import text_string_to_metric_families
from running_collector import FIXTURES, Collector, serve_config, start_collector

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
LIMIT = 64 * 1024  # max_request_body_size of this module's collector


# --- building requests ----------------------------------------------------------------------------


def new_trace_id() -> bytes:
    return os.urandom(16)


def new_span_id() -> bytes:
    return os.urandom(8)


@dataclass
class SpanSpec:
    trace_id: bytes
    span_id: bytes
    name: str
    padding: str = ""  # a large attribute, to make the request big


def pb_request(*spans: SpanSpec) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    kv = rs.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", "otlp-http-test"
    ss = rs.scope_spans.add()
    ss.scope.name = "tests.otlp_http"
    now = time.time_ns()
    for s in spans:
        span = ss.spans.add()
        span.trace_id, span.span_id, span.name = s.trace_id, s.span_id, s.name
        span.kind = 1
        span.start_time_unix_nano, span.end_time_unix_nano = now, now + 1_000_000
        if s.padding:
            attr = span.attributes.add()
            attr.key, attr.value.string_value = "padding", s.padding
    return req


def json_request(*spans: dict[str, Any]) -> dict[str, Any]:
    """OTLP/JSON as the spec writes it: hex ids, integer enums, int64 as strings."""
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "otlp-http-test"}}]},
                "scopeSpans": [{"scope": {"name": "tests.otlp_http"}, "spans": list(spans)}],
            }
        ]
    }


def json_span(trace_id_hex: str, span_id_hex: str, name: str) -> dict[str, Any]:
    now = time.time_ns()
    return {
        "traceId": trace_id_hex,
        "spanId": span_id_hex,
        "name": name,
        "kind": 1,
        "startTimeUnixNano": str(now),
        "endTimeUnixNano": str(now + 1_000_000),
    }


def status_of(resp: httpx.Response, media: str) -> status_pb2.Status:
    """The google.rpc.Status of an error answer, decoded in the content type it must come in."""
    assert resp.headers["content-type"].split(";")[0].strip() == media, resp.headers
    status = status_pb2.Status()
    if media == JSON:
        json_format.Parse(resp.text, status)
    else:
        status.ParseFromString(resp.content)
    return status


def export_response_of(resp: httpx.Response, media: str) -> ExportTraceServiceResponse:
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].split(";")[0].strip() == media, resp.headers
    out = ExportTraceServiceResponse()
    if media == JSON:
        json_format.Parse(resp.text, out)
    else:
        out.ParseFromString(resp.content)
    return out


# --- the collector and what it stored -------------------------------------------------------------


class Ingest:
    """One keep-alive connection to the receiver, and how many spans the store should hold by now."""

    def __init__(self, collector: Collector) -> None:
        self.collector = collector
        self.client = httpx.Client(base_url=collector.http, timeout=30)
        self.expected = 0

    def post(self, body: bytes, media: str, **headers: str) -> httpx.Response:
        return self.client.post("/v1/traces", content=body, headers={"content-type": media, **headers})

    def stored_trace(self, trace_id: bytes | str) -> list[dict[str, Any]]:
        tid = trace_id if isinstance(trace_id, str) else trace_id.hex()
        res = self.collector.cli("traces", "show", tid, "--json")
        return json.loads(res.stdout)["spans"]

    def wait_stored(self, added: int) -> None:
        """`added` more spans are expected; exactly that many must arrive (an invalid span stored would show)."""
        self.expected += added
        got = self.collector.wait_stored(self.expected)
        assert got == self.expected, f"store holds {got} spans, expected {self.expected}"

    def assert_still_ingesting(self, trace_id: bytes, *, refused_span: bytes | None = None) -> None:
        """A valid request right after a bad one is taken and stored; the bad request's span is not."""
        span_id = new_span_id()
        resp = self.post(pb_request(SpanSpec(trace_id, span_id, "after-bad-request")).SerializeToString(), PROTOBUF)
        assert not export_response_of(resp, PROTOBUF).HasField("partial_success")
        self.wait_stored(1)
        spans = self.stored_trace(trace_id)
        assert [s["span_id"] for s in spans] == [span_id.hex()]
        assert spans[0]["name"] == "after-bad-request"
        if refused_span is not None:
            assert refused_span.hex() not in {s["span_id"] for s in spans}


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collector]:
    """This module's own collector: the test config with a 64 KiB request limit."""
    tmp = tmp_path_factory.mktemp("otlp_http")
    cfg = serve_config(tmp / "store")
    cfg["receivers"]["otlp"]["protocols"]["http"]["max_request_body_size"] = LIMIT
    c = start_collector(tmp, cfg)
    yield c
    c.stop()


@pytest.fixture(scope="module")
def ingest(collector: Collector) -> Iterator[Ingest]:
    ing = Ingest(collector)
    yield ing
    ing.client.close()


def receiver_counts(collector: Collector) -> dict[tuple[str, str], float]:
    """(metric, transport) -> value of the otlp receiver's span counters on /metrics."""
    text = httpx.get(collector.metrics, timeout=10).text
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in ("otelcol_receiver_accepted_spans_total", "otelcol_receiver_refused_spans_total"):
                assert s.labels["receiver"] == "otlp"
                out[(s.name, s.labels["transport"])] = s.value
    return out


def fixture_trace(path: Path) -> tuple[str, list[str]]:
    """The one trace id of a fixture file and its span names."""
    req = ExportTraceServiceRequest()
    if path.suffix == ".json":
        doc = json.loads(path.read_bytes())
        spans = [s for rs in doc["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
        ids = {s["traceId"].lower() for s in spans}
        names = [s["name"] for s in spans]
    else:
        req.ParseFromString(path.read_bytes())
        spans = [s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
        ids = {s.trace_id.hex() for s in spans}
        names = [s.name for s in spans]
    assert len(ids) == 1, path
    return ids.pop(), names


# --- accepted -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "media", "encoding"),
    [
        ("otel-openai-v2/chat_tools.pb", PROTOBUF, ""),
        ("openinference/chat_tools.json", JSON, ""),
        ("openllmetry-0.54/chat_simple.pb", PROTOBUF, "gzip"),
        ("mlflow/chat_simple.json", JSON, "gzip"),
        ("openlit/embeddings.pb", PROTOBUF, "zstd"),
    ],
)
def test_fixture_accepted_and_stored(ingest: Ingest, fixture: str, media: str, encoding: str) -> None:
    path = FIXTURES / fixture
    trace_id, names = fixture_trace(path)
    body = path.read_bytes()
    headers = {}
    if encoding == "gzip":
        body = gzip.compress(body)
        headers["content-encoding"] = "gzip"
    elif encoding == "zstd":
        body = zstandard.ZstdCompressor().compress(body)
        headers["content-encoding"] = "zstd"

    resp = ingest.post(body, media, **headers)

    # full success: 200, the response in the request's encoding, partial_success left unset
    assert not export_response_of(resp, media).HasField("partial_success")
    ingest.wait_stored(len(names))
    stored = ingest.stored_trace(trace_id)
    assert sorted(s["name"] for s in stored) == sorted(names)


def test_content_type_with_charset_parameter_is_json(ingest: Ingest) -> None:
    trace_id, span_id = new_trace_id(), new_span_id()
    body = json.dumps(json_request(json_span(trace_id.hex(), span_id.hex(), "charset"))).encode()
    resp = ingest.post(body, "application/json; charset=utf-8")
    assert not export_response_of(resp, JSON).HasField("partial_success")
    ingest.wait_stored(1)
    assert [s["span_id"] for s in ingest.stored_trace(trace_id)] == [span_id.hex()]


def test_upper_case_hex_ids_are_accepted(ingest: Ingest) -> None:
    """The spec: traceId/spanId are case-insensitive hex."""
    trace_id, span_id = new_trace_id(), new_span_id()
    body = json.dumps(json_request(json_span(trace_id.hex().upper(), span_id.hex().upper(), "upper"))).encode()
    assert not export_response_of(ingest.post(body, JSON), JSON).HasField("partial_success")
    ingest.wait_stored(1)
    assert [s["span_id"] for s in ingest.stored_trace(trace_id)] == [span_id.hex()]


# --- bad data: 400 with a Status saying what is wrong ---------------------------------------------


def test_malformed_protobuf_is_400_with_protobuf_status(ingest: Ingest) -> None:
    trace_id, span_id = new_trace_id(), new_span_id()
    whole = pb_request(SpanSpec(trace_id, span_id, "truncated")).SerializeToString()

    resp = ingest.post(whole[:-7], PROTOBUF)  # cut inside the span: not a message any more

    assert resp.status_code == 400
    status = status_of(resp, PROTOBUF)
    assert status.code == code_pb2.INVALID_ARGUMENT
    assert "not a valid OTLP ExportTraceServiceRequest protobuf" in status.message
    ingest.assert_still_ingesting(trace_id, refused_span=span_id)


@pytest.mark.parametrize(
    ("mangle", "expected"),
    [
        (lambda text: text[:-5], "body is not valid JSON"),  # truncated
        (lambda text: re.sub(r'"startTimeUnixNano": "\d+"', '"startTimeUnixNano": "soon"', text), "startTimeUnixNano"),
        (lambda text: text.replace('"resourceSpans": [', '"resourceSpans": ["x", '), "not a valid OTLP/JSON"),
    ],
    ids=["truncated", "bad-int64", "wrong-shape"],
)
def test_malformed_json_is_400_with_json_status(ingest: Ingest, mangle: Any, expected: str) -> None:
    trace_id, span_id = new_trace_id(), new_span_id()
    text = json.dumps(json_request(json_span(trace_id.hex(), span_id.hex(), "malformed")))
    bad = mangle(text)
    assert bad != text

    resp = ingest.post(bad.encode(), JSON)

    assert resp.status_code == 400
    status = status_of(resp, JSON)
    assert status.code == code_pb2.INVALID_ARGUMENT
    assert expected in status.message
    ingest.assert_still_ingesting(trace_id, refused_span=span_id)


def test_not_a_json_object_is_400(ingest: Ingest) -> None:
    resp = ingest.post(b"[1, 2, 3]", JSON)
    assert resp.status_code == 400
    assert "must be a JSON object" in status_of(resp, JSON).message
    ingest.assert_still_ingesting(new_trace_id())


def test_body_not_matching_its_encoding_is_400(ingest: Ingest) -> None:
    trace_id, span_id = new_trace_id(), new_span_id()
    body = pb_request(SpanSpec(trace_id, span_id, "not-gzip")).SerializeToString()

    resp = ingest.post(body, PROTOBUF, **{"content-encoding": "gzip"})

    assert resp.status_code == 400
    assert "not valid gzip" in status_of(resp, PROTOBUF).message
    ingest.assert_still_ingesting(trace_id, refused_span=span_id)


def test_unsupported_content_encoding_is_400(ingest: Ingest) -> None:
    trace_id, span_id = new_trace_id(), new_span_id()
    body = pb_request(SpanSpec(trace_id, span_id, "brotli")).SerializeToString()

    resp = ingest.post(body, PROTOBUF, **{"content-encoding": "br"})

    assert resp.status_code == 400
    assert "unsupported content encoding 'br'" in status_of(resp, PROTOBUF).message
    ingest.assert_still_ingesting(trace_id, refused_span=span_id)


# --- wrong content type, wrong method -------------------------------------------------------------


@pytest.mark.parametrize("media", ["text/plain", "application/protobuf", ""])
def test_wrong_content_type_is_415(ingest: Ingest, media: str) -> None:
    trace_id, span_id = new_trace_id(), new_span_id()
    body = pb_request(SpanSpec(trace_id, span_id, "wrong-type")).SerializeToString()

    resp = ingest.client.post("/v1/traces", content=body, headers={"content-type": media} if media else {})

    assert resp.status_code == 415
    status = status_of(resp, JSON)
    assert PROTOBUF in status.message and JSON in status.message  # says what to send instead
    assert (repr(media) if media else "(none)") in status.message
    ingest.assert_still_ingesting(trace_id, refused_span=span_id)


def test_get_is_405_with_allow_post(ingest: Ingest) -> None:
    resp = ingest.client.get("/v1/traces")

    assert resp.status_code == 405
    assert resp.headers["allow"] == "POST"
    assert "use POST" in status_of(resp, JSON).message
    ingest.assert_still_ingesting(new_trace_id())


# --- too large: 413, before and after decompression -----------------------------------------------


def test_body_over_limit_is_413(ingest: Ingest) -> None:
    trace_id, span_id = new_trace_id(), new_span_id()
    body = pb_request(SpanSpec(trace_id, span_id, "too-big", padding=os.urandom(LIMIT).hex())).SerializeToString()
    assert len(body) > LIMIT

    resp = ingest.post(body, PROTOBUF)

    assert resp.status_code == 413
    status = status_of(resp, PROTOBUF)
    assert f"exceeds the limit of {LIMIT} bytes" in status.message
    ingest.assert_still_ingesting(trace_id, refused_span=span_id)


def test_chunked_body_over_limit_is_413(ingest: Ingest) -> None:
    """No Content-Length to trust: the limit must hold while reading the stream."""
    trace_id, span_id = new_trace_id(), new_span_id()
    body = pb_request(SpanSpec(trace_id, span_id, "too-big-chunked", padding=os.urandom(LIMIT).hex()))
    data = body.SerializeToString()

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(data), 16 * 1024):
            yield data[i : i + 16 * 1024]

    resp = ingest.client.post("/v1/traces", content=chunks(), headers={"content-type": PROTOBUF})

    assert resp.request.headers.get("transfer-encoding") == "chunked"
    assert resp.status_code == 413
    assert f"exceeds the limit of {LIMIT} bytes" in status_of(resp, PROTOBUF).message
    ingest.assert_still_ingesting(trace_id, refused_span=span_id)


@pytest.mark.parametrize(("encoding", "media"), [("gzip", PROTOBUF), ("zstd", JSON)])
def test_compression_bomb_is_413(ingest: Ingest, encoding: str, media: str) -> None:
    """Small on the wire, over the limit once inflated."""
    trace_id, span_id = new_trace_id(), new_span_id()
    padding = "a" * (LIMIT * 50)
    if media == PROTOBUF:
        raw = pb_request(SpanSpec(trace_id, span_id, "bomb", padding=padding)).SerializeToString()
    else:
        span = json_span(trace_id.hex(), span_id.hex(), "bomb")
        span["attributes"] = [{"key": "padding", "value": {"stringValue": padding}}]
        raw = json.dumps(json_request(span)).encode()
    body = gzip.compress(raw) if encoding == "gzip" else zstandard.ZstdCompressor().compress(raw)
    assert len(body) < LIMIT < len(raw)

    resp = ingest.post(body, media, **{"content-encoding": encoding})

    assert resp.status_code == 413
    assert f"decompressed body exceeds the limit of {LIMIT} bytes" in status_of(resp, media).message
    ingest.assert_still_ingesting(trace_id, refused_span=span_id)


def test_compressed_body_just_under_limit_when_inflated_is_accepted(ingest: Ingest) -> None:
    """The limit applies to the inflated size, and a body that fits is not cut short."""
    trace_id, span_id = new_trace_id(), new_span_id()
    raw = pb_request(SpanSpec(trace_id, span_id, "fits", padding="b" * (LIMIT - 500))).SerializeToString()
    assert len(raw) <= LIMIT

    resp = ingest.post(zstandard.ZstdCompressor().compress(raw), PROTOBUF, **{"content-encoding": "zstd"})

    assert not export_response_of(resp, PROTOBUF).HasField("partial_success")
    ingest.wait_stored(1)
    [stored] = ingest.stored_trace(trace_id)
    assert stored["span_id"] == span_id.hex()
    assert len(stored["attributes"]["padding"]) == LIMIT - 500


# --- partial success: invalid spans rejected one by one -------------------------------------------


def test_json_partial_success_for_bad_trace_id(ingest: Ingest) -> None:
    good_trace, good_span, bad_span = new_trace_id(), new_span_id(), new_span_id()
    body = json_request(
        json_span(good_trace.hex()[:-2], bad_span.hex(), "bad-trace-id"),  # 15 bytes
        json_span(good_trace.hex(), good_span.hex(), "good"),
    )

    resp = ingest.post(json.dumps(body).encode(), JSON)

    assert resp.status_code == 200
    doc = resp.json()  # the spec's JSON field names, as a client sees them
    assert int(doc["partialSuccess"]["rejectedSpans"]) == 1
    assert "trace id must be 16 bytes, got 15" in doc["partialSuccess"]["errorMessage"]
    assert "'bad-trace-id'" in doc["partialSuccess"]["errorMessage"]
    ingest.wait_stored(1)
    assert [s["span_id"] for s in ingest.stored_trace(good_trace)] == [good_span.hex()]
    ingest.assert_still_ingesting(new_trace_id())


@pytest.mark.parametrize(
    ("bad_trace_id", "bad_span_id", "problem"),
    [
        (os.urandom(15), os.urandom(8), "trace id must be 16 bytes, got 15"),
        (bytes(16), os.urandom(8), "trace id is all zeros"),
        (os.urandom(16), os.urandom(4), "span id must be 8 bytes, got 4"),
    ],
    ids=["short-trace-id", "zero-trace-id", "short-span-id"],
)
def test_protobuf_partial_success(ingest: Ingest, bad_trace_id: bytes, bad_span_id: bytes, problem: str) -> None:
    good_trace, good_span = new_trace_id(), new_span_id()
    req = pb_request(SpanSpec(bad_trace_id, bad_span_id, "bad"), SpanSpec(good_trace, good_span, "good"))

    out = export_response_of(ingest.post(req.SerializeToString(), PROTOBUF), PROTOBUF)

    assert out.HasField("partial_success")
    assert out.partial_success.rejected_spans == 1
    assert problem in out.partial_success.error_message
    ingest.wait_stored(1)
    assert [s["span_id"] for s in ingest.stored_trace(good_trace)] == [good_span.hex()]
    ingest.assert_still_ingesting(new_trace_id())


# --- self-telemetry -------------------------------------------------------------------------------


def test_metrics_count_accepted_and_refused_spans_per_transport(ingest: Ingest, collector: Collector) -> None:
    before = receiver_counts(collector)
    accepted, refused = "otelcol_receiver_accepted_spans_total", "otelcol_receiver_refused_spans_total"

    # 3 accepted, then 2 accepted + 2 rejected, then a malformed body (no spans known: counts nothing)
    t = new_trace_id()
    ok = pb_request(*(SpanSpec(t, new_span_id(), f"ok-{i}") for i in range(3)))
    assert ingest.post(ok.SerializeToString(), PROTOBUF).status_code == 200
    mixed = pb_request(
        SpanSpec(t, new_span_id(), "ok-3"),
        SpanSpec(os.urandom(5), new_span_id(), "bad-0"),
        SpanSpec(t, bytes(8), "bad-1"),
        SpanSpec(t, new_span_id(), "ok-4"),
    )
    out = export_response_of(ingest.post(mixed.SerializeToString(), PROTOBUF), PROTOBUF)
    assert out.partial_success.rejected_spans == 2
    assert ingest.post(b"\xff\xff\xff", PROTOBUF).status_code == 400
    ingest.wait_stored(5)

    after = receiver_counts(collector)
    assert after[(accepted, "http")] - before.get((accepted, "http"), 0) == 5
    assert after[(refused, "http")] - before.get((refused, "http"), 0) == 2
    # nothing came in over gRPC
    assert after.get((accepted, "grpc"), 0) == before.get((accepted, "grpc"), 0) == 0
    assert after.get((refused, "grpc"), 0) == before.get((refused, "grpc"), 0) == 0
    assert sorted(s["name"] for s in ingest.stored_trace(t)) == [f"ok-{i}" for i in range(5)]
