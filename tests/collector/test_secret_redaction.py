"""Credentials in a config never reach what evalsi prints: `evalsi validate` on configs whose errors quote a URL with
a password, a secret from the environment or a YAML line holding one; `evalsi serve` writing to a ClickHouse server
whose URL carries the password (its logs, `/api/v1/status`, `/readyz`, `/metrics`, the CLI reading that store)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from clickhouse_http import start_stand_in
from running_collector import EVALSI, serve_config, start_collector

from evalsi.collector.config import ConfigError, parse_config, redact, secret_values


def _validate(tmp: Path, *args: str, env: dict[str, str] | None = None) -> str:
    res = subprocess.run(
        [*EVALSI, "validate", *args], capture_output=True, text=True, timeout=120, cwd=tmp,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    assert res.returncode == 1, f"validate passed a bad config:\n{res.stdout}{res.stderr}"
    return res.stdout + res.stderr


def _pipeline(*exporters: str) -> dict[str, Any]:
    return {"traces": {"receivers": ["otlp"], "exporters": list(exporters)}}


def test_validate_prints_every_error_with_no_password_token_or_key_in_it(tmp_path: Path) -> None:
    secrets = {
        "TEST_OTLP_ENDPOINT": "grpc://u:s3cret-env-url-pw@collector:4317",
        "TEST_API_TOKEN": "s3cret-env-token",  # referenced where a number goes: the message quotes the value
    }
    config = {
        "receivers": {"otlp": {"protocols": {"http": {"endpoint": "127.0.0.1:0"}}}},
        "exporters": {
            "clickhouse": {"endpoint": "ftp://user:s3cret-ftp-pw@db.example:21/x", "password": "s3cret-field-pw"},
            "clickhouse/tls": {"endpoint": "http://default:s3cret%2Ftls-pw@db.example:8123", "tls": {}},
            "otlp": {
                "endpoint": "grpc://agent:s3cret-otlp-pw@collector:4317",
                "headers": {"authorization": "Bearer s3cret-header-token"},
            },
            "otlp/env": {"endpoint": "${env:TEST_OTLP_ENDPOINT}"},
            "langfuse": {
                "host": "ftp://pk:s3cret-langfuse-pw@langfuse",
                "public_key": "pk",
                "secret_key": "s3cret-langfuse-key",
            },
            "mlflow": {"tracking_uri": "file://u:p@ss-s3cret-mlflow-pw@/tmp"},
        },
        "service": {
            "workers": "${env:TEST_API_TOKEN}",
            "pipelines": _pipeline("clickhouse", "clickhouse/tls", "otlp", "otlp/env", "langfuse", "mlflow"),
        },
    }
    path = tmp_path / "evalsi.yaml"
    path.write_text(yaml.safe_dump(config))
    out = _validate(tmp_path, "-c", str(path), env=secrets)

    assert "s3cret" not in out, out
    # still says what is wrong, and where
    assert "exporters.clickhouse.endpoint: unsupported endpoint 'ftp://user:***@db.example:21/x'" in out, out
    assert "exporters.clickhouse/tls: tls: the endpoint 'http://default:***@db.example:8123'" in out, out
    assert "exporters.otlp.endpoint: unsupported endpoint 'grpc://agent:***@collector:4317'" in out, out
    assert "exporters.otlp/env.endpoint: unsupported endpoint 'grpc://u:***@collector:4317'" in out, out
    assert "exporters.langfuse.host: unsupported host 'ftp://pk:***@langfuse'" in out, out
    assert "exporters.mlflow.tracking_uri: unsupported tracking_uri 'file://u:***@/tmp'" in out, out
    assert "service.workers: '***' is not a number of workers" in out, out


def test_a_yaml_error_is_located_without_quoting_the_line_that_holds_a_password(tmp_path: Path) -> None:
    config = tmp_path / "evalsi.yaml"
    config.write_text("exporters:\n  clickhouse:\n    endpoint: http://db:8123\n    password: s3cret-yaml-pw: x\n")
    run = tmp_path / "run.yaml"
    run.write_text("apiVersion: evals.si/v1alpha1\nkind: EvalRun\nspec:\n  target:\n    api_key: s3cret-run-key: x\n")
    out = _validate(tmp_path, "-c", str(config), "-f", str(run))
    assert "s3cret" not in out, out
    assert "not valid YAML: mapping values are not allowed here (line 4, column 29)" in out, out
    assert "run.yaml: not YAML" in out, out


def test_config_errors_redact_what_the_document_holds_however_a_message_quotes_it() -> None:
    doc = {
        "receivers": {"otlp": {}},
        "exporters": {
            "clickhouse": {"endpoint": "ftp://default:p%40ss-s3cret@db/x", "password": "s3cret-pw"},
            "otlp": {"endpoint": "s3cret-pw://host", "headers": {"x-api-key": "s3cret-header"}},
        },
        "service": {"pipelines": _pipeline("clickhouse", "otlp")},
    }
    assert secret_values(doc) >= {"s3cret-pw", "s3cret-header", "p%40ss-s3cret", "p@ss-s3cret"}
    try:
        parse_config(doc)
    except ConfigError as e:
        text = str(e)
    else:
        raise AssertionError("the config is invalid")
    assert "s3cret" not in text, text
    assert "'ftp://default:***@db/x'" in text and "unsupported endpoint '***://host'" in text, text
    error = ConfigError(["a: p@ss-s3cret", "b: 's3cret-pw'"], secrets=["p@ss-s3cret", "s3cret-pw"])
    assert error.errors == ["a: ***", "b: '***'"]
    # free text: YAML lines, flow mappings, userinfo with an @ in the password; key paths and messages kept
    assert redact("    password: hunter22") == "    password: ***"
    assert redact("{api_key: sk-abc, token=xyz}") == "{api_key: ***"
    assert (
        redact("see https://u:p@ss@host/x and http://host:8123/x") == "see https://u:***@host/x and http://host:8123/x"
    )
    assert redact("exporters.clickhouse.password: Input should be a valid string") == (
        "exporters.clickhouse.password: Input should be a valid string"
    )
    assert redact("auth: api_keys: mode strict with no key refuses everyone") == (
        "auth: api_keys: mode strict with no key refuses everyone"
    )
    assert redact("a: 'ab' is short, ab stays elsewhere", ["ab"]) == "a: '***' is short, ab stays elsewhere"


def test_serve_on_a_server_whose_url_holds_the_password_never_shows_it(tmp_path: Path) -> None:
    password = "s3cret/serve-pw"  # written URL-encoded in the endpoint, as a URL needs
    encoded = "s3cret%2Fserve-pw"
    server = start_stand_in(tmp_path / "clickhouse", password=password)
    try:
        cfg = serve_config(tmp_path / "unused")
        endpoint = server.url.replace("http://", f"http://default:{encoded}@")
        cfg["exporters"]["clickhouse"] = {"endpoint": endpoint, "database": "redaction", "flush_interval": "100ms"}
        c = start_collector(tmp_path, cfg)
        try:
            seen = [
                httpx.get(c.api + path, timeout=30).text
                for path in ("/api/v1/status", "/readyz", "/healthz", "/api/v1/traces")
            ]
            seen.append(httpx.get(c.metrics, timeout=30).text)
            now = time.time_ns()
            span = {"traceId": os.urandom(16).hex(), "spanId": os.urandom(8).hex(), "name": "root", "kind": 2,
                    "startTimeUnixNano": str(now), "endTimeUnixNano": str(now + 1000)}  # fmt: skip
            body = {"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}
            assert httpx.post(c.http + "/v1/traces", json=body, timeout=30).status_code == 200
            assert c.wait_stored(1) == 1
            status = httpx.get(c.api + "/api/v1/status", timeout=30).json()
            assert status["store"].startswith("ClickHouse server at http://127.0.0.1:"), status
            listed = c.cli("traces", "list", api=False)  # the store read directly, with the config's URL
            seen += [listed.stdout, listed.stderr]
        finally:
            assert c.stop() == 0
        seen.append(c.log_path.read_text())
        assert '"msg": "ready"' in seen[-1]

        # a wrong password: the collector cannot start, and says so without the password it was given
        cfg["exporters"]["clickhouse"]["endpoint"] = server.url.replace("http://", "http://default:wr0ng-s3cret@")
        (tmp_path / "wrong").mkdir()
        path = tmp_path / "wrong" / "evalsi.yaml"
        path.write_text(yaml.safe_dump(cfg))
        refused = subprocess.run([*EVALSI, "serve", "-c", str(path)], capture_output=True, text=True, timeout=120)
        assert refused.returncode == 1 and "Authentication failed" in refused.stderr, refused.stderr
        seen += [refused.stdout, refused.stderr]
    finally:
        server.stop()
    for text in seen:
        assert password not in text and encoded not in text and "wr0ng-s3cret" not in text, text
