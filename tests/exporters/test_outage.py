"""Score delivery through a 30 s backend outage: every score arrives once in effect, and ingest goes on meanwhile.

The virtual-clock tests check that the default retry settings outlast a 30 s outage. The end-to-end test runs a real
`evalsi serve` whose scores go to a Langfuse stand-in (stopped: connection refused) and an OTLP/HTTP logs backend
(503) for 30 s, then back. Its speed counterpart is `benchmarks/outage.py`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_langfuse import PK, SK, FakeLangfuse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from otlp_logs_backend import OtlpLogsBackend
from running_collector import Collector, serve_config, start_collector

from evalsi.exporters import delivery
from evalsi.exporters.delivery import RetryConfig, SendFailed, deliver
from evalsi.exporters.langfuse import score_id
from evalsi.model.score import Score
from evalsi.runtime import backoff

OUTAGE_S = 30.0


# --- the default retry settings, on a virtual clock ----------------------------------------------------


def delivery_through_outage(
    monkeypatch: pytest.MonkeyPatch, jitter: float, outage_s: float, shutdown_at: float = float("inf")
) -> tuple[bool, list[float]]:
    """Run `deliver` with the default `RetryConfig` against a backend refusing for `outage_s` from the first attempt;
    `jitter` is what the shared backoff's `random.uniform(0.8, 1.2)` returns. Returns whether it delivered and
    when each attempt ran."""
    clock = [0.0]
    attempts: list[float] = []

    async def sleep(seconds: float) -> None:
        clock[0] += seconds

    async def attempt() -> None:
        attempts.append(clock[0])
        if clock[0] < outage_s:
            raise SendFailed("connection refused", retryable=True)

    monkeypatch.setattr(delivery.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(delivery.asyncio, "sleep", sleep)
    monkeypatch.setattr(backoff.random, "uniform", lambda lo, hi: jitter)

    def deadline() -> float:  # shutdown at `shutdown_at` gives the sender 1 s more
        return shutdown_at + 1.0 if clock[0] >= shutdown_at else float("inf")

    log = delivery.logging.getLogger("test.outage")
    coro = deliver(attempt, RetryConfig(), log=log, what="a score", deadline=deadline)
    try:
        coro.send(None)  # the fake sleep never suspends, so the whole loop runs in this one step
    except StopIteration as done:
        attempts.append(clock[0])  # when it returned
        return done.value, attempts
    raise AssertionError("deliver suspended on something other than its backoff")


@pytest.mark.parametrize("jitter", [0.8, 1.0, 1.2])
def test_default_retry_settings_outlast_a_30s_outage(monkeypatch: pytest.MonkeyPatch, jitter: float) -> None:
    delivered, (*attempts, _) = delivery_through_outage(monkeypatch, jitter, OUTAGE_S)
    assert delivered
    assert attempts[-2] < OUTAGE_S <= attempts[-1]
    # the first try after the backend is back comes within one max_interval (30 s, +20% jitter)
    assert attempts[-1] - OUTAGE_S <= RetryConfig().max_interval * 1.2


def test_default_retry_settings_give_up_on_an_outage_past_max_elapsed_time(monkeypatch: pytest.MonkeyPatch) -> None:
    delivered, (*attempts, _) = delivery_through_outage(monkeypatch, 1.0, 10 * RetryConfig().max_elapsed_time)
    assert not delivered
    assert attempts[-1] <= RetryConfig().max_elapsed_time


def test_a_shutdown_during_a_backoff_wait_ends_it_instead_of_sleeping_it_out(monkeypatch: pytest.MonkeyPatch) -> None:
    # attempts at 0, 5 and 15 s fail; the wait for 35 s starts at 15; at 20 s shutdown allows 1 s more
    delivered, (*attempts, returned) = delivery_through_outage(monkeypatch, 1.0, OUTAGE_S * 10, shutdown_at=20.0)
    assert not delivered
    assert attempts == [0.0, 5.0, 15.0]
    assert 20.0 <= returned < 21.0, "the retry due at 35 s cannot meet the shutdown deadline: dropped at once"


# --- end to end: `evalsi serve` through a real outage ------------------------------------------------

POLICY = """
apiVersion: evals.si/v1alpha1
kind: OnlineEvalPolicy
metadata: {name: support-answers}
spec:
  selector: span.attributes['app.route'] == 'support'
  sampling: {rate: 1.0}
  cascade:
    - ref: builtin/contains
      params: {any: [Paris]}
    - ref: builtin/latency
      params: {max_ms: 60000}
"""
# short waits so the test ends soon after the backends return; max_elapsed_time stays the default (300 s), and the
# default intervals are checked on the virtual clock above
TEST_RETRY = {"initial_interval": "1s", "max_interval": "2s"}


def _kv(key: str, value: str) -> KeyValue:
    kv = KeyValue(key=key)
    kv.value.string_value = value
    return kv


def support_trace(n: int, tag: int) -> tuple[str, bytes]:
    """One request: a root span on the support route and a chat span whose answer names Paris."""
    trace_id = tag.to_bytes(8, "big") + n.to_bytes(8, "big")
    end = time.time_ns()
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.append(_kv("service.name", "support"))
    ss = rs.scope_spans.add()
    ss.scope.name = "support.app"
    root, chat = ss.spans.add(), ss.spans.add()
    root.trace_id = chat.trace_id = trace_id
    root.span_id, chat.span_id = (2 * n + 1).to_bytes(8, "big"), (2 * n + 2).to_bytes(8, "big")
    chat.parent_span_id = root.span_id
    root.name, chat.name = "handle request", "chat gpt-4o-mini"
    root.start_time_unix_nano, root.end_time_unix_nano = end - 900_000_000, end
    chat.start_time_unix_nano, chat.end_time_unix_nano = end - 800_000_000, end - 100_000_000
    root.attributes.append(_kv("app.route", "support"))
    question = [{"role": "user", "parts": [{"type": "text", "content": f"Capital of France? ({n})"}]}]
    reply = [{"role": "assistant", "parts": [{"type": "text", "content": "Paris."}]}]
    chat.attributes.extend(
        [
            _kv("gen_ai.operation.name", "chat"),
            _kv("gen_ai.request.model", "gpt-4o-mini"),
            _kv("gen_ai.input.messages", json.dumps(question)),
            _kv("gen_ai.output.messages", json.dumps(reply)),
        ]
    )
    return trace_id.hex(), req.SerializeToString()


def metric(text: str, name: str, exporter: str) -> float:
    for line in text.splitlines():
        if line.startswith(f'{name}{{exporter="{exporter}"}} '):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


KEY_FIELDS = ("project", "trace_id", "span_id", "policy", "evaluator", "run_id", "trial")


def langfuse_id(stored: dict[str, Any]) -> str:
    """The Langfuse score id of a score read back from the store (`GET /api/v1/scores`)."""
    return score_id(Score(stored["name"], **{k: stored[k] for k in KEY_FIELDS}))


def send_for(c: Collector, client: httpx.Client, seconds: float, rate: float, start: int, tag: int) -> list[str]:
    """Send one trace every 1/rate s for `seconds`; every request must be taken (ingest never waits on exporters)."""
    ids: list[str] = []
    t0 = time.monotonic()
    n = start
    while time.monotonic() - t0 < seconds:
        trace_id, body = support_trace(n, tag)
        resp = client.post(c.http + "/v1/traces", content=body)
        assert resp.status_code == 200, f"trace {n}: HTTP {resp.status_code} {resp.text[:200]}"
        ids.append(trace_id)
        n += 1
        time.sleep(max(0.0, t0 + (n - start) / rate - time.monotonic()))
    return ids


def test_a_30s_backend_outage_loses_no_score_and_duplicates_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", PK)
    monkeypatch.setenv("LANGFUSE_SECRET_KEY", SK)
    (tmp_path / "support.yaml").write_text(POLICY)
    langfuse = FakeLangfuse().start()
    otlp = OtlpLogsBackend()
    cfg = serve_config(tmp_path / "store")
    cfg["processors"]["tail_sampling"] = {"decision_wait": "300ms"}
    cfg["processors"]["evaluate"] = {"policies": ["support.yaml"]}
    cfg["exporters"]["langfuse"] = {
        "host": langfuse.host,
        "public_key": "env:LANGFUSE_PUBLIC_KEY",
        "secret_key": "env:LANGFUSE_SECRET_KEY",
        "retry_on_failure": TEST_RETRY,
    }
    cfg["exporters"]["otlp/http"] = {
        "endpoint": otlp.endpoint,
        "protocol": "http/protobuf",
        "retry_on_failure": TEST_RETRY,
    }
    pipelines = cfg["service"]["pipelines"]
    pipelines["traces"]["processors"] = ["normalize", "tail_sampling", "evaluate"]
    pipelines["scores"] = {"exporters": ["clickhouse", "langfuse", "otlp/http"]}
    c = start_collector(tmp_path, cfg)
    tag = int.from_bytes(os.urandom(4), "big")
    try:
        with httpx.Client(timeout=10, headers={"Content-Type": "application/x-protobuf"}) as client:
            traces = send_for(c, client, 3, 10, 0, tag)
            langfuse.stop()  # connection refused from now on
            otlp.down = True  # 503
            down_at = time.time_ns()
            traces += send_for(c, client, OUTAGE_S, 10, len(traces), tag)
            up_at = time.time_ns()
            langfuse.start()  # the same port, what it stored kept
            otlp.down = False
            traces += send_for(c, client, 3, 10, len(traces), tag)
        assert c.wait_stored(2 * len(traces)) == 2 * len(traces)  # ingest went on through the outage

        # every score the collector made: its own store is the record
        deadline = time.monotonic() + 60
        produced: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            produced = httpx.get(c.api + "/api/v1/scores", params={"limit": 100_000}).json()["scores"]
            if {s["trace_id"] for s in produced} >= set(traces) and len(produced) >= 2 * len(traces):
                break
            time.sleep(0.5)
        for_langfuse = {langfuse_id(s) for s in produced if s["outcome"] == "scored"}
        for_otlp = {(s["trace_id"], s["span_id"], s["policy"], s["evaluator"], s["name"]) for s in produced}
        while time.monotonic() < deadline and not (set(langfuse.stored) >= for_langfuse and set(otlp.keys) >= for_otlp):
            time.sleep(0.5)
        metrics = httpx.get(c.metrics).text
    finally:
        c.stop()
        langfuse.stop()
        otlp.stop()

    assert {s["trace_id"] for s in produced} == set(traces)
    held_through = [s for s in produced if down_at <= s["timestamp_unix_nano"] <= up_at]
    assert len(held_through) >= OUTAGE_S * 10  # scores made while both backends refused: ~2 per trace
    assert otlp.refused > 0
    assert any("retrying" in e.get("msg", "") and e.get("logger", "").endswith("langfuse") for e in c.logs())

    # Langfuse: each score id once (it upserts by id; retries resend the same id)
    assert langfuse.violations == []
    assert set(langfuse.stored) == for_langfuse
    # OTLP: logs carry no id, so count distinct keys; a refused (503) request was not taken, so none came twice
    assert otlp.problems == []
    assert set(otlp.keys) == for_otlp
    assert max(otlp.keys.values()) == 1
    # and nothing was dropped or given up on
    assert metric(metrics, "otelcol_exporter_enqueue_failed_scores_total", "langfuse") == 0
    assert metric(metrics, "otelcol_exporter_send_failed_scores_total", "langfuse") == 0
    assert metric(metrics, "otelcol_exporter_sent_scores_total", "langfuse") == len(for_langfuse)
    assert metric(metrics, "otelcol_exporter_enqueue_failed_log_records_total", "otlp/http") == 0
    assert metric(metrics, "otelcol_exporter_send_failed_log_records_total", "otlp/http") == 0
    assert metric(metrics, "otelcol_exporter_sent_log_records_total", "otlp/http") == len(for_otlp)
