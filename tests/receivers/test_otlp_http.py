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

    def wait_stored(self, added: int) -> None:
        """`added` more spans are expected; exactly that many must arrive (an invalid span stored would show)."""
        self.expected += added
        got = self.collector.wait_stored(self.expected)
        assert got == self.expected, f"store holds {got} spans, expected {self.expected}"

    def stored(self, trace_id: bytes | str) -> list[dict[str, Any]]:
        """The trace's spans through the collector API (quick; the CLI is kept for the after-bad-request checks)."""
        tid = trace_id if isinstance(trace_id, str) else trace_id.hex()
        resp = httpx.get(f"{self.collector.api}/api/v1/traces/{tid}", timeout=10)
        assert resp.status_code == 200, resp.text
        return resp.json()["spans"]

    def wait_trace(self, trace_id: bytes, n: int, timeout: float = 3) -> list[dict[str, Any]]:
        """Up to `timeout` s for the trace to hold `n` spans; counts what did arrive, whatever the outcome."""
        deadline = time.monotonic() + timeout
        spans: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            resp = httpx.get(f"{self.collector.api}/api/v1/traces/{trace_id.hex()}", timeout=10)
            spans = resp.json()["spans"] if resp.status_code == 200 else []
            if len(spans) >= n:
                break
            time.sleep(0.1)
        self.expected += len(spans)
        return spans

    def follow_up(self, trace_id: bytes) -> str:
        """Right after a bad request: a valid one on the same connection is taken and stored."""
        span_id = new_span_id()
        resp = self.post(pb_request(SpanSpec(trace_id, span_id, "after-bad-request")).SerializeToString(), PROTOBUF)
        assert not export_response_of(resp, PROTOBUF).HasField("partial_success")
        self.wait_stored(1)
        return span_id.hex()

    def assert_trace_holds_only(self, trace_id: bytes, span_ids: list[str]) -> None:
        """`evalsi traces show ID --json` lists exactly these spans: the valid ones are there, the refused are not
        (the refused requests carried spans of this same trace)."""
        res = self.collector.cli("traces", "show", trace_id.hex(), "--json")
        spans = json.loads(res.stdout)["spans"]
        assert sorted(s["span_id"] for s in spans) == sorted(span_ids)


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
    if path.suffix == ".json":
        doc = json.loads(path.read_bytes())
        spans = [s for rs in doc["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
        ids = {s["traceId"].lower() for s in spans}
        names = [s["name"] for s in spans]
    else:
        req = ExportTraceServiceRequest()
        req.ParseFromString(path.read_bytes())
        pb_spans = [s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
        ids = {s.trace_id.hex() for s in pb_spans}
        names = [s.name for s in pb_spans]
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
    assert sorted(s["name"] for s in ingest.stored(trace_id)) == sorted(names)


def test_json_variants_the_spec_allows(ingest: Ingest) -> None:
    """A media type parameter (`; charset=utf-8`) and upper-case hex ids (the spec: case-insensitive hex)."""
    trace_id, lower, upper = new_trace_id(), new_span_id(), new_span_id()
    body = json.dumps(json_request(json_span(trace_id.hex(), lower.hex(), "charset"))).encode()
    resp = ingest.post(body, "application/json; charset=utf-8")
    assert not export_response_of(resp, JSON).HasField("partial_success")
    body = json.dumps(json_request(json_span(trace_id.hex().upper(), upper.hex().upper(), "upper"))).encode()
    assert not export_response_of(ingest.post(body, JSON), JSON).HasField("partial_success")

    ingest.wait_stored(2)
    assert sorted(s["span_id"] for s in ingest.stored(trace_id)) == sorted([lower.hex(), upper.hex()])


def test_compressed_body_under_limit_when_inflated_is_accepted_whole(ingest: Ingest) -> None:
    """The limit applies to the inflated size, and a body that fits is not cut short."""
    trace_id, span_id = new_trace_id(), new_span_id()
    raw = pb_request(SpanSpec(trace_id, span_id, "fits", padding="b" * (LIMIT - 500))).SerializeToString()
    assert len(raw) <= LIMIT

    resp = ingest.post(zstandard.ZstdCompressor().compress(raw), PROTOBUF, **{"content-encoding": "zstd"})

    assert not export_response_of(resp, PROTOBUF).HasField("partial_success")
    ingest.wait_stored(1)
    [stored] = ingest.stored(trace_id)
    assert stored["span_id"] == span_id.hex()
    assert stored["attributes"]["padding"] == "b" * (LIMIT - 500)


def test_empty_request_is_a_full_success(ingest: Ingest) -> None:
    """The spec: a request that carries no telemetry SHOULD be answered with success."""
    for body, media in ((b"", PROTOBUF), (b"{}", JSON), (b'{"resourceSpans": []}', JSON)):
        resp = ingest.post(body, media)
        assert not export_response_of(resp, media).HasField("partial_success"), (body, media)


@pytest.mark.parametrize("encoding", ["gzip", "zstd"])
def test_concatenated_compressed_members_are_all_read(ingest: Ingest, encoding: str) -> None:
    trace_id, first, second = new_trace_id(), new_span_id(), new_span_id()
    parts = [pb_request(SpanSpec(trace_id, sid, "part")).SerializeToString() for sid in (first, second)]
    # two serialized requests back to back are one request holding both (protobuf merges repeated fields)
    if encoding == "gzip":
        body = b"".join(gzip.compress(p) for p in parts)
    else:
        body = b"".join(zstandard.ZstdCompressor().compress(p) for p in parts)

    resp = ingest.post(body, PROTOBUF, **{"content-encoding": encoding})

    assert not export_response_of(resp, PROTOBUF).HasField("partial_success")
    spans = ingest.wait_trace(trace_id, 2)
    assert sorted(s["span_id"] for s in spans) == sorted([first.hex(), second.hex()])


# --- bad data: 400 with a Status saying what is wrong ---------------------------------------------


def test_malformed_protobuf_is_400_with_protobuf_status(ingest: Ingest) -> None:
    trace_id = new_trace_id()
    whole = pb_request(SpanSpec(trace_id, new_span_id(), "truncated")).SerializeToString()

    resp = ingest.post(whole[:-7], PROTOBUF)  # cut inside the span: not a message any more

    assert resp.status_code == 400
    status = status_of(resp, PROTOBUF)
    assert status.code == code_pb2.INVALID_ARGUMENT
    assert "not a valid OTLP ExportTraceServiceRequest protobuf" in status.message
    ingest.assert_trace_holds_only(trace_id, [ingest.follow_up(trace_id)])


def test_malformed_json_is_400_with_json_status(ingest: Ingest) -> None:
    trace_id = new_trace_id()
    text = json.dumps(json_request(json_span(trace_id.hex(), new_span_id().hex(), "malformed")))
    cases = {
        "truncated": (text[:-5], "body is not valid JSON"),
        "bad int64": (re.sub(r'"startTimeUnixNano": "\d+"', '"startTimeUnixNano": "soon"', text), "startTimeUnixNano"),
        "wrong shape": (text.replace('"resourceSpans": [', '"resourceSpans": ["x", '), "not a valid OTLP/JSON"),
        "not an object": (f"[{text}]", "must be a JSON object"),
    }
    followed = []
    for case, (bad, expected) in cases.items():
        assert bad != text

        resp = ingest.post(bad.encode(), JSON)

        assert resp.status_code == 400, case
        status = status_of(resp, JSON)
        assert status.code == code_pb2.INVALID_ARGUMENT, case
        assert expected in status.message, (case, status.message)
        followed.append(ingest.follow_up(trace_id))
    ingest.assert_trace_holds_only(trace_id, followed)


def test_bad_content_encoding_is_400(ingest: Ingest) -> None:
    trace_id = new_trace_id()
    body = pb_request(SpanSpec(trace_id, new_span_id(), "bad-encoding")).SerializeToString()
    cases = {
        "gzip": "body is not valid gzip",  # says gzip, is not
        "zstd": "body is not valid zstd",
        "br": "unsupported content encoding 'br'",
    }
    followed = []
    for encoding, expected in cases.items():
        resp = ingest.post(body, PROTOBUF, **{"content-encoding": encoding})

        assert resp.status_code == 400, encoding
        assert expected in status_of(resp, PROTOBUF).message, encoding
        followed.append(ingest.follow_up(trace_id))
    ingest.assert_trace_holds_only(trace_id, followed)


def test_truncated_zstd_body_is_400(ingest: Ingest) -> None:
    trace_id = new_trace_id()
    raw = pb_request(SpanSpec(trace_id, new_span_id(), "cut", padding="c" * 1000)).SerializeToString()
    body = zstandard.ZstdCompressor().compress(raw)[:-4]  # the upload was cut short

    resp = ingest.post(body, PROTOBUF, **{"content-encoding": "zstd"})

    assert resp.status_code == 400
    assert "zstd" in status_of(resp, PROTOBUF).message
    ingest.assert_trace_holds_only(trace_id, [ingest.follow_up(trace_id)])


# --- wrong content type, wrong method -------------------------------------------------------------


def test_wrong_content_type_is_415(ingest: Ingest) -> None:
    trace_id = new_trace_id()
    body = pb_request(SpanSpec(trace_id, new_span_id(), "wrong-type")).SerializeToString()
    followed = []
    for media in ("text/plain", "application/protobuf", None):
        resp = ingest.client.post("/v1/traces", content=body, headers={"content-type": media} if media else {})

        assert resp.status_code == 415, media
        status = status_of(resp, JSON)
        assert PROTOBUF in status.message and JSON in status.message  # says what to send instead
        assert (repr(media) if media else "(none)") in status.message
        followed.append(ingest.follow_up(trace_id))
    ingest.assert_trace_holds_only(trace_id, followed)


def test_get_is_405_with_allow_post(ingest: Ingest) -> None:
    resp = ingest.client.get("/v1/traces")

    assert resp.status_code == 405
    assert resp.headers["allow"] == "POST"
    assert "use POST" in status_of(resp, JSON).message
    trace_id = new_trace_id()
    ingest.assert_trace_holds_only(trace_id, [ingest.follow_up(trace_id)])


# --- too large: 413, before and after decompression -----------------------------------------------


def test_body_over_limit_is_413(ingest: Ingest) -> None:
    trace_id = new_trace_id()
    data = pb_request(SpanSpec(trace_id, new_span_id(), "too-big", padding=os.urandom(LIMIT).hex())).SerializeToString()
    assert len(data) > LIMIT

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(data), 16 * 1024):
            yield data[i : i + 16 * 1024]

    # with a Content-Length, and chunked (no length to trust: the limit must hold while reading the stream)
    followed = []
    for content in (data, chunks()):
        resp = ingest.client.post("/v1/traces", content=content, headers={"content-type": PROTOBUF})

        chunked = resp.request.headers.get("transfer-encoding") == "chunked"
        assert chunked == (content is not data)
        assert resp.status_code == 413, f"chunked={chunked}"
        status = status_of(resp, PROTOBUF)
        assert f"exceeds the limit of {LIMIT} bytes" in status.message
        followed.append(ingest.follow_up(trace_id))
    ingest.assert_trace_holds_only(trace_id, followed)


def test_compression_bomb_is_413(ingest: Ingest) -> None:
    """Small on the wire, over the limit once inflated: refused without inflating it all."""
    trace_id = new_trace_id()
    padding = "a" * (LIMIT * 50)
    pb = pb_request(SpanSpec(trace_id, new_span_id(), "bomb", padding=padding)).SerializeToString()
    span = json_span(trace_id.hex(), new_span_id().hex(), "bomb")
    span["attributes"] = [{"key": "padding", "value": {"stringValue": padding}}]
    js = json.dumps(json_request(span)).encode()
    followed = []
    for encoding, media, raw in (
        ("gzip", PROTOBUF, pb),
        ("zstd", JSON, js),
        ("gzip", JSON, js),
        ("zstd", PROTOBUF, pb),
    ):
        body = gzip.compress(raw) if encoding == "gzip" else zstandard.ZstdCompressor().compress(raw)
        assert len(body) < LIMIT < len(raw)

        resp = ingest.post(body, media, **{"content-encoding": encoding})

        assert resp.status_code == 413, (encoding, media)
        assert f"decompressed body exceeds the limit of {LIMIT} bytes" in status_of(resp, media).message
        followed.append(ingest.follow_up(trace_id))
    ingest.assert_trace_holds_only(trace_id, followed)


# --- partial success: invalid spans rejected one by one -------------------------------------------


def test_json_partial_success_for_bad_trace_id(ingest: Ingest) -> None:
    trace_id, good_span = new_trace_id(), new_span_id()
    body = json_request(
        json_span(trace_id.hex()[:-2], new_span_id().hex(), "bad-trace-id"),  # 15 bytes
        json_span(trace_id.hex(), good_span.hex(), "good"),
    )

    resp = ingest.post(json.dumps(body).encode(), JSON)

    assert resp.status_code == 200
    assert resp.headers["content-type"].split(";")[0] == JSON
    doc = resp.json()  # the spec's JSON field names, as a client sees them
    assert int(doc["partialSuccess"]["rejectedSpans"]) == 1
    assert "'bad-trace-id': trace id must be 16 bytes, got 15" in doc["partialSuccess"]["errorMessage"]
    ingest.wait_stored(1)
    ingest.assert_trace_holds_only(trace_id, [good_span.hex(), ingest.follow_up(trace_id)])


def test_protobuf_partial_success(ingest: Ingest) -> None:
    trace_id = new_trace_id()
    cases = {
        "short trace id": (os.urandom(15), new_span_id(), "trace id must be 16 bytes, got 15"),
        "zero trace id": (bytes(16), new_span_id(), "trace id is all zeros"),
        "short span id": (trace_id, os.urandom(4), "span id must be 8 bytes, got 4"),
        "zero span id": (trace_id, bytes(8), "span id is all zeros"),
    }
    kept = []
    for case, (bad_trace, bad_span, problem) in cases.items():
        good_span = new_span_id()
        req = pb_request(SpanSpec(bad_trace, bad_span, "bad"), SpanSpec(trace_id, good_span, "good"))

        out = export_response_of(ingest.post(req.SerializeToString(), PROTOBUF), PROTOBUF)

        assert out.HasField("partial_success"), case
        assert out.partial_success.rejected_spans == 1, case
        assert problem in out.partial_success.error_message, case
        ingest.wait_stored(1)
        kept += [good_span.hex(), ingest.follow_up(trace_id)]
    ingest.assert_trace_holds_only(trace_id, kept)


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
    assert sorted(s["name"] for s in ingest.stored(t)) == [f"ok-{i}" for i in range(5)]
