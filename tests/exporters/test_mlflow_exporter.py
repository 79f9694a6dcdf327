"""The `mlflow` exporter against a real `mlflow server` (sqlite backend, job execution off, loopback, port chosen here).

Spans and scores go through the exporter (or a real `evalsi serve`); what landed is read back with the MLflow client,
as a user would see it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from mlflow_server import free_port
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from pydantic import ValidationError
from running_collector import serve_config, start_collector

from evalsi.collector.builtin import load_builtin_components
from evalsi.component import REGISTRY, Settings
from evalsi.exporters import mlflow as mlflow_exporter
from evalsi.exporters.mlflow import KEY_METADATA, MlflowConfig, MlflowExporter, score_key
from evalsi.model.score import Score, ScoreBatch
from evalsi.model.span import Span, SpanBatch
from evalsi.runtime.telemetry import SelfMetrics

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Feedback

FAST_RETRY = {"initial_interval": "20ms", "max_interval": "100ms", "max_elapsed_time": "5s"}


def mlflow_client(uri: str) -> MlflowClient:
    """MLflow's client, imported when a test uses it (mlflow takes ~2 s to import, in every xdist worker)."""
    from mlflow import MlflowClient

    return MlflowClient(uri)


def exporter(uri: str, **config: Any) -> tuple[MlflowExporter, SelfMetrics]:
    metrics = SelfMetrics()
    cfg = MlflowConfig(tracking_uri=uri, flush_interval="20ms", retry_on_failure=FAST_RETRY, **config)
    return MlflowExporter(cfg, Settings("mlflow", metrics, logging.getLogger("test.mlflow"))), metrics


def sample(metrics: SelfMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, {"exporter": "mlflow", **labels}) or 0.0


def refused(metrics: SelfMetrics, kind: str, reason: str) -> float:
    return sample(metrics, "evalsi_exporter_items_refused_total", kind=kind, reason=reason)


def trace_spans(n_children: int = 1) -> tuple[str, list[Span]]:
    """A trace with a root span and `n_children` chat spans, fresh ids, one OTLP resource."""
    trace_id = os.urandom(16).hex()
    now = time.time_ns()
    resource = {"service.name": "support"}
    root = Span(
        trace_id,
        os.urandom(8).hex(),
        "",
        "handle request",
        "SERVER",
        now,
        now + 50_000_000,
        status_code="OK",
        resource_attributes=resource,
        scope_name="support.app",
    )
    children = [
        Span(
            trace_id,
            os.urandom(8).hex(),
            root.span_id,
            f"chat gpt-4o-mini {i}",
            "CLIENT",
            now + 1_000_000,
            now + 40_000_000,
            resource_attributes=resource,
            scope_name="support.app",
            attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o-mini"},
        )
        for i in range(n_children)
    ]
    return trace_id, [root, *children]


def verdict(name: str, trace_id: str, **fields: Any) -> Score:
    fields.setdefault("evaluator", f"builtin/{name}")
    return Score(name, trace_id=trace_id, policy="support-answers", **fields)


def run(exp: MlflowExporter, *steps: SpanBatch | ScoreBatch | float) -> None:
    """Start, feed spans and scores in order (a float: sleep that long), drain at shutdown."""

    async def go() -> None:
        await exp.start()
        for step in steps:
            if isinstance(step, SpanBatch):
                await exp.consume(step)
            elif isinstance(step, ScoreBatch):
                await exp.consume_scores(step)
            else:
                await asyncio.sleep(step)
        await exp.shutdown()

    asyncio.run(go())


def feedback(uri: str, trace_id: str) -> dict[str, Feedback]:
    """The trace's assessments as the MLflow client shows them, by name (each name at most once)."""
    assessments = mlflow_client(uri).get_trace(f"tr-{trace_id}").info.assessments
    by_name = {a.name: a for a in assessments}
    assert len(by_name) == len(assessments), [a.name for a in assessments]
    return by_name


def test_registered_for_traces_and_scores() -> None:
    load_builtin_components()
    factory = REGISTRY[("exporter", "mlflow")]
    assert factory.cls is MlflowExporter and factory.signals == ("traces", "scores")


def test_config_errors_name_the_key() -> None:
    with pytest.raises(ValidationError, match="tracking_uri"):
        MlflowConfig(tracking_uri="mlflow:5000")
    with pytest.raises(ValidationError, match="not both"):
        MlflowConfig(tracking_uri="http://mlflow:5000", experiment_id="1", experiment_name="evalsi")
    with pytest.raises(ValidationError, match="spans_per_second"):
        MlflowConfig(tracking_uri="http://mlflow:5000", spans_per_second=0)


def test_spans_and_scores_land_on_their_traces_and_spans(mlflow_uri: str) -> None:
    trace_a, spans_a = trace_spans(n_children=2)
    trace_b, spans_b = trace_spans()
    chat = spans_a[1]
    judged = verdict(
        "relevance",
        trace_a,
        value=0.8,
        span_id=chat.span_id.upper(),
        source="llm_judge",
        explanation="on topic",
        evaluator="builtin/llm-judge",
        evaluator_version="3",
    )
    contains = verdict("contains", trace_a, passed=False, explanation="no refund policy")
    tone = verdict("tone", trace_a, label="polite", source="human", evaluator="feedback/agent-7")
    failed = verdict("faithfulness", trace_b, outcome="error", reason="judge_timeout", explanation="judge: 504")
    skipped = verdict("pii", trace_b, outcome="skipped", reason="no content")
    exp, metrics = exporter(mlflow_uri, experiment_name="evalsi-test-landing")
    # scores arrive with their spans still queued: they must wait for them, not fail
    run(exp, SpanBatch(spans_a + spans_b), ScoreBatch([judged, contains, tone, failed, skipped]))

    client = mlflow_client(mlflow_uri)
    experiment = client.get_experiment_by_name("evalsi-test-landing")
    assert experiment is not None
    traces = client.search_traces(locations=[experiment.experiment_id])
    assert {t.info.trace_id for t in traces} >= {f"tr-{trace_a}", f"tr-{trace_b}"}
    trace = client.get_trace(f"tr-{trace_a}")
    assert {s.span_id for s in trace.data.spans} == {s.span_id for s in spans_a}

    got = feedback(mlflow_uri, trace_a)
    assert set(got) == {"relevance", "contains", "tone"}
    r = got["relevance"]
    assert (r.value, r.rationale, r.span_id) == (0.8, "on topic", chat.span_id)
    assert (r.source.source_type, r.source.source_id) == ("LLM_JUDGE", "builtin/llm-judge")
    assert r.metadata[KEY_METADATA] == score_key(judged)
    assert r.metadata["evalsi.policy"] == "support-answers"
    assert r.metadata["evalsi.evaluator"] == "builtin/llm-judge"
    assert r.metadata["evalsi.evaluator_version"] == "3"
    c = got["contains"]
    assert (c.value, c.rationale, c.span_id) == (False, "no refund policy", None)  # a trace-level score
    assert (c.source.source_type, c.source.source_id) == ("CODE", "builtin/contains")
    t = got["tone"]
    assert (t.value, t.source.source_type, t.source.source_id) == ("polite", "HUMAN", "feedback/agent-7")

    [f] = feedback(mlflow_uri, trace_b).values()  # the skipped verdict is not written
    assert f.name == "faithfulness" and f.value is None
    assert (f.error.error_code, f.error.error_message) == ("judge_timeout", "judge: 504")
    assert f.metadata["evalsi.outcome"] == "error"

    assert sample(metrics, "otelcol_exporter_sent_spans_total") == 5
    assert sample(metrics, "otelcol_exporter_sent_scores_total") == 4
    assert sample(metrics, "evalsi_exporter_scores_not_sent_total", reason="skipped") == 1
    assert sample(metrics, "otelcol_exporter_send_failed_scores_total") == 0
    assert sample(metrics, "otelcol_exporter_queue_size") == 0


def test_replayed_scores_add_no_duplicate(mlflow_uri: str) -> None:
    trace_id, spans = trace_spans()
    scores = [
        verdict("relevance", trace_id, value=0.5, span_id=spans[1].span_id),
        verdict("contains", trace_id, passed=True),
    ]
    exp, _ = exporter(mlflow_uri, experiment_name="evalsi-test-replay")
    # the same verdicts twice in one process: the second time from the keys this process remembers
    run(exp, SpanBatch(spans), ScoreBatch(scores), 0.3, ScoreBatch([verdict("contains", trace_id, passed=True)]))
    assert set(feedback(mlflow_uri, trace_id)) == {"relevance", "contains"}

    # a restarted collector knows nothing: it reads the keys on the trace before writing
    again, metrics = exporter(mlflow_uri, experiment_name="evalsi-test-replay")
    another_trial = verdict("relevance", trace_id, value=0.7, span_id=spans[1].span_id, run_id="run-1", trial=1)
    run(again, SpanBatch(spans), ScoreBatch([*scores, another_trial]))
    trace = mlflow_client(mlflow_uri).get_trace(f"tr-{trace_id}")
    assert sorted(s.span_id for s in trace.data.spans) == sorted(s.span_id for s in spans)  # spans re-sent: once
    assessments = trace.info.assessments
    assert sorted(a.metadata[KEY_METADATA] for a in assessments) == sorted(
        score_key(s) for s in [*scores, another_trial]
    )
    assert sample(metrics, "evalsi_exporter_scores_not_sent_total", reason="already in mlflow") == 2
    assert sample(metrics, "otelcol_exporter_sent_scores_total") == 1


def test_a_score_for_a_trace_mlflow_does_not_have_yet_arrives_with_its_spans(mlflow_uri: str) -> None:
    trace_id, spans = trace_spans()
    score = verdict("relevance", trace_id, value=1.0)
    exp, metrics = exporter(mlflow_uri, experiment_name="evalsi-test-late")

    async def go() -> tuple[int, int]:
        await exp.start()
        await exp.consume_scores(ScoreBatch([score]))
        await asyncio.sleep(1.0)  # MLflow answers "no such trace" meanwhile; the score must wait
        held_before = exp.held
        sent_before = int(sample(metrics, "otelcol_exporter_sent_scores_total"))
        await exp.consume(SpanBatch(spans))  # the spans come later, e.g. after tail sampling decided
        await exp.shutdown()
        return held_before, sent_before

    held_before, sent_before = asyncio.run(go())
    assert (held_before, sent_before) == (1, 0)
    [f] = feedback(mlflow_uri, trace_id).values()
    assert (f.name, f.value) == ("relevance", 1.0)
    assert sample(metrics, "otelcol_exporter_send_failed_scores_total") == 0


def test_a_score_whose_trace_never_comes_is_dropped_and_counted_after_trace_wait(mlflow_uri: str) -> None:
    trace_id, _ = trace_spans()
    exp, metrics = exporter(mlflow_uri, trace_wait="500ms", shutdown_timeout="3s")
    started = time.monotonic()
    run(exp, ScoreBatch([verdict("relevance", trace_id, value=1.0)]), 1.0)
    assert time.monotonic() - started < 3
    assert sample(metrics, "otelcol_exporter_send_failed_scores_total") == 1
    assert sample(metrics, "otelcol_exporter_sent_scores_total") == 0


def test_spans_are_paced_to_the_rate_limit_and_consume_never_waits(mlflow_uri: str) -> None:
    traces = [trace_spans(n_children=9) for _ in range(30)]  # 300 spans
    spans = [s for _, trace in traces for s in trace]
    exp, metrics = exporter(mlflow_uri, experiment_id="0", spans_per_second=200, batch_size=50)

    async def go() -> tuple[float, float]:
        await exp.start()
        started = time.monotonic()
        for i in range(0, len(spans), 10):
            await exp.consume(SpanBatch(spans[i : i + 10]))
        consumed = time.monotonic() - started
        while sample(metrics, "otelcol_exporter_sent_spans_total") < len(spans) and time.monotonic() - started < 30:
            await asyncio.sleep(0.02)
        sent = time.monotonic() - started
        await exp.shutdown()
        return consumed, sent

    consumed, sent = asyncio.run(go())
    assert consumed < 0.1
    # 300 spans at 200/s, the first batch of 50 at once: at least (300 - 50) / 200 = 1.25 s
    assert sent >= 1.2, sent
    assert sample(metrics, "otelcol_exporter_sent_spans_total") == 300
    found = mlflow_client(mlflow_uri).search_traces(locations=["0"], max_results=100)
    assert {f"tr-{t}" for t, _ in traces} <= {t.info.trace_id for t in found}


def test_a_span_or_score_mlflow_refuses_is_dropped_alone_and_the_others_land(
    mlflow_uri: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    trace_id, spans = trace_spans(n_children=6)
    root = spans[0]
    # MLflow cannot convert a span without a span id: it answers 422 for the whole request (it stores all or none)
    no_span_id = Span(trace_id, "", root.span_id, "no span id", "CLIENT", root.start_time_unix_nano,
                      root.end_time_unix_nano, resource_attributes=root.resource_attributes)  # fmt: skip
    # an attribute that is not an int64: it cannot be encoded
    unencodable = Span(trace_id, os.urandom(8).hex(), root.span_id, "too big", "CLIENT", root.start_time_unix_nano,
                       root.end_time_unix_nano, attributes={"n": 2**70})  # fmt: skip
    good = [verdict(f"check-{i}", trace_id, value=i / 10, span_id=spans[1 + i].span_id) for i in range(3)]
    not_finite = verdict("nan", trace_id, value=float("nan"))  # JSON has no NaN
    # evalsi's own bodies are all ones MLflow takes: one it refuses (400 INVALID_PARAMETER_VALUE) is made here
    refused_by_mlflow = verdict("refused", trace_id, value=1.0, span_id=spans[4].span_id)
    real_body = mlflow_exporter.assessment_body

    def assessment_body(score: Score) -> dict[str, Any]:
        body = real_body(score)
        if score.name == "refused":
            body["assessment"]["create_time"] = "not a time"
        return body

    monkeypatch.setattr(mlflow_exporter, "assessment_body", assessment_body)
    exp, metrics = exporter(mlflow_uri, experiment_id="0")
    started = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="test.mlflow"):
        run(
            exp,
            SpanBatch([*spans[:3], no_span_id, *spans[3:], unencodable]),
            ScoreBatch([good[0], not_finite, good[1], refused_by_mlflow, good[2]]),
        )
    took = time.monotonic() - started

    trace = mlflow_client(mlflow_uri).get_trace(f"tr-{trace_id}")
    assert sorted(s.span_id for s in trace.data.spans) == sorted(s.span_id for s in spans)
    assert set(feedback(mlflow_uri, trace_id)) == {s.name for s in good}
    assert refused(metrics, "spans", "invalid") == 1
    assert refused(metrics, "spans", "encode") == 1
    assert refused(metrics, "scores", "encode") == 1
    assert refused(metrics, "scores", "invalid") == 1
    assert sample(metrics, "otelcol_exporter_sent_spans_total") == len(spans)
    assert sample(metrics, "otelcol_exporter_send_failed_spans_total") == 2
    assert sample(metrics, "otelcol_exporter_sent_scores_total") == 3
    assert sample(metrics, "otelcol_exporter_send_failed_scores_total") == 2
    assert took < 10  # nothing waited out a retry
    logged = [r for r in caplog.records if getattr(r, "reason", None)]
    assert {(r.trace_id, r.span_id) for r in logged} == {
        (trace_id, ""),  # the span without an id; the NaN score, a trace score
        (trace_id, unencodable.span_id),
        (trace_id, spans[4].span_id),
    }


def test_the_senders_survive_unexpected_errors_and_say_so(caplog: pytest.LogCaptureFixture) -> None:
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there: only the bugs matter here
    exp, metrics = exporter(uri, shutdown_timeout="300ms", timeout="200ms")

    async def pace(n: int) -> None:
        raise RuntimeError("a bug in the span sender")

    exp._pace = pace  # type: ignore[method-assign]

    async def keys(trace_id: str) -> set[str] | None:
        raise RuntimeError("a bug in the score writer")

    exp._keys_in_mlflow = keys  # type: ignore[method-assign]
    trace_id, spans = trace_spans()
    with caplog.at_level(logging.ERROR, logger="test.mlflow"):
        run(exp, SpanBatch(spans), 0.2, ScoreBatch([verdict("relevance", trace_id, value=1.0)]), 0.2)
    assert sample(metrics, "evalsi_exporter_sender_errors_total") == 2
    assert sample(metrics, "otelcol_exporter_send_failed_spans_total") == len(spans)
    assert sample(metrics, "otelcol_exporter_send_failed_scores_total") == 1
    assert exp.held == 0
    tracebacks = [r.exc_text or "" for r in caplog.records if r.exc_info]
    assert any("a bug in the span sender" in t for t in tracebacks)
    assert any("a bug in the score writer" in t for t in tracebacks)


def test_a_dead_mlflow_never_blocks_consume_and_shutdown_ends() -> None:
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    exp, metrics = exporter(uri, queue_size=100, shutdown_timeout="300ms", timeout="200ms")

    async def go() -> tuple[float, float]:
        await exp.start()
        started = time.monotonic()
        for i in range(50):
            trace_id, spans = trace_spans()
            await exp.consume(SpanBatch(spans))
            await exp.consume_scores(ScoreBatch([verdict(f"c{i}-{j}", trace_id, value=1.0) for j in range(20)]))
        consumed = time.monotonic() - started
        assert exp.held <= 200
        started = time.monotonic()
        await exp.shutdown()
        return consumed, time.monotonic() - started

    consumed, shut = asyncio.run(go())
    assert consumed < 0.5
    assert shut < 3
    spans = [sample(metrics, f"otelcol_exporter_{m}_spans_total") for m in ("sent", "send_failed", "enqueue_failed")]
    scores = [sample(metrics, f"otelcol_exporter_{m}_scores_total") for m in ("sent", "send_failed", "enqueue_failed")]
    assert spans[0] == scores[0] == 0
    assert sum(spans) == 100 and sum(scores) == 1000  # every item accounted for: none sent, none lost silently


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


def test_serve_forwards_traces_and_writes_policy_scores_to_mlflow(tmp_path: Path, mlflow_uri: str) -> None:
    (tmp_path / "support.yaml").write_text(POLICY)
    cfg = serve_config(tmp_path / "store")
    cfg["processors"]["evaluate"] = {"policies": ["support.yaml"]}
    cfg["processors"]["tail_sampling"] = {"decision_wait": "300ms"}
    cfg["exporters"]["mlflow"] = {
        "tracking_uri": mlflow_uri,
        "experiment_name": "evalsi-test-serve",
        "flush_interval": "50ms",
    }
    pipelines = cfg["service"]["pipelines"]
    pipelines["traces"]["processors"] = ["normalize", "tail_sampling", "evaluate"]
    pipelines["traces"]["exporters"] = ["clickhouse", "mlflow"]
    pipelines["scores"] = {"exporters": ["clickhouse", "mlflow"]}
    c = start_collector(tmp_path, cfg)
    client = mlflow_client(mlflow_uri)
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
        assessments: list[Any] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not assessments:
            try:
                assessments = client.get_trace(f"tr-{trace_id}").info.assessments
            except Exception:  # not in MLflow yet
                pass
            time.sleep(0.2)
    finally:
        assert c.stop() == 0
    [a] = assessments
    assert (a.name, a.source.source_type, a.source.source_id) == ("contains", "CODE", "builtin/contains")
    assert a.metadata["evalsi.policy"] == "support-answers"
    assert a.value in (True, 1.0)
    experiment = client.get_experiment_by_name("evalsi-test-serve")
    assert experiment is not None
    [trace] = client.search_traces(locations=[experiment.experiment_id])
    assert {s.name for s in trace.data.spans} == {"handle request", "chat gpt-4o-mini"}
