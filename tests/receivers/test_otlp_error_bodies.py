"""Every error the OTLP receiver answers carries a `google.rpc.Status`, as the OTLP specification asks: on the HTTP
port in the request's encoding (protobuf for `application/x-protobuf`, JSON for `application/json`, JSON when the
content type is neither), with `RetryInfo` when the sender should retry and a `BadRequest` naming what could not be
decoded on a 400; over gRPC in `grpc-status-details-bin`.

One receiver, in-process, serves the module over real HTTP and gRPC, with a pipeline that refuses or breaks on
spans named for it and an `optional` auth section (a wrong key is refused, no key is taken).
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import json_format
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from evalsi.auth import ApiKeyConfig, AuthConfig, Authenticator, hash_of
from evalsi.component import Next, Refused, Settings
from evalsi.model.log_record import LogBatch
from evalsi.model.span import SpanBatch
from evalsi.receivers.otlp import OtlpReceiver
from evalsi.receivers.otlp.config import OtlpReceiverConfig
from evalsi.runtime.telemetry import SelfMetrics

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
MEDIA = [PROTOBUF, JSON]
LIMIT = 64 * 1024  # max_request_body_size
KEY = "evk_error-bodies-test-key"
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


class Pipeline:
    """Takes what it is handed, except a batch holding a span named `refuse-429`, `refuse-503` or `crash`."""

    def __init__(self) -> None:
        self.spans: list[str] = []

    async def consume(self, batch: SpanBatch) -> None:
        names = {s.name for s in batch.spans}
        if "refuse-429" in names:
            raise Refused("the pipeline's queue is full", retry_after=3)
        if "refuse-503" in names:
            raise Refused("the store refuses writes", retry_after=7, unavailable=True)
        if "crash" in names:
            raise RuntimeError("a bug in a processor")
        self.spans += [s.name for s in batch.spans]

    async def consume_logs(self, batch: LogBatch) -> None:
        pass


class Served:
    """The receiver, running in its own event loop on a thread, and how to reach it."""

    def __init__(self) -> None:
        self.pipeline = Pipeline()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        config = OtlpReceiverConfig.model_validate(
            {
                "protocols": {
                    "grpc": {"endpoint": "127.0.0.1:0"},
                    "http": {"endpoint": "127.0.0.1:0", "max_request_body_size": LIMIT},
                }
            }
        )
        auth = Authenticator(AuthConfig(mode="optional", api_keys=[ApiKeyConfig(hash=hash_of(KEY))]))
        settings = Settings(id="otlp", metrics=SelfMetrics(), logger=logging.getLogger("test.otlp"), auth=auth)
        wired = Next()
        wired.traces = self.pipeline
        wired.logs = self.pipeline
        self.receiver = OtlpReceiver(config, settings, wired)
        self._run(self.receiver.start())
        self.http = httpx.Client(base_url="http://" + self.receiver.endpoints["http"], timeout=10)
        self.grpc = grpc.insecure_channel(self.receiver.endpoints["grpc"])

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    def close(self) -> None:
        self.http.close()
        self.grpc.close()
        self._run(self.receiver.shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def post(self, body: bytes, media: str | None, path: str = "/v1/traces", **headers: str) -> httpx.Response:
        if media is not None:
            headers["content-type"] = media
        return self.http.post(path, content=body, headers=headers)


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    s = Served()
    yield s
    s.close()


# --- requests and answers ---------------------------------------------------------------------------------------


def spans_request(*names: str, start: str | None = None) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    ss = req.resource_spans.add().scope_spans.add()
    now = time.time_ns()
    for name in names:
        span = ss.spans.add(trace_id=os.urandom(16), span_id=os.urandom(8), name=name, kind=1)
        span.start_time_unix_nano, span.end_time_unix_nano = now, now + 1000
    return req


def body_of(req: ExportTraceServiceRequest, media: str) -> bytes:
    """The request in `media`, as OTLP/JSON writes it (hex ids)."""
    if media == PROTOBUF:
        return req.SerializeToString()
    doc = json_format.MessageToDict(req, use_integers_for_enums=True)
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId"):
                    span[key] = base64.b64decode(span[key]).hex()
    return json.dumps(doc).encode()


def status_of(resp: httpx.Response, media: str) -> status_pb2.Status:
    """The `google.rpc.Status` of an error answer, decoded in the encoding it must come in."""
    assert resp.headers["content-type"].split(";")[0].strip() == media, (resp.status_code, resp.headers)
    status = status_pb2.Status()
    if media == JSON:
        json_format.Parse(resp.text, status)
        # and its JSON form as any JSON client reads it: the code as a number, details typed by `@type`
        doc = resp.json()
        assert doc["code"] == status.code and doc["message"] == status.message
        assert [d["@type"] for d in doc.get("details", [])] == [d.type_url for d in status.details]
    else:
        status.ParseFromString(resp.content)
    assert status.message, "a Status says what is wrong"
    return status


def retry_info(status: status_pb2.Status) -> error_details_pb2.RetryInfo | None:
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return info
    return None


def bad_request(status: status_pb2.Status) -> error_details_pb2.BadRequest | None:
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            return bad
    return None


# --- every status, in both encodings ----------------------------------------------------------------------------

# HTTP status -> how to provoke it with a request in `media`, and the Status code it carries (UNIMPLEMENTED for an
# unknown path, as gRPC answers an unknown method and the Collector maps a 404)
CASES: dict[int, tuple[Callable[[Served, str], httpx.Response], int]] = {
    400: (lambda s, m: s.post(b"\xff\xff\xff not " + m.encode(), m), code_pb2.INVALID_ARGUMENT),
    401: (
        lambda s, m: s.post(body_of(spans_request("ok"), m), m, authorization="Bearer evk_not-a-key"),
        code_pb2.UNAUTHENTICATED,
    ),
    404: (lambda s, m: s.post(body_of(spans_request("ok"), m), m, path="/v1/metrics"), code_pb2.UNIMPLEMENTED),
    405: (lambda s, m: s.http.put("/v1/traces", content=b"{}", headers={"content-type": m}), code_pb2.UNIMPLEMENTED),
    413: (lambda s, m: s.post(b"x" * (LIMIT + 1), m), code_pb2.INVALID_ARGUMENT),
    429: (lambda s, m: s.post(body_of(spans_request("refuse-429"), m), m), code_pb2.RESOURCE_EXHAUSTED),
    500: (lambda s, m: s.post(body_of(spans_request("crash"), m), m), code_pb2.INTERNAL),
    503: (lambda s, m: s.post(body_of(spans_request("refuse-503"), m), m), code_pb2.UNAVAILABLE),
}


@pytest.mark.parametrize("media", MEDIA)
@pytest.mark.parametrize("http_status", sorted(CASES))
def test_every_error_is_a_status_in_the_request_encoding(served: Served, http_status: int, media: str) -> None:
    send, code = CASES[http_status]

    resp = send(served, media)

    assert resp.status_code == http_status, resp.text
    status = status_of(resp, media)
    assert status.code == code
    info = retry_info(status)
    if http_status in (429, 503):  # retryable: when to retry, in the header and in the Status
        assert resp.headers["retry-after"] == {429: "3", 503: "7"}[http_status]
        assert info is not None and info.retry_delay.seconds == int(resp.headers["retry-after"])
    else:
        assert info is None and "retry-after" not in resp.headers
    assert (bad_request(status) is not None) == (http_status == 400)
    # the port still takes a valid request right after, on the same connection
    ok = served.post(body_of(spans_request(f"after-{http_status}"), media), media)
    assert ok.status_code == 200, ok.text
    assert f"after-{http_status}" in served.pipeline.spans


@pytest.mark.parametrize("content_type", ["text/plain", "application/protobuf", None])
def test_unknown_content_type_is_415_in_json(served: Served, content_type: str | None) -> None:
    resp = served.post(spans_request("ok").SerializeToString(), content_type)

    assert resp.status_code == 415
    status = status_of(resp, JSON)
    assert status.code == code_pb2.UNIMPLEMENTED
    assert PROTOBUF in status.message and JSON in status.message  # says what to send


@pytest.mark.parametrize("media", [*MEDIA, None])
@pytest.mark.parametrize(("method", "path"), [("POST", "/v1/metrics"), ("GET", "/"), ("POST", "/v1/traces/"),
                                              ("DELETE", "/v1/logs/x"), ("OPTIONS", "/healthz")])  # fmt: skip
def test_unknown_path_is_404_naming_the_paths_served(served: Served, media: str | None, method: str, path: str) -> None:
    headers = {"content-type": media} if media else {}

    resp = served.http.request(method, path, content=b"{}", headers=headers)

    assert resp.status_code == 404
    status = status_of(resp, media or JSON)  # not FastAPI's {"detail": "Not Found"}
    assert status.code == code_pb2.UNIMPLEMENTED
    assert path in status.message
    assert "POST to /v1/traces, /v1/logs" in status.message


@pytest.mark.parametrize("media", MEDIA)
@pytest.mark.parametrize("method", ["GET", "PUT", "PATCH", "DELETE", "OPTIONS"])
def test_wrong_method_is_405_allowing_post(served: Served, media: str, method: str) -> None:
    resp = served.http.request(method, "/v1/logs", headers={"content-type": media})

    assert resp.status_code == 405
    assert resp.headers["allow"] == "POST"
    assert f"method {method} not allowed on /v1/logs; use POST" in status_of(resp, media).message


# --- 400: a BadRequest naming what could not be decoded -----------------------------------------------------------


def test_json_400_names_the_field_that_could_not_be_decoded(served: Served) -> None:
    doc = json.loads(body_of(spans_request("good", "bad"), JSON))
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][1]["startTimeUnixNano"] = "soon"
    before = list(served.pipeline.spans)

    resp = served.post(json.dumps(doc).encode(), JSON)

    assert resp.status_code == 400
    status = status_of(resp, JSON)
    bad = bad_request(status)
    assert bad is not None
    [violation] = bad.field_violations
    assert violation.field == "resourceSpans[0].scopeSpans[0].spans[1].startTimeUnixNano"
    assert violation.reason == "INVALID_OTLP_JSON"
    assert "soon" in violation.description
    assert served.pipeline.spans == before  # nothing of the request was taken
    # the JSON form a client sees
    [detail] = resp.json()["details"]
    assert detail["@type"] == "type.googleapis.com/google.rpc.BadRequest"
    assert detail["fieldViolations"][0]["field"] == violation.field


@pytest.mark.parametrize(
    ("media", "body", "headers", "reason", "field", "said"),
    [
        (PROTOBUF, b"\x0a\x05\x12", {}, "INVALID_PROTOBUF", "", "not a valid OTLP ExportTraceServiceRequest protobuf"),
        (JSON, b'{"resourceSpans": [', {}, "INVALID_JSON", "", "body is not valid JSON"),
        (JSON, b"[1, 2]", {}, "INVALID_JSON", "", "must be a JSON object"),
        (
            JSON,
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "\\ud800"}]}]}]}',
            {},
            "INVALID_OTLP_JSON",
            "resourceSpans[0].scopeSpans[0].spans[0].name",
            "lone surrogate",
        ),
        (PROTOBUF, b"not gzip at all", {"content-encoding": "gzip"}, "INVALID_COMPRESSED_BODY", "", "not valid gzip"),
        (JSON, gzip.compress(b"{}", mtime=0), {"content-encoding": "br"}, "UNSUPPORTED_CONTENT_ENCODING", "", "'br'"),
    ],
    ids=["protobuf", "json cut short", "json not an object", "lone surrogate", "not gzip", "brotli"],
)
def test_400_carries_a_bad_request(
    served: Served, media: str, body: bytes, headers: dict[str, str], reason: str, field: str, said: str
) -> None:
    resp = served.post(body, media, **headers)

    assert resp.status_code == 400
    status = status_of(resp, media)
    assert status.code == code_pb2.INVALID_ARGUMENT
    assert said in status.message
    bad = bad_request(status)
    assert bad is not None
    [violation] = bad.field_violations
    assert (violation.reason, violation.field) == (reason, field)
    assert said in violation.description


# --- gRPC: the same details in grpc-status-details-bin ----------------------------------------------------------


def grpc_status(error: grpc.RpcError) -> status_pb2.Status:
    metadata = dict(error.trailing_metadata() or ())  # type: ignore[attr-defined]
    status = status_pb2.Status()
    status.ParseFromString(metadata["grpc-status-details-bin"])
    assert status.code == error.code().value[0]  # type: ignore[attr-defined]
    return status


def test_grpc_undecodable_request_is_invalid_argument_with_a_bad_request(served: Served) -> None:
    export = served.grpc.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)

    with pytest.raises(grpc.RpcError) as refused:
        export(b"\x0a\x05\x12", timeout=10)

    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    bad = bad_request(grpc_status(refused.value))
    assert bad is not None and bad.field_violations[0].reason == "INVALID_PROTOBUF"
    answer = ExportTraceServiceResponse.FromString(export(spans_request("after-grpc-400").SerializeToString()))
    assert not answer.HasField("partial_success")
    assert "after-grpc-400" in served.pipeline.spans


@pytest.mark.parametrize(
    ("name", "code", "delay"),
    [("refuse-429", grpc.StatusCode.RESOURCE_EXHAUSTED, 3), ("refuse-503", grpc.StatusCode.UNAVAILABLE, 7)],
)
def test_grpc_refusal_carries_retry_info(served: Served, name: str, code: grpc.StatusCode, delay: int) -> None:
    export = served.grpc.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)

    with pytest.raises(grpc.RpcError) as refused:
        export(spans_request(name).SerializeToString(), timeout=10)

    assert refused.value.code() == code  # type: ignore[attr-defined]
    info = retry_info(grpc_status(refused.value))
    assert info is not None and info.retry_delay.seconds == delay


def test_grpc_wrong_key_is_unauthenticated(served: Served) -> None:
    """The key check answers before the handler, as for HTTP; no key is taken (the auth mode is optional)."""
    export = served.grpc.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
    body = spans_request("grpc-wrong-key").SerializeToString()

    with pytest.raises(grpc.RpcError) as refused:
        export(body, timeout=10, metadata=(("authorization", "Bearer evk_not-a-key"),))

    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
    assert "grpc-wrong-key" not in served.pipeline.spans
    export(body, timeout=10)
    assert "grpc-wrong-key" in served.pipeline.spans
