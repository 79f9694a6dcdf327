"""The `langfuse` exporter against a local server that checks every request against Langfuse's published API.

No Langfuse server can run here (it needs Postgres, ClickHouse, Redis and S3), so `FakeLangfuse` enforces what the
public API documents for `POST /api/public/scores` (CreateScoreRequest) and upserts by `id` as Langfuse does.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from pydantic import ValidationError
from running_collector import serve_config, start_collector

from evalsi.component import REGISTRY, Settings, load_builtin_components
from evalsi.score import Score, ScoreBatch
from evalsi.telemetry import SelfMetrics
from evalsi.writeback.langfuse import LangfuseConfig, LangfuseExporter, score_id

TRACE = "0af7651916cd43dd8448eb211c80319c"
SPAN = "b7ad6b7169203331"
PK, SK = "pk-lf-test", "sk-lf-test"
FAST_RETRY = {"initial_interval": "10ms", "max_interval": "50ms", "max_elapsed_time": "5s"}
DATA_TYPES = {"NUMERIC", "BOOLEAN", "CATEGORICAL"}


class FakeLangfuse:
    """Answers the scripted statuses first, then 200; stores accepted scores by id; records protocol violations."""

    def __init__(self, failures: list[int] | None = None) -> None:
        self.failures = list(failures or [])
        self.attempts: list[dict[str, Any]] = []
        self.stored: dict[str, dict[str, Any]] = {}
        self.violations: list[str] = []
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status, answer = fake.handle(self.path, dict(self.headers), raw)
                payload = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                if status in (429, 503):
                    self.send_header("Retry-After", "0")
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"http://127.0.0.1:{self.server.server_address[1]}"

    def check(self, path: str, headers: dict[str, str], raw: bytes) -> tuple[dict[str, Any], list[str]]:
        problems: list[str] = []
        if path != "/api/public/scores":
            problems.append(f"path {path}")
        expected = "Basic " + base64.b64encode(f"{PK}:{SK}".encode()).decode()
        if headers.get("Authorization") != expected:
            problems.append("auth")
        if not headers.get("Content-Type", "").startswith("application/json"):
            problems.append("content type")
        body = json.loads(raw)
        if not isinstance(body, dict):
            return {}, [*problems, "body is not one CreateScoreRequest object"]
        for key, kind in (("id", str), ("name", str), ("dataType", str)):
            if not isinstance(body.get(key), kind):
                problems.append(f"{key} missing or not {kind.__name__}")
        if "traceId" in body and not re.fullmatch(r"[0-9a-f]{32}", body["traceId"]):
            problems.append("traceId is not 32 hex")
        if "traceId" not in body and "sessionId" not in body:
            problems.append("neither traceId nor sessionId")
        if "observationId" in body and not re.fullmatch(r"[0-9a-f]{16}", body["observationId"]):
            problems.append("observationId is not 16 hex")
        data_type, value = body.get("dataType"), body.get("value")
        if data_type not in DATA_TYPES:
            problems.append(f"dataType {data_type}")
        if data_type == "NUMERIC" and (isinstance(value, bool) or not isinstance(value, int | float)):
            problems.append("NUMERIC value is not a number")
        if data_type == "BOOLEAN" and value not in (0, 1):
            problems.append("BOOLEAN value is not 0/1")
        if data_type == "CATEGORICAL" and not isinstance(value, str):
            problems.append("CATEGORICAL value is not a string")
        if "comment" in body and not isinstance(body["comment"], str):
            problems.append("comment is not a string")
        if "metadata" in body and not isinstance(body["metadata"], dict):
            problems.append("metadata is not an object")
        known = {"id", "traceId", "sessionId", "observationId", "datasetRunId", "name", "value", "dataType",
                 "comment", "metadata", "environment", "configId", "queueId", "timestamp"}  # fmt: skip
        problems += [f"unknown field {k}" for k in body if k not in known]
        return body, problems

    def handle(self, path: str, headers: dict[str, str], raw: bytes) -> tuple[int, dict[str, Any]]:
        with self.lock:
            body, problems = self.check(path, headers, raw)
            self.attempts.append(body)
            if problems:
                self.violations += problems
                return 400, {"message": "; ".join(problems)}
            if self.failures:
                status = self.failures.pop(0)
                return status, {"message": "scripted failure"}
            self.stored[body["id"]] = body  # Langfuse upserts a score by id
            return 200, {"id": body["id"]}

    def __enter__(self) -> FakeLangfuse:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def langfuse() -> Iterator[FakeLangfuse]:
    with FakeLangfuse() as fake:
        yield fake


def exporter(host: str, **config: Any) -> tuple[LangfuseExporter, SelfMetrics]:
    metrics = SelfMetrics()
    cfg = LangfuseConfig(
        host=host,
        public_key=PK,
        secret_key=SK,
        flush_interval="10ms",
        retry_on_failure=FAST_RETRY,
        **config,
    )
    return LangfuseExporter(cfg, Settings("langfuse", metrics, logging.getLogger("test.langfuse"))), metrics


def sample(metrics: SelfMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, {"exporter": "langfuse", **labels}) or 0.0


def verdict(name: str, **fields: Any) -> Score:
    return Score(name, trace_id=TRACE, policy="support-answers", evaluator=f"builtin/{name}", **fields)


def run(exp: LangfuseExporter, *batches: list[Score]) -> None:
    async def go() -> None:
        await exp.start()
        for b in batches:
            await exp.consume_scores(ScoreBatch(b))
        await exp.shutdown()

    asyncio.run(go())


def test_registered_for_the_scores_pipeline() -> None:
    load_builtin_components()
    factory = REGISTRY[("exporter", "langfuse")]
    assert factory.cls is LangfuseExporter and factory.signals == ("scores",)


def test_config_errors_name_the_key() -> None:
    with pytest.raises(ValidationError, match="host"):
        LangfuseConfig(host="langfuse:3000", public_key=PK, secret_key=SK)
    with pytest.raises(ValidationError, match="secret_key"):
        LangfuseConfig(host="http://langfuse:3000", public_key=PK, secret_key="")
    with pytest.raises(ValidationError, match="queue_size"):
        LangfuseConfig(host="http://langfuse:3000", public_key=PK, secret_key=SK, queue_size=0)


def test_scores_are_written_as_the_public_api_documents(langfuse: FakeLangfuse) -> None:
    exp, metrics = exporter(langfuse.host)
    relevance = verdict("relevance", value=0.8, span_id=SPAN.upper(), explanation="on topic", evaluator_version="2")
    contains = verdict("contains", passed=False, explanation="no refund policy", source="code")
    tone = verdict("tone", label="polite", source="llm_judge")
    skipped = verdict("faithfulness", outcome="skipped", reason="no content")
    errored = verdict("judge", outcome="error", reason="timeout")
    run(exp, [relevance, contains, tone, skipped, errored])

    assert langfuse.violations == []
    assert len(langfuse.stored) == 3
    by_name = {b["name"]: b for b in langfuse.stored.values()}
    r = by_name["relevance"]
    assert r["id"] == score_id(relevance)
    assert (r["traceId"], r["observationId"]) == (TRACE, SPAN)
    assert (r["dataType"], r["value"], r["comment"]) == ("NUMERIC", 0.8, "on topic")
    assert r["metadata"] == {
        "policy": "support-answers",
        "evaluator": "builtin/relevance",
        "evaluator_version": "2",
        "outcome": "scored",
        "reason": None,
        "source": "code",
    }
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", r["timestamp"])
    c = by_name["contains"]
    assert (c["dataType"], c["value"], c["comment"]) == ("BOOLEAN", 0, "no refund policy")
    assert "observationId" not in c  # a trace score
    t = by_name["tone"]
    assert (t["dataType"], t["value"], t["metadata"]["source"]) == ("CATEGORICAL", "polite", "llm_judge")

    assert sample(metrics, "otelcol_exporter_sent_scores_total") == 3
    assert sample(metrics, "evalsi_exporter_scores_not_sent_total", reason="skipped") == 1
    assert sample(metrics, "evalsi_exporter_scores_not_sent_total", reason="error") == 1
    assert sample(metrics, "otelcol_exporter_queue_size") == 0


def test_a_503_is_retried_with_the_same_id_and_the_score_is_stored_once() -> None:
    with FakeLangfuse(failures=[503, 429]) as langfuse:
        exp, metrics = exporter(langfuse.host)
        score = verdict("relevance", value=1.0, span_id=SPAN)
        run(exp, [score])
    assert langfuse.violations == []
    assert [a["id"] for a in langfuse.attempts] == [score_id(score)] * 3
    assert list(langfuse.stored) == [score_id(score)]
    assert sample(metrics, "otelcol_exporter_sent_scores_total") == 1
    assert sample(metrics, "otelcol_exporter_send_failed_scores_total") == 0


def test_a_replayed_score_keeps_its_id_so_langfuse_holds_it_once(langfuse: FakeLangfuse) -> None:
    first = verdict("relevance", value=0.5)
    again = verdict("relevance", value=0.5)  # the same verdict re-evaluated later: same key
    other_trial = verdict("relevance", value=0.5, run_id="run-1", trial=1)
    exp, _ = exporter(langfuse.host)
    run(exp, [first], [again, other_trial])
    assert len(langfuse.attempts) == 3
    assert len(langfuse.stored) == 2
    assert score_id(first) == score_id(again) != score_id(other_trial)


def test_a_400_is_not_retried_and_is_counted() -> None:
    with FakeLangfuse(failures=[400]) as langfuse:
        exp, metrics = exporter(langfuse.host)
        run(exp, [verdict("relevance", value=0.3)])
    assert len(langfuse.attempts) == 1
    assert langfuse.stored == {}
    assert sample(metrics, "otelcol_exporter_send_failed_scores_total") == 1
    assert sample(metrics, "otelcol_exporter_sent_scores_total") == 0


def test_batches_send_every_queued_score(langfuse: FakeLangfuse) -> None:
    exp, metrics = exporter(langfuse.host, batch_size=4)
    scores = [verdict(f"check-{i}", value=float(i)) for i in range(10)]
    run(exp, scores[:3], scores[3:])
    assert langfuse.violations == []
    assert {b["name"] for b in langfuse.stored.values()} == {s.name for s in scores}
    assert sample(metrics, "otelcol_exporter_sent_scores_total") == 10


def test_a_dead_host_never_blocks_consume_and_shutdown_ends() -> None:
    with FakeLangfuse() as gone:
        host = gone.host  # a port nothing listens on once the server is closed
    exp, metrics = exporter(host, queue_size=100, shutdown_timeout="300ms", timeout="200ms")

    async def go() -> tuple[float, float]:
        await exp.start()
        started = time.monotonic()
        for i in range(50):
            await exp.consume_scores(ScoreBatch([verdict(f"c{i}-{j}", value=1.0) for j in range(20)]))
        consumed = time.monotonic() - started
        assert exp.held <= 100
        started = time.monotonic()
        await exp.shutdown()
        return consumed, time.monotonic() - started

    consumed, shut = asyncio.run(go())
    assert consumed < 0.5
    assert shut < 3
    assert sample(metrics, "otelcol_exporter_enqueue_failed_scores_total") >= 900
    dropped = sample(metrics, "otelcol_exporter_enqueue_failed_scores_total")
    failed = sample(metrics, "otelcol_exporter_send_failed_scores_total")
    assert dropped + failed == 1000  # every score is accounted for: none sent, none lost silently


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
"""


def test_serve_writes_policy_scores_to_langfuse_with_keys_from_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, langfuse: FakeLangfuse
) -> None:
    monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", PK)
    monkeypatch.setenv("LANGFUSE_SECRET_KEY", SK)
    (tmp_path / "support.yaml").write_text(POLICY)
    cfg = serve_config(tmp_path / "store")
    cfg["processors"]["evaluate"] = {"policies": ["support.yaml"]}
    cfg["exporters"]["langfuse"] = {
        "host": langfuse.host,
        "public_key": "env:LANGFUSE_PUBLIC_KEY",
        "secret_key": "env:LANGFUSE_SECRET_KEY",
        "flush_interval": "50ms",
    }
    pipelines = cfg["service"]["pipelines"]
    cfg["processors"]["tail_sampling"] = {"decision_wait": "300ms"}
    pipelines["traces"]["processors"] = ["normalize", "tail_sampling", "evaluate"]
    pipelines["scores"] = {"exporters": ["langfuse"]}
    c = start_collector(tmp_path, cfg)
    try:
        provider = TracerProvider(resource=Resource.create({"service.name": "support"}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=c.http + "/v1/traces")))
        tracer = provider.get_tracer("support.app")
        with tracer.start_as_current_span("handle request") as root:
            root.set_attribute("app.route", "support")
            with tracer.start_as_current_span("chat gpt-4o-mini") as chat:
                chat.set_attribute("gen_ai.operation.name", "chat")
                chat.set_attribute("gen_ai.request.model", "gpt-4o-mini")
                question = [{"role": "user", "parts": [{"type": "text", "content": "Capital of France?"}]}]
                reply = [{"role": "assistant", "parts": [{"type": "text", "content": "Paris."}]}]
                chat.set_attribute("gen_ai.input.messages", json.dumps(question))
                chat.set_attribute("gen_ai.output.messages", json.dumps(reply))
            trace_id = format(root.get_span_context().trace_id, "032x")
        assert provider.force_flush(10_000)
        provider.shutdown()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not langfuse.stored:
            time.sleep(0.1)
    finally:
        c.stop()
    assert langfuse.violations == []
    [stored] = langfuse.stored.values()
    assert stored["traceId"] == trace_id
    assert (stored["name"], stored["metadata"]["policy"]) == ("contains", "support-answers")
    assert stored["dataType"] in {"BOOLEAN", "NUMERIC"}
