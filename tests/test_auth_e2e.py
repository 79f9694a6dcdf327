"""Auth end to end: every surface of a running `evalsi serve` with an `auth` section refuses a request without a valid
API key (no key, a wrong key, a malformed header) and takes one with it, through real clients: the OpenTelemetry
SDK's OTLP exporters, raw gRPC and HTTP, the CLI. And the secure-by-default rule of the config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.rpc import code_pb2, status_pb2
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from running_collector import Collector, serve_config, start_collector, wait_until

from evalsi.auth import hash_of, new_key
from evalsi.collector.config import ConfigError, parse_config

KEY, HASH = new_key()
OTHER_KEY, _ = new_key()


def _auth_config(tmp_path: Path, mode: str = "strict", **extra: Any) -> dict[str, Any]:
    cfg = serve_config(tmp_path / "store")
    cfg["auth"] = {"mode": mode, "api_keys": [{"hash": HASH, "name": "team-a"}], **extra}
    cfg["exporters"]["prometheus"] = {"endpoint": "127.0.0.1:0"}
    cfg["service"]["pipelines"]["scores"] = {"exporters": ["clickhouse", "prometheus"]}
    return cfg


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("auth")
    c = start_collector(tmp, _auth_config(tmp))
    yield c
    assert c.stop() == 0


def _send(exporter: Any, name: str) -> str:
    provider = TracerProvider(resource=Resource.create({"service.name": "auth-test"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("t").start_as_current_span(name) as span:
        trace_id = format(span.get_span_context().trace_id, "032x")
    provider.shutdown()
    return trace_id


def _stored(c: Collector, trace_id: str) -> bool:
    r = httpx.get(f"{c.api}/api/v1/traces/{trace_id}", headers={"Authorization": f"Bearer {KEY}"})
    return r.status_code == 200 and bool(r.json().get("spans"))


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


BAD_HEADERS = [
    {},
    _bearer(OTHER_KEY),
    {"Authorization": KEY},
    {"Authorization": "Basic dXNlcjpwYXNz"},
    {"Authorization": "Bearer"},
]
BAD_IDS = ["no key", "a wrong key", "no scheme", "basic auth", "an empty bearer"]


@pytest.mark.parametrize("headers", BAD_HEADERS, ids=BAD_IDS)
def test_otlp_http_refuses_without_a_valid_key_with_a_status_body(
    collector: Collector, headers: dict[str, str]
) -> None:
    body = ExportTraceServiceRequest().SerializeToString()
    r = httpx.post(collector.http + "/v1/traces", content=body,
                   headers={"Content-Type": "application/x-protobuf", **headers})  # fmt: skip
    assert r.status_code == 401
    assert r.headers["content-type"] == "application/x-protobuf"
    assert r.headers["www-authenticate"].startswith("Bearer")
    status = status_pb2.Status.FromString(r.content)
    assert status.code == code_pb2.UNAUTHENTICATED and "API key" in status.message
    assert KEY not in r.text and OTHER_KEY not in r.text
    as_json = httpx.post(collector.http + "/v1/traces", json={}, headers=headers)
    assert as_json.status_code == 401 and as_json.json()["code"] == code_pb2.UNAUTHENTICATED


def test_the_sdk_http_exporter_with_the_key_is_stored_and_without_it_is_not(collector: Collector) -> None:
    good = _send(HttpExporter(endpoint=collector.http + "/v1/traces", headers=_bearer(KEY)), "with key")
    bad = _send(HttpExporter(endpoint=collector.http + "/v1/traces", headers=_bearer(OTHER_KEY)), "wrong key")
    assert wait_until(lambda: _stored(collector, good))
    assert not _stored(collector, bad)


def test_otlp_grpc_refuses_without_a_valid_key_and_takes_it_with_one(collector: Collector) -> None:
    channel = grpc.insecure_channel(collector.grpc)
    export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
    body = ExportTraceServiceRequest().SerializeToString()
    for metadata in ((), (("authorization", f"Bearer {OTHER_KEY}"),), (("authorization", "Bearer"),)):
        with pytest.raises(grpc.RpcError) as refused:
            export(body, metadata=metadata, timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, metadata
        assert "API key" in (refused.value.details() or "")
    assert export(body, metadata=(("authorization", f"Bearer {KEY}"),), timeout=10) is not None
    channel.close()
    good = _send(GrpcExporter(endpoint=collector.grpc, insecure=True, headers=(("authorization", f"Bearer {KEY}"),)),
                 "grpc with key")  # fmt: skip
    bad = _send(GrpcExporter(endpoint=collector.grpc, insecure=True), "grpc without key")
    assert wait_until(lambda: _stored(collector, good))
    assert not _stored(collector, bad)


API_ROUTES = [
    ("GET", "/api/v1/status", None),
    ("GET", "/api/v1/traces", None),
    ("GET", "/api/v1/scores", None),
    ("GET", "/api/v1/policies/stats", None),
    ("GET", "/docs", None),
    ("GET", "/openapi.json", None),
    (
        "POST",
        "/v1/evaluate",
        {"evaluators": [{"ref": "builtin/contains", "params": {"any": ["x"]}}], "traces": [{"spans": []}]},
    ),
    ("POST", "/v1/feedback", {"trace_id": "a" * 32, "name": "thumbs", "value": 1}),
]


@pytest.mark.parametrize(("method", "path", "body"), API_ROUTES, ids=[p for _, p, _ in API_ROUTES])
def test_every_api_route_needs_the_key(collector: Collector, method: str, path: str, body: Any) -> None:
    for headers in BAD_HEADERS:
        r = httpx.request(method, collector.api + path, json=body, headers=headers)
        assert r.status_code == 401, (headers, r.text)
        assert "API key" in r.json()["detail"] or "Bearer" in r.json()["detail"]
    r = httpx.request(method, collector.api + path, json=body, headers=_bearer(KEY))
    assert r.status_code != 401, r.text
    assert r.status_code < 500, r.text


def test_a_forged_feedback_score_is_not_stored(collector: Collector) -> None:
    trace_id = "f" * 32
    r = httpx.post(collector.api + "/v1/feedback", json={"trace_id": trace_id, "name": "forged", "value": 0})
    assert r.status_code == 401
    scores = httpx.get(collector.api + "/api/v1/scores", params={"trace_id": trace_id}, headers=_bearer(KEY))
    assert [s for s in scores.json()["scores"] if s["name"] == "forged"] == []


def test_health_probes_and_loopback_metrics_stay_open(collector: Collector) -> None:
    assert httpx.get(collector.api + "/healthz").status_code == 200
    assert httpx.get(collector.api + "/readyz").status_code == 200
    # both metrics listeners are on loopback here: `metrics: protected` leaves them open
    assert httpx.get(collector.metrics).status_code == 200
    assert httpx.get("http://" + _prometheus_endpoint(collector) + "/metrics").status_code == 200


def _prometheus_endpoint(c: Collector) -> str:
    [line] = [e for e in c.logs() if e.get("msg") == "prometheus exporter listening"]
    return line["endpoint"]


def test_the_cli_reads_with_the_key_in_its_environment(collector: Collector) -> None:
    env = {k: v for k, v in os.environ.items() if k != "EVALSI_API_KEY"}
    cmd = [sys.executable, "-m", "evalsi", "traces", "list", "--api", collector.api, "--json"]
    without = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert without.returncode != 0
    assert "401" in without.stderr and "EVALSI_API_KEY" in without.stderr
    with_key = subprocess.run(cmd, capture_output=True, text=True, env={**env, "EVALSI_API_KEY": KEY}, timeout=60)
    assert with_key.returncode == 0, with_key.stderr
    assert isinstance(json.loads(with_key.stdout), list)


def test_no_key_is_ever_logged(collector: Collector) -> None:
    text = collector.log_path.read_text()
    assert KEY not in text and OTHER_KEY not in text
    assert HASH in collector.config_path.read_text()  # what the config holds


def test_optional_mode_takes_anonymous_senders_but_refuses_a_wrong_key(tmp_path: Path) -> None:
    c = start_collector(tmp_path, _auth_config(tmp_path, mode="optional"))
    try:
        anonymous = _send(HttpExporter(endpoint=c.http + "/v1/traces"), "anonymous")
        assert wait_until(lambda: _stored(c, anonymous))
        r = httpx.post(c.http + "/v1/traces", json={}, headers=_bearer(OTHER_KEY))
        assert r.status_code == 401
        assert httpx.get(c.api + "/api/v1/traces").status_code == 200
        assert httpx.get(c.api + "/api/v1/traces", headers=_bearer(OTHER_KEY)).status_code == 401
    finally:
        assert c.stop() == 0


def test_metrics_on_a_reachable_listener_need_the_key_unless_declared_open(tmp_path: Path) -> None:
    cfg = _auth_config(tmp_path)
    cfg["service"]["telemetry"]["metrics"]["address"] = "0.0.0.0:0"
    c = start_collector(tmp_path, cfg)
    try:
        url = "http://127.0.0.1:" + c.ready["metrics"].rsplit(":", 1)[1] + "/metrics"
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, headers=_bearer(KEY)).status_code == 200
    finally:
        assert c.stop() == 0
    cfg["auth"]["metrics"] = "open"
    (tmp_path / "open").mkdir()
    c = start_collector(tmp_path / "open", cfg)
    try:
        url = "http://127.0.0.1:" + c.ready["metrics"].rsplit(":", 1)[1] + "/metrics"
        assert httpx.get(url).status_code == 200
    finally:
        assert c.stop() == 0


# -- the config ----------------------------------------------------------------------------------------------------


def _errors(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as e:
        parse_config(doc)
    return e.value.errors


@pytest.mark.parametrize(
    ("where", "path"),
    [
        (
            {"receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "0.0.0.0:4317"}}}}},
            "receivers.otlp.protocols.grpc.endpoint",
        ),
        ({"service": {"api": {"endpoint": ":8080"}}}, "service.api.endpoint"),
        ({"service": {"telemetry": {"metrics": {"address": "10.0.0.5:8888"}}}}, "service.telemetry.metrics.address"),
        ({"exporters": {"prometheus": {"endpoint": "0.0.0.0:9464"}}}, "exporters.prometheus.endpoint"),
    ],
    ids=["receiver", "api", "metrics", "prometheus exporter"],
)
def test_a_reachable_listener_without_an_auth_section_is_refused_naming_it(where: dict[str, Any], path: str) -> None:
    doc: dict[str, Any] = {
        "receivers": {"otlp": {}}, "exporters": {"clickhouse": {}},
        "service": {"pipelines": {"traces": {"receivers": ["otlp"], "exporters": ["clickhouse"]}}},
    }  # fmt: skip
    for section, body in where.items():
        for key, value in body.items():
            doc.setdefault(section, {})[key] = value
    if "prometheus" in doc["exporters"]:
        doc["service"]["pipelines"]["scores"] = {"exporters": ["prometheus"]}
    [error] = [e for e in _errors(doc) if e.startswith(path)]
    assert "can be reached from other machines" in error
    assert "evalsi keys new" in error and "mode: none" in error and "127.0.0.1" in error
    doc["auth"] = {"mode": "none"}
    assert parse_config(doc).auth is not None
    doc["auth"] = {"api_keys": [{"hash": HASH}]}
    assert parse_config(doc).auth is not None


def test_mode_none_is_accepted_and_warned_about_at_every_start(tmp_path: Path) -> None:
    cfg = serve_config(tmp_path / "store")
    cfg["auth"] = {"mode": "none"}
    c = start_collector(tmp_path, cfg)
    try:
        assert httpx.get(c.api + "/api/v1/traces").status_code == 200
    finally:
        assert c.stop() == 0
    warnings = [e for e in c.logs() if e.get("level") == "warning" and "auth mode none" in e.get("msg", "")]
    assert len(warnings) == 1


@pytest.mark.parametrize(
    ("auth", "message"),
    [
        ({"api_keys": []}, "auth.api_keys: mode strict with no key refuses everyone"),
        ({}, "auth.api_keys: mode strict with no key refuses everyone"),
        ({"mode": "none", "api_keys": [{"hash": HASH}]}, "auth.api_keys: mode none checks no key"),
        ({"api_keys": [{"hash": KEY}]}, "is not a key hash"),
        ({"api_keys": [{"hash": "sha256:abc"}]}, "is not a key hash"),
        ({"api_keys": [{"hash": HASH}, {"hash": HASH}]}, "auth.api_keys: the same hash is listed twice"),
        ({"mode": "open"}, "auth.mode"),
        ({"api_keys": [{"hash": HASH}], "metrics": "public"}, "auth.metrics"),
    ],
    ids=[
        "no keys",
        "keys left out",
        "keys with none",
        "a key not a hash",
        "short hash",
        "twice",
        "bad mode",
        "bad metrics",
    ],
)
def test_auth_config_errors_name_the_key_and_never_echo_a_key(auth: dict[str, Any], message: str) -> None:
    doc = {"auth": auth}
    errors = "\n".join(_errors(doc))
    assert message in errors
    assert errors.count("auth.") >= 1
    assert KEY not in errors


def test_keys_new_prints_a_key_and_its_hash() -> None:
    r = subprocess.run([sys.executable, "-m", "evalsi", "keys", "new", "--name", "ci", "--json"],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    made = json.loads(r.stdout)
    assert made["key"].startswith("evk_") and len(made["key"]) > 40
    assert made["hash"] == hash_of(made["key"]) and made["name"] == "ci"
    text = subprocess.run([sys.executable, "-m", "evalsi", "keys", "new"], capture_output=True, text=True, timeout=60)
    assert "api_keys:" in text.stderr and "sha256:" in text.stderr


def test_a_missing_hash_variable_is_reported_once_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EVALSI_TEST_UNSET_HASH", raising=False)
    errors = _errors({"auth": {"api_keys": [{"hash": "${env:EVALSI_TEST_UNSET_HASH}"}]}})
    auth_errors = [e for e in errors if e.startswith("auth.")]
    assert len(auth_errors) == 1 and "EVALSI_TEST_UNSET_HASH" in auth_errors[0], errors


def test_refusals_and_anonymous_requests_are_counted(collector: Collector) -> None:
    httpx.get(collector.api + "/api/v1/traces")
    httpx.get(collector.api + "/api/v1/traces", headers=_bearer(OTHER_KEY))
    httpx.post(collector.http + "/v1/traces", json={})
    with grpc.insecure_channel(collector.grpc) as channel, pytest.raises(grpc.RpcError):
        export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
        export(b"", metadata=(("authorization", f"Bearer {OTHER_KEY}"),), timeout=10)
    metrics = httpx.get(collector.metrics).text
    refused = {
        line.split("{", 1)[1].split("}", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("evalsi_auth_refused_requests_total{")
    }
    assert refused.get('reason="missing",surface="api"', 0) >= 1, refused
    assert refused.get('reason="unknown key",surface="api"', 0) >= 1, refused
    assert refused.get('reason="missing",surface="otlp_http"', 0) >= 1, refused
    assert refused.get('reason="unknown key",surface="otlp_grpc"', 0) >= 1, refused


def test_an_exporter_endpoint_is_logged_without_its_password() -> None:
    from evalsi.auth import without_password

    assert without_password("https://user:s3cret@collector:4318") == "https://user:***@collector:4318"
    assert without_password("https://user:p@ss@collector/x") == "https://user:***@collector/x"
    assert without_password("collector:4317") == "collector:4317"
    assert without_password("http://user@collector") == "http://user@collector"
