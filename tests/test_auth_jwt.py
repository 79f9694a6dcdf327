"""JWT bearer tokens in the `auth` section, and the principal (who, which project) of every request: a running
`evalsi serve` takes a good token on OTLP/HTTP, OTLP/gRPC (the OpenTelemetry SDK's exporters) and the API, and refuses
a bad one (expired, another audience or issuer, an algorithm not allowed, an unknown key, no `exp`, a forged
signature) with 401 / UNAUTHENTICATED, counting the reason; the issuer's keys from a file or a URL (rotated keys
picked up on an unknown `kid`, once a minute at most); `identify()` of API keys with projects; and the config errors,
each naming its key."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from google.rpc import code_pb2, status_pb2
from jwt.algorithms import ECAlgorithm, RSAAlgorithm
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from running_collector import Collector, serve_config, start_collector, wait_until

from evalsi.auth import (
    ANONYMOUS_PRINCIPAL,
    ApiKeyConfig,
    AuthConfig,
    Authenticator,
    JwtConfig,
    Principal,
    Refusal,
    Unauthenticated,
    gate,
    new_key,
    principal_from_metadata,
)
from evalsi.collector.config import ConfigError, parse_config
from evalsi.runtime.telemetry import SelfMetrics

ISSUER = "https://issuer.test"
AUDIENCE = "evalsi"
KEY, HASH = new_key()  # an API key beside the tokens

RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())
OTHER_RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)  # not the issuer's
NEXT_RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)  # the issuer's after a rotation


def public_jwk(private: Any, kid: str) -> dict[str, Any]:
    algorithm = RSAAlgorithm if isinstance(private, rsa.RSAPrivateKey) else ECAlgorithm
    jwk = algorithm.to_jwk(private.public_key(), as_dict=True)
    return {**jwk, "kid": kid, "use": "sig"}


JWKS = {"keys": [public_jwk(RSA_KEY, "rsa-1"), public_jwk(EC_KEY, "ec-1")]}


def claims(**changes: Any) -> dict[str, Any]:
    """A good token's claims; a change to None leaves that claim out."""
    now = int(time.time())
    base = {"iss": ISSUER, "aud": AUDIENCE, "sub": "ci-bot", "evalsi_project": "team-a", "iat": now,
            "exp": now + 300}  # fmt: skip
    return {k: v for k, v in {**base, **changes}.items() if v is not None}


def token(alg: str = "RS256", kid: str | None = "rsa-1", key: Any = None, **changes: Any) -> str:
    if key is None:
        key = EC_KEY if alg.startswith("ES") else RSA_KEY
    headers = {"kid": kid} if kid is not None else {}
    return jwt.encode(claims(**changes), key, algorithm=alg, headers=headers)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def alg_none_token() -> str:
    header = _b64(json.dumps({"alg": "none", "typ": "JWT", "kid": "rsa-1"}).encode())
    return f"{header}.{_b64(json.dumps(claims()).encode())}."


def tampered_payload() -> str:
    """A good token whose payload is changed (to another project) under the issuer's signature."""
    header, _, signature = token().split(".")
    return f"{header}.{_b64(json.dumps(claims(evalsi_project='admin')).encode())}.{signature}"


def tampered_signature() -> str:
    header, payload, signature = token().split(".")
    raw = bytearray(base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4)))
    raw[10] ^= 0xFF
    return f"{header}.{payload}.{_b64(bytes(raw))}"


def bearer(credential: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential}"}


def jwt_section(jwks_file: Path, **extra: Any) -> dict[str, Any]:
    return {"jwks_file": str(jwks_file), "issuer": ISSUER, "audience": AUDIENCE, **extra}


def write_jwks(path: Path, jwks: dict[str, Any] = JWKS) -> Path:
    path.write_text(json.dumps(jwks))
    return path


# --- end to end: a running collector --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collector]:
    tmp = tmp_path_factory.mktemp("jwt")
    cfg = serve_config(tmp / "store")
    cfg["auth"] = {
        "mode": "strict",
        "api_keys": [{"hash": HASH, "name": "reader", "project": "ops"}],
        "jwt": jwt_section(write_jwks(tmp / "jwks.json")),
    }
    c = start_collector(tmp, cfg)
    yield c
    assert c.stop() == 0


def _send(exporter: Any, name: str) -> str:
    provider = TracerProvider(resource=Resource.create({"service.name": "jwt-test"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("t").start_as_current_span(name) as span:
        trace_id = format(span.get_span_context().trace_id, "032x")
    provider.shutdown()
    return trace_id


def _stored(c: Collector, trace_id: str) -> bool:
    """Whether the trace is stored in the tokens' project (team-a): what a good token reads back."""
    r = httpx.get(f"{c.api}/api/v1/traces/{trace_id}", headers=bearer(token()))
    return r.status_code == 200 and bool(r.json().get("spans"))


def _refused(c: Collector) -> dict[tuple[str, str], float]:
    """evalsi_auth_refused_requests_total by (surface, reason)."""
    found = {}
    for line in httpx.get(c.metrics).text.splitlines():
        if line.startswith("evalsi_auth_refused_requests_total{"):
            labels = dict(
                part.split("=", 1) for part in line.split("{", 1)[1].split("}", 1)[0].split(",") if "=" in part
            )
            found[(labels["surface"].strip('"'), labels["reason"].strip('"'))] = float(line.rsplit(" ", 1)[1])
    return found


def test_a_good_token_is_taken_on_otlp_http_grpc_and_the_api(collector: Collector) -> None:
    for alg, kid in (("RS256", "rsa-1"), ("ES256", "ec-1")):
        good = token(alg, kid)
        via_http = _send(HttpExporter(endpoint=collector.http + "/v1/traces", headers=bearer(good)), f"http {alg}")
        via_grpc = _send(GrpcExporter(endpoint=collector.grpc, insecure=True,
                                      headers=(("authorization", f"Bearer {good}"),)), f"grpc {alg}")  # fmt: skip
        for trace_id in (via_http, via_grpc):
            assert wait_until(lambda t=trace_id: _stored(collector, t)), alg
        r = httpx.get(f"{collector.api}/api/v1/traces/{via_grpc}", headers=bearer(good))
        assert r.status_code == 200 and r.json()["spans"], r.text
        # the reader's API key is for another project (ops): the token's traces are not its to read
        assert httpx.get(f"{collector.api}/api/v1/traces/{via_grpc}", headers=bearer(KEY)).status_code == 404
        assert httpx.get(collector.api + "/api/v1/traces", headers=bearer(good)).status_code == 200


def test_a_forged_token_sent_by_the_sdk_is_not_stored(collector: Collector) -> None:
    forged = token(key=OTHER_RSA_KEY)  # the issuer's kid, another key's signature
    via_http = _send(HttpExporter(endpoint=collector.http + "/v1/traces", headers=bearer(forged)), "forged http")
    via_grpc = _send(GrpcExporter(endpoint=collector.grpc, insecure=True,
                                  headers=(("authorization", f"Bearer {forged}"),)), "forged grpc")  # fmt: skip
    good = _send(HttpExporter(endpoint=collector.http + "/v1/traces", headers=bearer(token())), "after forged")
    assert wait_until(lambda: _stored(collector, good))
    assert not _stored(collector, via_http) and not _stored(collector, via_grpc)


BAD_TOKENS = {
    "expired": (lambda: token(exp=int(time.time()) - 120), "expired"),
    "wrong audience": (lambda: token(aud="another-service"), "wrong_audience"),
    "wrong issuer": (lambda: token(iss="https://elsewhere.test"), "wrong_issuer"),
    "HS256 with a secret": (
        lambda: jwt.encode(
            claims(), "a-shared-secret-of-more-than-32-bytes!", algorithm="HS256", headers={"kid": "rsa-1"}
        ),
        "algorithm_not_allowed",
    ),
    "alg none": (alg_none_token, "algorithm_not_allowed"),
    "unknown kid": (lambda: token(kid="rsa-9"), "unknown_kid"),
    "no exp": (lambda: token(exp=None), "missing_claim"),
    "tampered payload": (tampered_payload, "invalid"),
    "tampered signature": (tampered_signature, "invalid"),
    "another key": (lambda: token(key=OTHER_RSA_KEY), "invalid"),
    "no project": (lambda: token(evalsi_project=None), "no_project"),
    "not a jwt": (lambda: "abc.def.ghi", "invalid"),
}


@pytest.mark.parametrize("case", list(BAD_TOKENS))
def test_a_bad_token_is_refused_on_every_listener_and_counted(collector: Collector, case: str) -> None:
    make, reason = BAD_TOKENS[case]
    bad = make()
    before = _refused(collector)

    body = ExportTraceServiceRequest().SerializeToString()
    r = httpx.post(collector.http + "/v1/traces", content=body,
                   headers={"Content-Type": "application/x-protobuf", **bearer(bad)})  # fmt: skip
    assert r.status_code == 401, r.content
    assert r.headers["www-authenticate"].startswith("Bearer")
    status = status_pb2.Status.FromString(r.content)
    assert status.code == code_pb2.UNAUTHENTICATED
    assert bad not in status.message

    api = httpx.get(collector.api + "/api/v1/traces", headers=bearer(bad))
    assert api.status_code == 401 and bad not in api.text

    with grpc.insecure_channel(collector.grpc) as channel:
        export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
        with pytest.raises(grpc.RpcError) as refused:
            export(body, metadata=(("authorization", f"Bearer {bad}"),), timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert bad not in (refused.value.details() or "")

    after = _refused(collector)
    for surface in ("otlp_http", "api", "otlp_grpc"):
        assert after.get((surface, reason), 0) - before.get((surface, reason), 0) == 1, (surface, reason, after)


@pytest.mark.parametrize("case", list(BAD_TOKENS))
def test_identify_gives_the_reason_of_each_bad_token(tmp_path: Path, case: str) -> None:
    make, why = BAD_TOKENS[case]
    metrics = SelfMetrics()
    auth = Authenticator(AuthConfig(jwt=JwtConfig(**jwt_section(write_jwks(tmp_path / "jwks.json")))), metrics)
    with pytest.raises(Refusal) as refused:
        auth.identify(f"Bearer {make()}", "api")
    assert refused.value.reason == why
    assert (
        metrics.registry.get_sample_value("evalsi_auth_refused_requests_total", {"surface": "api", "reason": why}) == 1
    )


def test_the_refusal_says_what_is_wrong_without_quoting_the_token(collector: Collector) -> None:
    expired = token(exp=int(time.time()) - 120)
    detail = httpx.get(collector.api + "/api/v1/traces", headers=bearer(expired)).json()["detail"]
    assert "expired" in detail and expired not in detail
    detail = httpx.get(collector.api + "/api/v1/traces", headers=bearer(token(aud="x"))).json()["detail"]
    assert "`aud`" in detail


def test_the_api_key_still_works_beside_tokens(collector: Collector) -> None:
    assert httpx.get(collector.api + "/api/v1/traces", headers=bearer(KEY)).status_code == 200
    assert httpx.get(collector.api + "/api/v1/traces", headers=bearer(new_key()[0])).status_code == 401
    missing = httpx.get(collector.api + "/api/v1/traces")
    assert missing.status_code == 401 and "JWT" in missing.json()["detail"]


def test_no_token_is_ever_logged(collector: Collector) -> None:
    good = token()
    httpx.get(collector.api + "/api/v1/traces", headers=bearer(good))
    httpx.get(collector.api + "/api/v1/traces", headers=bearer(token(aud="x")))
    text = collector.log_path.read_text()
    for part in good.split("."):
        assert part not in text
    assert KEY not in text


# --- the issuer's keys from a URL -----------------------------------------------------------------------------------


class JwksServer:
    """A JWKS endpoint on loopback: serves `jwks` (changed by a test to rotate keys), counts requests, fails with
    `status` when set."""

    def __init__(self, jwks: dict[str, Any]) -> None:
        self.jwks = jwks
        self.status = 200
        self.hits = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.hits += 1
                body = json.dumps(server.jwks).encode()
                self.send_response(server.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/.well-known/jwks.json"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def jwks_server() -> Iterator[JwksServer]:
    s = JwksServer({"keys": [public_jwk(RSA_KEY, "rsa-1")]})
    yield s
    s.close()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def url_auth(server: JwksServer, clock: Clock, metrics: SelfMetrics | None = None, **extra: Any) -> Authenticator:
    config = AuthConfig(jwt={"jwks_url": server.url, "issuer": ISSUER, "audience": AUDIENCE, **extra})
    return Authenticator(config, metrics, clock=clock)


def reason(auth: Authenticator, credential: str | None) -> str:
    with pytest.raises(Refusal) as refused:
        auth.identify(None if credential is None else f"Bearer {credential}")
    return refused.value.reason


def test_a_jwks_url_is_fetched_at_the_first_token_and_then_cached(jwks_server: JwksServer) -> None:
    clock = Clock()
    auth = url_auth(jwks_server, clock)
    assert jwks_server.hits == 0, "nothing is fetched before a token needs it"
    assert auth.identify(f"Bearer {token()}") == Principal("ci-bot", "team-a", "jwt")
    for _ in range(5):
        auth.identify(f"Bearer {token()}")
    assert jwks_server.hits == 1


def test_a_rotated_key_is_picked_up_on_an_unknown_kid_once_a_minute_at_most(jwks_server: JwksServer) -> None:
    clock = Clock()
    auth = url_auth(jwks_server, clock)
    assert auth.identify(f"Bearer {token()}").via == "jwt"
    jwks_server.jwks = {"keys": [public_jwk(RSA_KEY, "rsa-1"), public_jwk(NEXT_RSA_KEY, "rsa-2")]}
    rotated = token(kid="rsa-2", key=NEXT_RSA_KEY)

    clock.now += 61
    assert auth.identify(f"Bearer {rotated}").name == "ci-bot", "the new kid made evalsi fetch the keys again"
    assert jwks_server.hits == 2

    # an unknown kid within the minute after a fetch fetches nothing: tokens with made-up kids cannot flood the issuer
    jwks_server.jwks = {"keys": [public_jwk(NEXT_RSA_KEY, "rsa-2"), public_jwk(OTHER_RSA_KEY, "rsa-3")]}
    clock.now += 30
    for _ in range(3):
        assert reason(auth, token(kid="rsa-3", key=OTHER_RSA_KEY)) == "unknown_kid"
    assert jwks_server.hits == 2
    clock.now += 31
    assert auth.identify(f"Bearer {token(kid='rsa-3', key=OTHER_RSA_KEY)}").via == "jwt"
    assert jwks_server.hits == 3
    assert reason(auth, token(kid="rsa-1")) == "unknown_kid", "a key the issuer removed is refused"


def test_the_jwks_is_refreshed_every_jwks_refresh(jwks_server: JwksServer) -> None:
    clock = Clock()
    auth = url_auth(jwks_server, clock, jwks_refresh="2m")
    auth.identify(f"Bearer {token()}")
    clock.now += 119
    auth.identify(f"Bearer {token()}")
    assert jwks_server.hits == 1
    jwks_server.jwks = {"keys": [public_jwk(NEXT_RSA_KEY, "rsa-2")]}
    clock.now += 2
    assert reason(auth, token()) == "unknown_kid", "the refresh dropped the key the issuer no longer lists"
    assert jwks_server.hits == 2


def test_a_jwks_that_cannot_be_fetched_keeps_the_keys_there_were(jwks_server: JwksServer) -> None:
    clock = Clock()
    metrics = SelfMetrics()
    jwks_server.status = 503
    auth = url_auth(jwks_server, clock, metrics)
    with pytest.raises(Refusal) as refused:
        auth.identify(f"Bearer {token()}", "api")
    assert refused.value.reason == "jwks_unavailable"
    assert (
        metrics.registry.get_sample_value(
            "evalsi_auth_refused_requests_total", {"surface": "api", "reason": "jwks_unavailable"}
        )
        == 1
    )
    assert reason(auth, token()) == "jwks_unavailable" and jwks_server.hits == 1, "no second try within the minute"
    jwks_server.status = 200
    clock.now += 61
    assert auth.identify(f"Bearer {token()}").via == "jwt"
    jwks_server.status = 500
    clock.now += 301  # the refresh fails: the keys loaded before still check tokens
    assert auth.identify(f"Bearer {token()}").via == "jwt"
    assert jwks_server.hits == 3


def test_a_collector_takes_tokens_checked_against_a_served_jwks(tmp_path: Path, jwks_server: JwksServer) -> None:
    cfg = serve_config(tmp_path / "store")
    cfg["auth"] = {"jwt": {"jwks_url": jwks_server.url, "issuer": ISSUER, "audience": AUDIENCE}}
    c = start_collector(tmp_path, cfg)
    try:
        good = token()
        trace_id = _send(HttpExporter(endpoint=c.http + "/v1/traces", headers=bearer(good)), "via a served jwks")
        assert wait_until(lambda: bool(httpx.get(f"{c.api}/api/v1/traces/{trace_id}", headers=bearer(good))
                                       .json().get("spans")))  # fmt: skip
        assert jwks_server.hits == 1
        assert httpx.get(c.api + "/api/v1/traces", headers=bearer(token(kid="nope"))).status_code == 401
        assert httpx.get(c.api + "/api/v1/traces", headers=bearer(KEY)).status_code == 401, "no api_keys here"
    finally:
        assert c.stop() == 0


# --- identify(): principals -----------------------------------------------------------------------------------------


def keys_auth(mode: str = "strict") -> tuple[Authenticator, dict[str, str]]:
    a, b, c = new_key(), new_key(), new_key()
    config = AuthConfig(
        mode=mode,
        api_keys=[
            ApiKeyConfig(hash=a[1], name="checkout", project="shop"),
            ApiKeyConfig(hash=b[1], name="ci"),
            ApiKeyConfig(hash=c[1], project="team-b"),
        ],
    )
    return Authenticator(config), {"checkout": a[0], "ci": b[0], "unnamed": c[0]}


def test_an_api_key_identifies_its_name_and_project() -> None:
    auth, keys = keys_auth()
    assert auth.identify(f"Bearer {keys['checkout']}") == Principal("checkout", "shop", "api_key")
    assert auth.identify(f"bearer  {keys['ci']} ") == Principal("ci", "default", "api_key")
    unnamed = auth.identify(f"Bearer {keys['unnamed']}")
    assert unnamed.project == "team-b" and unnamed.via == "api_key"
    assert unnamed.name.startswith("sha256:") and keys["unnamed"] not in unnamed.name
    assert auth.check(f"Bearer {keys['checkout']}").authenticated, "the older check goes through identify"


@pytest.mark.parametrize(
    ("header", "why"),
    [
        (None, "missing"),
        ("", "missing"),
        ("Bearer", "malformed"),
        ("Basic dXNlcjpwYXNz", "malformed"),
        (f"Bearer {new_key()[0]}", "unknown key"),
        (f"Bearer {token()}", "unknown key"),
    ],
    ids=["none", "empty", "bearer alone", "basic", "another key", "a jwt without auth.jwt"],
)
def test_identify_refuses_with_a_reason(header: str | None, why: str) -> None:
    auth, _ = keys_auth()
    with pytest.raises(Refusal) as refused:
        auth.identify(header)
    assert refused.value.reason == why
    assert isinstance(refused.value, Unauthenticated)


def test_optional_mode_and_mode_none_give_the_anonymous_principal() -> None:
    auth, keys = keys_auth("optional")
    assert auth.identify(None) == Principal("anonymous", "default", "anonymous") == ANONYMOUS_PRINCIPAL
    assert auth.identify(f"Bearer {keys['checkout']}").project == "shop"
    with pytest.raises(Refusal):
        auth.identify(f"Bearer {new_key()[0]}")
    none = Authenticator(AuthConfig(mode="none"))
    assert none.identify(f"Bearer {new_key()[0]}") == ANONYMOUS_PRINCIPAL


def file_auth(tmp_path: Path, **extra: Any) -> Authenticator:
    return Authenticator(AuthConfig(jwt=JwtConfig(**jwt_section(write_jwks(tmp_path / "jwks.json"), **extra))))


def test_a_token_identifies_its_subject_and_project(tmp_path: Path) -> None:
    auth = file_auth(tmp_path)
    assert auth.identify(f"Bearer {token()}") == Principal("ci-bot", "team-a", "jwt")
    assert auth.identify(f"Bearer {token('ES256', 'ec-1', sub='svc')}") == Principal("svc", "team-a", "jwt")
    assert reason(auth, token(evalsi_project=None)) == "no_project"
    assert reason(auth, token(evalsi_project="Team A")) == "bad_project"
    assert reason(auth, token(evalsi_project=["a"])) == "bad_project"
    assert reason(auth, token(sub=None)) == "missing_claim"
    assert reason(auth, token(nbf=int(time.time()) + 600)) == "not_yet_valid"
    assert reason(auth, token("ES256", "rsa-1")) == "invalid", "an EC signature under the RSA key's kid"
    assert reason(auth, token(kid=None)) == "unknown_kid", "no kid, and the issuer has two keys"


def test_a_tokens_only_collector_says_so(tmp_path: Path) -> None:
    auth = file_auth(tmp_path)
    for header, why, says in ((None, "missing", "`Authorization: Bearer <JWT>`"),
                              ("Basic dXNlcjpwYXNz", "malformed", "`Bearer <JWT>`"),
                              (f"Bearer {KEY}", "unknown key", "tokens (JWT) only")):  # fmt: skip
        with pytest.raises(Refusal) as refused:
            auth.identify(header)
        assert (refused.value.reason, says in str(refused.value)) == (why, True), str(refused.value)
        assert "evk_" not in str(refused.value) and KEY not in str(refused.value)


def test_the_claims_and_the_default_project_are_configurable(tmp_path: Path) -> None:
    auth = file_auth(tmp_path, project_claim="tenant", name_claim="client_id", default_project="shared",
                     audience=["evalsi", "evalsi-eu"])  # fmt: skip
    assert auth.identify(f"Bearer {token(client_id='app-1', tenant='shop')}") == Principal("app-1", "shop", "jwt")
    assert auth.identify(f"Bearer {token(client_id='app-1', aud='evalsi-eu')}").project == "shared"
    assert reason(auth, token()) == "missing_claim", "no client_id"


def test_leeway_allows_a_little_clock_skew(tmp_path: Path) -> None:
    just_expired = token(exp=int(time.time()) - 10)
    assert file_auth(tmp_path).identify(f"Bearer {just_expired}").via == "jwt"
    assert reason(file_auth(tmp_path, leeway="0s"), just_expired) == "expired"


def test_algorithms_is_an_allowlist(tmp_path: Path) -> None:
    auth = file_auth(tmp_path, algorithms=["ES256"])
    assert auth.identify(f"Bearer {token('ES256', 'ec-1')}").via == "jwt"
    assert reason(auth, token()) == "algorithm_not_allowed"
    ps = file_auth(tmp_path, algorithms=["PS256"])
    assert ps.identify(f"Bearer {token('PS256')}").via == "jwt", "an RSA key without `alg` checks PS256 too"


def test_principal_from_metadata_reads_the_grpc_authorization(tmp_path: Path) -> None:
    metrics = SelfMetrics()
    config = AuthConfig(api_keys=[ApiKeyConfig(hash=HASH, name="reader", project="ops")],
                        jwt=JwtConfig(**jwt_section(write_jwks(tmp_path / "jwks.json"))))  # fmt: skip
    auth = Authenticator(config, metrics)
    pairs = (("user-agent", "grpc-python"), ("authorization", f"Bearer {token()}"))
    assert principal_from_metadata(auth, pairs) == Principal("ci-bot", "team-a", "jwt")

    class Metadatum:  # what grpc.aio's invocation_metadata() holds
        def __init__(self, key: str, value: str) -> None:
            self.key, self.value = key, value

    assert principal_from_metadata(auth, [Metadatum("authorization", f"Bearer {KEY}")]).project == "ops"
    with pytest.raises(Refusal) as refused:
        principal_from_metadata(auth, ())
    assert refused.value.reason == "missing"
    assert principal_from_metadata(None, ()) == ANONYMOUS_PRINCIPAL
    # the interceptor counted the call already: the handler's look-up counts nothing
    assert (
        metrics.registry.get_sample_value(
            "evalsi_auth_refused_requests_total", {"surface": "otlp_grpc", "reason": "missing"}
        )
        is None
    )


def test_gate_puts_the_principal_in_the_scope(tmp_path: Path) -> None:
    seen: list[Any] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope.get("evalsi.principal"))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    config = AuthConfig(api_keys=[ApiKeyConfig(hash=HASH, name="reader", project="ops")],
                        jwt=JwtConfig(**jwt_section(write_jwks(tmp_path / "jwks.json"))))  # fmt: skip

    async def requests() -> list[int]:
        statuses = []
        gated = gate(app, Authenticator(config), surface="api", open_paths=["/healthz"])
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gated), base_url="http://t") as client:
            for path, headers in (("/x", bearer(token())), ("/x", bearer(KEY)), ("/healthz", {}), ("/x", {})):
                statuses.append((await client.get(path, headers=headers)).status_code)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gate(app, None, surface="api")),
                                     base_url="http://t") as client:  # fmt: skip
            statuses.append((await client.get("/x")).status_code)
        return statuses

    assert asyncio.run(requests()) == [200, 200, 200, 401, 200]
    assert seen == [
        Principal("ci-bot", "team-a", "jwt"),
        Principal("reader", "ops", "api_key"),
        ANONYMOUS_PRINCIPAL,
        ANONYMOUS_PRINCIPAL,
    ]


# --- the config -----------------------------------------------------------------------------------------------------

AROUND: dict[str, Any] = {
    "receivers": {"otlp": {}},
    "exporters": {"clickhouse": {}},
    "service": {"pipelines": {"traces": {"receivers": ["otlp"], "exporters": ["clickhouse"]}}},
}


def _errors(auth: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as e:
        parse_config({**AROUND, "auth": auth})
    return e.value.errors


@pytest.fixture(scope="module")
def jwks_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_jwks(tmp_path_factory.mktemp("jwks") / "jwks.json")


def test_a_jwt_section_alone_is_a_valid_strict_config(jwks_file: Path) -> None:
    config = parse_config({**AROUND, "auth": {"jwt": jwt_section(jwks_file)}})
    assert config.auth is not None and config.auth.mode == "strict" and config.auth.api_keys == []
    jwt_config = config.auth.jwt
    assert jwt_config is not None
    assert (jwt_config.algorithms, jwt_config.leeway, jwt_config.jwks_refresh) == (["RS256", "ES256"], 30.0, 300.0)
    assert (jwt_config.project_claim, jwt_config.name_claim, jwt_config.default_project) == ("evalsi_project", "sub",
                                                                                              None)  # fmt: skip
    for url in ("https://issuer.example.com/jwks", "http://127.0.0.1:8080/jwks", "http://localhost/jwks",
                "http://[::1]:9000/jwks"):  # fmt: skip
        parse_config({**AROUND, "auth": {"jwt": {"jwks_url": url, "issuer": ISSUER, "audience": AUDIENCE}}})


def test_no_keys_and_no_jwt_says_either_will_do() -> None:
    [error] = [e for e in _errors({"mode": "optional"}) if e.startswith("auth.")]
    assert error.startswith("auth.api_keys: mode optional with no key refuses everyone") and "`jwt`" in error


CONFIG_ERRORS = {
    "missing jwks file": ({"jwks_file": "/nonexistent/jwks.json"}, "auth.jwt.jwks_file: /nonexistent/jwks.json does"),
    "jwks file not json": ({"jwks_file": "NOT_JSON"}, "auth.jwt.jwks_file: ", "is not JSON"),
    "jwks file not a jwks": ({"jwks_file": "NOT_JWKS"}, "auth.jwt.jwks_file: ", "not a JWKS"),
    "private key in jwks": ({"jwks_file": "PRIVATE"}, "auth.jwt.jwks_file: ", "holds a private key"),
    "both sources": ({"jwks_url": "https://issuer.test/jwks"}, "auth.jwt: give exactly one of `jwks_file`"),
    "no source": ({"jwks_file": None}, "auth.jwt: give exactly one of `jwks_file`"),
    "http url": ({"jwks_file": None, "jwks_url": "http://issuer.test/jwks"}, "auth.jwt.jwks_url: ", "plain http"),
    "ftp url": ({"jwks_file": None, "jwks_url": "ftp://issuer.test/jwks"}, "auth.jwt.jwks_url: ", "not an https URL"),
    "no issuer": ({"issuer": None}, "auth.jwt.issuer: Field required"),
    "no audience": ({"audience": None}, "auth.jwt.audience: Field required"),
    "empty audience": ({"audience": ""}, "auth.jwt.audience: must not be empty"),
    "HS256": ({"algorithms": ["RS256", "HS256"]}, "auth.jwt.algorithms: HS256 is symmetric", "shared secret"),
    "alg none": ({"algorithms": ["none"]}, "auth.jwt.algorithms: `none` is an unsigned token"),
    "unknown alg": ({"algorithms": ["RS1"]}, "auth.jwt.algorithms: 'RS1' is not an algorithm"),
    "no alg": ({"algorithms": []}, "auth.jwt.algorithms: list one algorithm at least"),
    "bad leeway": ({"leeway": "soon"}, "auth.jwt.leeway: invalid duration"),
    "refresh too often": ({"jwks_refresh": "10s"}, "auth.jwt.jwks_refresh: at least 1m"),
    "bad default project": ({"default_project": "Team A"}, "auth.jwt.default_project: 'Team A' is not a project name"),
    "empty claim": ({"project_claim": ""}, "auth.jwt.project_claim: must not be empty"),
    "unknown key": ({"scopes": ["read"]}, "auth.jwt.scopes: unknown key"),
}


@pytest.mark.parametrize("case", list(CONFIG_ERRORS))
def test_a_jwt_config_error_names_its_key(case: str, jwks_file: Path, tmp_path: Path) -> None:
    change, *expected = CONFIG_ERRORS[case]
    files = {
        "NOT_JSON": "{keys: nope",
        "NOT_JWKS": json.dumps([{"kty": "RSA"}]),
        "PRIVATE": json.dumps({"keys": [RSAAlgorithm.to_jwk(RSA_KEY, as_dict=True)]}),
    }
    section: dict[str, Any] = jwt_section(jwks_file)
    for key, value in change.items():
        if isinstance(value, str) and value in files:
            (tmp_path / "jwks.json").write_text(files[value])
            value = str(tmp_path / "jwks.json")
        section[key] = value
    section = {k: v for k, v in section.items() if v is not None}
    errors = [e for e in _errors({"jwt": section}) if e.startswith("auth")]
    assert len(errors) == 1, errors  # one message, not also "mode strict with no key"
    for part in expected:
        assert part in errors[0], errors
    if case == "private key in jwks":
        assert str(RSAAlgorithm.to_jwk(RSA_KEY, as_dict=True)["d"]) not in errors[0]


@pytest.mark.parametrize(
    ("auth", "message"),
    [
        (
            {"api_keys": [{"hash": HASH, "project": "Team A"}]},
            "auth.api_keys.0.project: 'Team A' is not a project name",
        ),
        ({"api_keys": [{"hash": HASH, "project": "-x"}]}, "auth.api_keys.0.project: '-x' is not a project name"),
        ({"api_keys": [{"hash": HASH, "project": "a" * 64}]}, "auth.api_keys.0.project: "),
        (
            {"mode": "none", "jwt": {"jwks_url": "https://i.test/j", "issuer": ISSUER, "audience": AUDIENCE}},
            "auth.jwt: mode none checks no bearer token",
        ),
    ],
    ids=["upper case and space", "leading dash", "64 characters", "jwt with mode none"],
)
def test_project_and_mode_errors_name_their_key(auth: dict[str, Any], message: str) -> None:
    assert message in "\n".join(_errors(auth))


def test_project_names_that_are_taken() -> None:
    for project in ("default", "team-a", "a", "0_x", "a" * 63):
        assert ApiKeyConfig(hash=HASH, project=project).project == project


# --- evalsi keys new --project --------------------------------------------------------------------------------------


def test_keys_new_takes_a_project() -> None:
    r = subprocess.run([sys.executable, "-m", "evalsi", "keys", "new", "--name", "ci", "--project", "team-a"],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "name: ci, project: team-a}" in r.stderr
    made = json.loads(subprocess.run([sys.executable, "-m", "evalsi", "keys", "new", "--project", "shop", "--json"],
                                     capture_output=True, text=True, timeout=60).stdout)  # fmt: skip
    assert made["project"] == "shop"
    config = AuthConfig(api_keys=[{"hash": made["hash"], "project": made["project"]}])
    assert Authenticator(config).identify(f"Bearer {made['key']}").project == "shop"
    bad = subprocess.run([sys.executable, "-m", "evalsi", "keys", "new", "--project", "Team A"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "is not a project name" in bad.stderr and "evk_" not in bad.stdout
