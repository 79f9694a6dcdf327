"""The `langfuse` exporter against a local server that checks every request against Langfuse's published API.

No Langfuse server can run here (it needs Postgres, ClickHouse, Redis and S3): `FakeLangfuse` (tests/fake_langfuse.py)
enforces what the public API documents for `POST /api/public/scores` and the OTLP endpoint
`POST /api/public/otel/v1/traces`, and upserts scores by `id` as Langfuse does.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_langfuse import PK, SK, FakeLangfuse
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from pydantic import ValidationError
from running_collector import FIXTURES, serve_config, start_collector

from evalsi.collector.builtin import load_builtin_components
from evalsi.component import REGISTRY, Settings
from evalsi.exporters.langfuse import LangfuseConfig, LangfuseExporter, score_id
from evalsi.model.score import Score, ScoreBatch
from evalsi.model.span import BatchKind, Span, SpanBatch
from evalsi.receivers.otlp.decode import decode_traces_protobuf
from evalsi.runtime.telemetry import SelfMetrics

TRACE = "0af7651916cd43dd8448eb211c80319c"
SPAN = "b7ad6b7169203331"
FAST_RETRY = {"initial_interval": "10ms", "max_interval": "50ms", "max_elapsed_time": "5s"}


@pytest.fixture
def langfuse() -> Iterator[FakeLangfuse]:
    with FakeLangfuse() as fake:
        yield fake


def exporter(host: str, **config: Any) -> tuple[LangfuseExporter, SelfMetrics]:
    metrics = SelfMetrics()
    config = {"flush_interval": "10ms", "retry_on_failure": FAST_RETRY, **config}
    cfg = LangfuseConfig(host=host, public_key=PK, secret_key=SK, **config)
    return LangfuseExporter(cfg, Settings("langfuse", metrics, logging.getLogger("test.langfuse"))), metrics


def sample(metrics: SelfMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, {"exporter": "langfuse", **labels}) or 0.0


def refused(metrics: SelfMetrics, kind: str, reason: str) -> float:
    return sample(metrics, "evalsi_exporter_items_refused_total", kind=kind, reason=reason)


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
    assert factory.cls is LangfuseExporter and set(factory.signals) == {"traces", "scores"}


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


# --- spans to the OTLP endpoint --------------------------------------------------------------------


def capture(scenario: str) -> list[Span]:
    decoded = decode_traces_protobuf((FIXTURES / "otel-openai-v2" / f"{scenario}.pb").read_bytes())
    assert decoded.rejected == 0
    return decoded.batch.spans


def received(langfuse: FakeLangfuse) -> list[Span]:
    return [s for req in langfuse.span_requests for s in decode_traces_protobuf(req.SerializeToString()).batch.spans]


def run_spans(exp: LangfuseExporter, *batches: SpanBatch) -> None:
    async def go() -> None:
        await exp.start()
        for b in batches:
            await exp.consume(b)
        await exp.shutdown()

    asyncio.run(go())


@pytest.mark.parametrize("compression", ["gzip", "none"])
def test_sampled_spans_go_to_the_otlp_endpoint_as_documented(langfuse: FakeLangfuse, compression: str) -> None:
    spans = capture("chat_tools")
    spans[0].sampled = False
    exp, metrics = exporter(langfuse.host, compression=compression)
    run_spans(
        exp,
        SpanBatch(spans),
        SpanBatch(capture("chat_simple"), kind=BatchKind.SESSION),  # forwarded already, as their traces
        SpanBatch(spans[1:], revision=True),  # same OTLP fields, only canonical ones added
    )
    assert langfuse.violations == []
    for s in spans:
        s.sampled = True  # evalsi's flag, not OTLP's: compare the rest
    assert received(langfuse) == spans[1:]  # every OTLP field: ids, times, attributes, events, resource, scope
    headers = langfuse.span_headers[0]
    assert headers["x-langfuse-ingestion-version"] == "4"
    assert headers.get("Content-Encoding") == ("gzip" if compression == "gzip" else None)
    assert sample(metrics, "otelcol_exporter_sent_spans_total") == len(spans) - 1
    assert sample(metrics, "otelcol_exporter_queue_size") == 0


def test_spans_are_batched_by_span_batch_size(langfuse: FakeLangfuse) -> None:
    spans = [s for scenario in ("chat_tools", "chat_simple", "chat_error", "chat_pii") for s in capture(scenario)]
    assert len(spans) > 4
    exp, _ = exporter(langfuse.host, span_batch_size=2)
    run_spans(exp, SpanBatch(spans))
    assert langfuse.violations == []
    assert [len(r.resource_spans[0].scope_spans[0].spans) for r in langfuse.span_requests][:2] == [2, 2]
    assert len(langfuse.spans) == len(spans)


def test_a_503_on_spans_is_retried_and_the_spans_arrive_once() -> None:
    with FakeLangfuse(span_failures=[503, 502]) as langfuse:
        spans = capture("chat_tools")
        exp, metrics = exporter(langfuse.host)
        run_spans(exp, SpanBatch(spans))
    assert langfuse.violations == []
    assert len(langfuse.span_headers) == 3  # two refusals, then the one accepted request
    assert len(langfuse.span_requests) == 1
    assert received(langfuse) == spans
    assert sample(metrics, "otelcol_exporter_sent_spans_total") == len(spans)
    assert sample(metrics, "otelcol_exporter_send_failed_spans_total") == 0


def test_a_full_span_queue_drops_the_oldest_spans_never_a_score() -> None:
    with FakeLangfuse() as gone:
        host = gone.host  # a port nothing listens on once the server is closed
    exp, metrics = exporter(host, span_queue_size=10, queue_size=100, shutdown_timeout="200ms", timeout="200ms")
    batches = [capture("chat_tools") for _ in range(20)]  # 80 spans

    async def go() -> int:
        await exp.start()
        await exp.consume_scores(ScoreBatch([verdict("relevance", value=1.0)]))
        for b in batches:
            await exp.consume(SpanBatch(b))
        held = exp.held
        await exp.shutdown()
        return held

    held = asyncio.run(go())
    assert held == 1 + 10  # the score and the 10 newest spans
    assert sample(metrics, "otelcol_exporter_enqueue_failed_spans_total") == 70
    assert sample(metrics, "otelcol_exporter_send_failed_spans_total") == 10  # still undeliverable at shutdown
    assert sample(metrics, "otelcol_exporter_enqueue_failed_scores_total") == 0  # spans never push out a score
    assert sample(metrics, "otelcol_exporter_send_failed_scores_total") == 1


def test_a_score_is_taken_for_a_trace_whose_spans_are_still_queued() -> None:
    # Langfuse documents that a score may name a trace it has not received yet; the exporter never holds a score
    # back for its spans, and the local server, like Langfuse, accepts it
    with FakeLangfuse(span_failures=[503] * 5) as langfuse:
        spans = capture("chat_tools")
        trace_id = spans[0].trace_id
        score = Score("relevance", value=1.0, trace_id=trace_id, span_id=spans[0].span_id, policy="p", evaluator="e")
        exp, metrics = exporter(langfuse.host, retry_on_failure={"initial_interval": "100ms", "max_interval": "100ms"})

        async def go() -> bool:
            await exp.start()
            await exp.consume(SpanBatch(spans))
            await exp.consume_scores(ScoreBatch([score]))
            deadline = time.monotonic() + 5
            while not langfuse.stored and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            spans_known_when_scored = any(t == trace_id for t, _ in langfuse.spans)
            await exp.shutdown()
            return spans_known_when_scored

        spans_known_when_scored = asyncio.run(go())
    assert not spans_known_when_scored
    assert list(langfuse.stored) == [score_id(score)]
    assert {t for t, _ in langfuse.spans} == {trace_id}  # and the spans followed once Langfuse took them
    assert sample(metrics, "otelcol_exporter_sent_spans_total") == len(spans)


# --- one bad item never blocks the others ---------------------------------------------------------


def test_scores_langfuse_refuses_or_that_cannot_be_encoded_are_dropped_alone(caplog: pytest.LogCaptureFixture) -> None:
    good = [verdict(f"check-{i}", value=i / 10, span_id=SPAN) for i in range(6)]
    not_finite = verdict("nan", value=float("nan"), span_id=SPAN)  # JSON has no NaN
    huge = verdict("huge", value=1.0, span_id=SPAN, explanation="x" * 10_000)  # over the server's body limit
    reserved = verdict("reserved", value=1.0, span_id=SPAN)  # answered 207 with an item error
    bad_id = verdict("bad-id", value=1.0, span_id="not-a-span-id")
    scores = [*good[:2], not_finite, huge, *good[2:4], reserved, bad_id, *good[4:]]

    def item_error(body: dict[str, Any]) -> str | None:
        return "score name is reserved" if body["name"] == "reserved" else None

    with FakeLangfuse(max_body=4000, item_error=item_error) as langfuse:
        exp, metrics = exporter(langfuse.host)
        started = time.monotonic()
        with caplog.at_level(logging.ERROR, logger="test.langfuse"):
            run(exp, scores)
        took = time.monotonic() - started
    assert langfuse.violations == []
    assert sorted(b["name"] for b in langfuse.stored.values()) == sorted(s.name for s in good)
    assert refused(metrics, "scores", "encode") == 2
    assert refused(metrics, "scores", "too large") == 1
    assert refused(metrics, "scores", "invalid") == 1
    assert sample(metrics, "otelcol_exporter_send_failed_scores_total") == 4
    assert sample(metrics, "otelcol_exporter_sent_scores_total") == 6
    # each sent once, none retried: the 6 good ones and the one answered 207, plus the one answered 413
    assert (len(langfuse.attempts), langfuse.too_large) == (7, 1)
    assert took < 2  # no backoff waited for any of them
    logged = {r.score: r for r in caplog.records if getattr(r, "reason", None)}
    assert set(logged) == {"nan", "huge", "reserved", "bad-id"}
    assert (logged["reserved"].trace_id, logged["reserved"].span_id) == (TRACE, SPAN)


def test_spans_langfuse_refuses_or_that_cannot_be_encoded_are_dropped_alone() -> None:
    spans = [s for scenario in ("chat_tools", "chat_simple", "chat_error", "chat_pii") for s in capture(scenario)]
    short_id, huge, unencodable = spans[1], spans[3], spans[5]
    short_id.trace_id = "abcd"  # hex, but 2 bytes: the OTLP endpoint refuses the request
    huge.attributes = {**huge.attributes, "blob": "x" * 30_000}  # over the server's body limit
    unencodable.attributes = {**unencodable.attributes, "too.big": 2**70}  # not an int64
    bad = (short_id, huge, unencodable)
    with FakeLangfuse(max_body=20_000) as langfuse:
        exp, metrics = exporter(langfuse.host, compression="none")
        run_spans(exp, SpanBatch(spans))
    # the one request that held the short id, each time before it was alone
    assert set(langfuse.violations) == {"span without a 16-byte trace id and an 8-byte span id"}
    assert sorted(langfuse.spans) == sorted((s.trace_id, s.span_id) for s in spans if s not in bad)
    assert refused(metrics, "spans", "invalid") == 1
    assert refused(metrics, "spans", "too large") == 1
    assert refused(metrics, "spans", "encode") == 1
    assert sample(metrics, "otelcol_exporter_send_failed_spans_total") == 3
    assert sample(metrics, "otelcol_exporter_sent_spans_total") == len(spans) - 3
    assert len(langfuse.span_headers) + langfuse.too_large <= 2 * (len(spans) - 1) - 1  # bounded: no retry as is


def test_the_senders_survive_unexpected_errors_and_say_so(
    langfuse: FakeLangfuse, caplog: pytest.LogCaptureFixture
) -> None:
    class Flaky(asyncio.Event):
        """The score sender's wake-up event, failing once: a bug outside any one send."""

        failed = False

        def clear(self) -> None:
            if not Flaky.failed:
                Flaky.failed = True
                raise RuntimeError("a bug in the loop")
            super().clear()

    exp, metrics = exporter(langfuse.host)
    exp._queue._senders[0].wake = Flaky()  # the scores sender's
    real_send_score = exp._send_score

    async def send_score(item: Any) -> None:
        if item.name == "unlucky":
            raise RuntimeError("a bug in one send")
        await real_send_score(item)

    exp._send_score = send_score  # type: ignore[method-assign]
    scores = [verdict(f"check-{i}", value=1.0) for i in range(3)] + [verdict("unlucky", value=1.0)]
    with caplog.at_level(logging.ERROR, logger="test.langfuse"):
        run(exp, scores)
    assert sorted(b["name"] for b in langfuse.stored.values()) == ["check-0", "check-1", "check-2"]
    assert sample(metrics, "evalsi_exporter_sender_errors_total") == 2
    assert sample(metrics, "otelcol_exporter_send_failed_scores_total") == 1
    tracebacks = [r.exc_text or "" for r in caplog.records if r.exc_info]
    assert any("a bug in the loop" in t for t in tracebacks)
    assert any("a bug in one send" in t for t in tracebacks)


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


def test_serve_writes_policy_scores_and_spans_to_langfuse_with_keys_from_env(
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
    pipelines["traces"]["exporters"] = ["clickhouse", "langfuse"]
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
        while time.monotonic() < deadline and not (langfuse.stored and len(langfuse.spans) >= 2):
            time.sleep(0.1)
    finally:
        c.stop()
    assert langfuse.violations == []
    assert {(t, s.name) for (t, _), s in langfuse.spans.items()} == {
        (trace_id, "handle request"),
        (trace_id, "chat gpt-4o-mini"),
    }
    [stored] = langfuse.stored.values()
    assert stored["traceId"] == trace_id
    assert (stored["traceId"], stored.get("observationId")) in {(t, sp) for t, sp in langfuse.spans} | {
        (trace_id, None)
    }
    assert (stored["name"], stored["metadata"]["policy"]) == ("contains", "support-answers")
    assert stored["dataType"] in {"BOOLEAN", "NUMERIC"}
