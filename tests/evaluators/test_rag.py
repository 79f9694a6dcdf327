"""The rag pack (`builtin/context-relevance`, `builtin/faithfulness`) and the retrieved-documents reader, on RAG
traces judged by a local OpenAI-compatible server written for the test (no network).

The captured fixtures have no retrieval step, so each RAG trace here is a captured LLM call (the library's real
span, answering "What is the capital of France?") placed under an app span beside a retrieval span written with
the OTel SDK in that library's retrieval convention: OpenInference `retrieval.documents.N.document.*`, OTel GenAI
`gen_ai.retrieval.*`, MLflow `RETRIEVER` outputs. The spans travel as OTLP protobuf through evalsi's decoder and
mappers, as they would from an app.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from captures import normalized_capture, texts
from fake_judge import FakeJudge
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from running_collector import FIXTURES

from evalsi.evaluators import REGISTRY, Target, load_evaluators, parse_params, run
from evalsi.evaluators.judge_client import Judges
from evalsi.evaluators.packs import rag
from evalsi.model.score import Score
from evalsi.model.span import Span
from evalsi.model.trajectory import retrieved_documents
from evalsi.policies import load_policies
from evalsi.processors.normalize import normalize_span
from evalsi.processors.normalize.files import normalize_files
from evalsi.receivers.otlp.decode import decode_traces_protobuf
from evalsi.runtime.telemetry import SelfMetrics

load_evaluators()
FAITHFULNESS = REGISTRY["builtin/faithfulness"]
RELEVANCE = REGISTRY["builtin/context-relevance"]

QUESTION = "What is the capital of France?"  # the captured chat_simple calls' question
# (id, score, text) as a geography knowledge base would return them for "What is the capital of France?"
DOCUMENTS = [
    ("kb/paris#1", 0.91, "Paris is the capital and most populous city of France, on the river Seine."),
    ("kb/lyon#4", 0.62, "Lyon is the third-largest city of France and is known for its cuisine."),
]
# the folder whose captured LLM call sits in the RAG trace, per retrieval convention
FOLDERS = {"openinference": "openinference", "otel_genai": "otel-openai-v2-latest", "mlflow": "mlflow"}


def _retrieval(convention: str, query: str | None, documents: list[tuple[str, float, str | None]]) -> dict[str, Any]:
    """A retrieval span's attributes as each convention writes them (None query or text: content not captured)."""
    if convention == "openinference":
        attributes: dict[str, Any] = {"openinference.span.kind": "RETRIEVER", "input.value": query}
        for i, (doc_id, score, text) in enumerate(documents):
            prefix = f"retrieval.documents.{i}.document."
            attributes |= {prefix + "id": doc_id, prefix + "score": score, prefix + "metadata": '{"source": "kb"}'}
            if text is not None:
                attributes[prefix + "content"] = text
        return attributes
    if convention == "otel_genai":
        docs = [{"id": d, "score": s, **({"content": t} if t is not None else {})} for d, s, t in documents]
        attributes = {"gen_ai.operation.name": "retrieval", "gen_ai.data_source.id": "kb"}
        if query is not None:
            attributes["gen_ai.retrieval.query.text"] = query
        return attributes | {"gen_ai.retrieval.documents": json.dumps(docs)}
    assert convention == "mlflow"
    outputs = [{"page_content": t, "metadata": {"doc_uri": d, "score": s}, "id": d} for d, s, t in documents]
    return {
        "mlflow.spanType": '"RETRIEVER"',
        "mlflow.spanInputs": json.dumps({"query": query}),
        "mlflow.spanOutputs": json.dumps(outputs),
    }


def _sdk_spans(build: Any) -> list[Span]:
    """Spans written by `build(tracer)` with the OTel SDK, as OTLP protobuf through evalsi's decoder and mappers."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "rag-app"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    build(provider.get_tracer("rag-app"))
    provider.shutdown()
    decoded = decode_traces_protobuf(encode_spans(exporter.get_finished_spans()).SerializeToString())
    assert decoded.rejected == 0, decoded.message
    for span in decoded.batch:
        normalize_span(span)
    return decoded.batch.spans


def rag_trace(
    convention: str = "openinference",
    documents: list[tuple[str, float, str | None]] | None = None,
    *,
    stages: list[str] | None = None,
    captured: bool = True,
) -> list[Span]:
    """An app span over the retrieval step(s) (`stages`: conventions' span kinds, default one retrieval) and the
    captured LLM call of `FOLDERS[convention]`, in one trace. Not `captured`: no query is recorded, and the LLM
    call is OpenAI-v2's without its log records (the content)."""
    if captured:
        llm_spans = normalize_files([FIXTURES / FOLDERS[convention] / "chat_simple.pb"]).spans
    else:
        llm_spans = normalize_files([FIXTURES / "otel-openai-v2" / "chat_simple.pb"]).spans
    start = min(s.start_time_unix_nano for s in llm_spans)
    end = max(s.end_time_unix_nano for s in llm_spans)
    documents = DOCUMENTS if documents is None else documents
    steps = [
        _reranker(QUESTION, documents)
        if kind == "RERANKER"
        else _retrieval(kind, QUESTION if captured else None, documents)
        for kind in stages or [convention]
    ]

    def build(tracer: trace.Tracer) -> None:
        root = tracer.start_span("answer_question", start_time=start - 200_000_000)
        inside = trace.set_span_in_context(root)
        for i, attributes in enumerate(steps):
            at = start - 150_000_000 + i * 20_000_000
            tracer.start_span("retrieve", inside, attributes=attributes, start_time=at).end(end_time=at + 15_000_000)
        root.end(end_time=end + 5_000_000)

    app = _sdk_spans(build)
    root = next(s for s in app if not s.parent_span_id)
    for s in llm_spans:  # the captured call, made inside the app's request
        s.trace_id = root.trace_id
        s.parent_span_id = s.parent_span_id or root.span_id
    return app + llm_spans


def _reranker(query: str, documents: list[tuple[str, float, str | None]]) -> dict[str, Any]:
    """An OpenInference RERANKER keeping the best document of its input."""
    attributes: dict[str, Any] = {"openinference.span.kind": "RERANKER", "reranker.query": query}
    for i, (doc_id, _, text) in enumerate(documents):
        attributes |= {f"reranker.input_documents.{i}.document.id": doc_id}
        attributes |= {f"reranker.input_documents.{i}.document.content": text or ""}
    best = max(documents, key=lambda d: d[1])
    attributes |= {
        "reranker.output_documents.0.document.id": best[0],
        "reranker.output_documents.0.document.score": 1.0,
    }
    attributes |= {"reranker.output_documents.0.document.content": best[2] or ""}
    return attributes


@pytest.fixture
def server() -> Iterator[FakeJudge]:
    fake = FakeJudge()
    fake.thread.start()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


@pytest.fixture
def metrics() -> SelfMetrics:
    return SelfMetrics()


@pytest.fixture
def judges(metrics: SelfMetrics) -> Iterator[Judges]:
    """This test's judge runtime: its own cache and budgets, its metrics in `metrics`."""
    runtime = Judges(metrics)
    yield runtime
    runtime.close()


@pytest.fixture(autouse=True)
def _no_judge_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("EVALSI_JUDGE_BASE_URL", "EVALSI_JUDGE_MODEL", "EVALSI_JUDGE_API_KEY"):
        monkeypatch.delenv(var, raising=False)


def _target(spans: list[Span], judges: Judges | None = None) -> Target:
    root = next(s for s in spans if not s.parent_span_id)
    return Target(spans, span=root, judges=judges)


def _params(ev: Any, server: FakeJudge, **params: Any) -> Any:
    return parse_params(ev, {"endpoint": server.url, "model": "judge-1", "backoff_s": 0.001, **params})


def _judge(ev: Any, spans: list[Span], params: Any, judges: Judges) -> Score:
    (score,) = run(ev, _target(spans, judges), params)
    assert score.evaluator == ev.name and score.source == "llm_judge"
    return score


def _prompt(server: FakeJudge, i: int = -1) -> tuple[str, str]:
    system, user = server.requests[i]["messages"]
    assert (system["role"], user["role"]) == ("system", "user")
    return system["content"], user["content"]


def test_evaluators_list_shows_the_rag_judges() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "evalsi", "evaluators", "list", "--json"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    listed = {e["ref"]: e for e in json.loads(res.stdout)}
    for ref, needs in (("builtin/context-relevance", "input"), ("builtin/faithfulness", "output")):
        assert (listed[ref]["scope"], listed[ref]["version"]) == ("trace", "1")
        assert listed[ref]["requires"] == ["context", needs, "judge"]
        assert {"endpoint", "model", "budget", "max_documents"} <= set(listed[ref]["params"])
        assert "rubric" not in listed[ref]["params"]


# --- the documents reader ------------------------------------------------------------------------------------


@pytest.mark.parametrize("convention", FOLDERS)
def test_documents_are_read_from_each_retrieval_convention(convention: str) -> None:
    spans = rag_trace(convention)
    (retriever,) = [s for s in spans if s.step_type == "retriever"]
    assert texts(retriever.input) == [QUESTION]
    documents = retrieved_documents(spans)
    assert [(d["id"], d["content"]) for d in documents] == [(d, t) for d, _, t in DOCUMENTS]
    assert [d["score"] for d in documents] == [s for _, s, _ in DOCUMENTS]
    assert _target(spans).context == [t for _, _, t in DOCUMENTS]


def test_a_reranked_document_is_read_once() -> None:
    spans = rag_trace(stages=["openinference", "RERANKER"])
    assert [s.step_type for s in spans].count("retriever") == 2
    assert [d["content"] for d in retrieved_documents(spans)] == [t for _, _, t in DOCUMENTS]


def test_a_trace_without_retrieval_has_no_documents() -> None:
    spans = normalized_capture("openinference", "chat_tools")
    assert retrieved_documents(spans) == [] and _target(spans).context == []


# --- faithfulness and context relevance: the prompt and the verdict ------------------------------------------


@pytest.mark.parametrize("convention", FOLDERS)
def test_faithfulness_sends_question_documents_and_answer(server: FakeJudge, convention: str, judges: Judges) -> None:
    meta = json.loads((FIXTURES / FOLDERS[convention] / "meta.json").read_text())["scenarios"]["chat_simple"]
    server.verdict = json.dumps(
        {"score": 1, "passed": True, "label": "supported", "explanation": "Document 1 states Paris is the capital."}
    )
    score = _judge(FAITHFULNESS, rag_trace(convention), _params(FAITHFULNESS, server), judges)

    assert (score.name, score.outcome, score.value, score.passed) == ("faithfulness", "scored", 1.0, True)
    assert (score.label, score.explanation) == ("supported", "Document 1 states Paris is the capital.")
    system, user = _prompt(server)
    assert "supported by the documents" in system and "JSON" in system
    assert f"# Question\n{QUESTION}" in user
    assert f"[1]\n{DOCUMENTS[0][2]}" in user and f"[2]\n{DOCUMENTS[1][2]}" in user
    assert f"# Answer to judge\n{meta['result']}" in user
    assert score.metadata["template_version"] == rag.FAITHFULNESS.version == "1"
    assert score.metadata["template_hash"] == rag.FAITHFULNESS.hash
    assert (score.metadata["documents"], score.metadata["model"]) == (2, "judge-1")


@pytest.mark.parametrize("convention", FOLDERS)
def test_context_relevance_sends_question_and_documents(server: FakeJudge, convention: str, judges: Judges) -> None:
    server.verdict = json.dumps(
        {"score": 0.5, "passed": False, "label": "partly", "explanation": "Document 2 is about Lyon, not the capital."}
    )
    score = _judge(RELEVANCE, rag_trace(convention), _params(RELEVANCE, server, threshold=0.8), judges)

    assert (score.name, score.outcome, score.value, score.passed) == ("context-relevance", "scored", 0.5, False)
    assert (score.label, score.explanation) == ("partly", "Document 2 is about Lyon, not the capital.")
    system, user = _prompt(server)
    assert "relevant" in system
    assert QUESTION in user
    assert DOCUMENTS[0][2] in user and DOCUMENTS[1][2] in user
    assert "The capital of France is Paris." not in user  # relevance is judged without the answer
    assert score.metadata["template_hash"] == rag.CONTEXT_RELEVANCE.hash != rag.FAITHFULNESS.hash


@pytest.mark.parametrize(("reply", "value", "passed"), [("0.25", 0.25, False), ('{"score": 0.75}', 0.75, True)])
def test_verdict_without_passed_uses_the_threshold(
    server: FakeJudge, reply: str, value: float, passed: bool, judges: Judges
) -> None:
    server.verdict = reply
    score = _judge(FAITHFULNESS, rag_trace(), _params(FAITHFULNESS, server, threshold=0.7), judges)
    assert (score.outcome, score.value, score.passed) == ("scored", value, passed)


def test_unparseable_verdict_is_an_error(server: FakeJudge, judges: Judges) -> None:
    server.verdict = "The answer looks fine to me."
    score = _judge(FAITHFULNESS, rag_trace(), _params(FAITHFULNESS, server), judges)
    assert (score.outcome, score.reason, score.value, score.passed) == ("error", "unparseable verdict", None, None)


def test_documents_are_capped_and_cut(server: FakeJudge, judges: Judges) -> None:
    long = [("kb/big", 0.5, "Paris " + "x" * 200), *DOCUMENTS]
    _judge(
        FAITHFULNESS,
        rag_trace(documents=long),
        _params(FAITHFULNESS, server, max_documents=2, max_document_chars=50),
        judges,
    )
    _, user = _prompt(server)
    assert "[1]\nParis " + "x" * 44 + " […]" in user
    assert f"[2]\n{DOCUMENTS[0][2][:50]} […]\n" in user and "[3]" not in user and "Lyon" not in user


# --- when it cannot judge ------------------------------------------------------------------------------------


@pytest.mark.parametrize("ev", [FAITHFULNESS, RELEVANCE], ids=lambda e: e.name)
def test_no_retrieval_is_skipped_without_a_call(server: FakeJudge, ev: Any, judges: Judges) -> None:
    for folder in ("openinference", "otel-openai-v2-latest", "mlflow"):
        score = run(ev, _target(normalized_capture(folder, "chat_simple"), judges), _params(ev, server))[0]
        assert (score.outcome, score.reason, score.value) == ("skipped", "no retrieved documents", None)
    assert server.requests == []


@pytest.mark.parametrize("ev", [FAITHFULNESS, RELEVANCE], ids=lambda e: e.name)
def test_no_content_is_skipped_without_a_call(server: FakeJudge, ev: Any, judges: Judges) -> None:
    # content capture off: documents recorded by id and score only (the semconv's example), no query, no messages
    no_text = [(d, s, None) for d, s, _ in DOCUMENTS]
    uncaptured = rag_trace("otel_genai", no_text, captured=False)
    assert [s.step_type for s in uncaptured].count("retriever") == 1
    assert not any(s.content_captured for s in uncaptured) and retrieved_documents(uncaptured) == []
    score = run(ev, _target(uncaptured, judges), _params(ev, server))[0]
    assert (score.outcome, score.reason) == ("skipped", "no content")
    # the same with the chat's own content captured: the documents' text still is not
    score = run(ev, _target(rag_trace("openinference", no_text), judges), _params(ev, server))[0]
    assert (score.outcome, score.reason) == ("skipped", "no content")
    assert server.requests == []


@pytest.mark.parametrize("ev", [FAITHFULNESS, RELEVANCE], ids=lambda e: e.name)
def test_no_judge_runtime_is_skipped_without_a_call(server: FakeJudge, ev: Any) -> None:
    score = run(ev, _target(rag_trace()), _params(ev, server))[0]
    assert (score.name, score.outcome, score.reason, score.value) == (
        ev.params().name,
        "skipped",
        "no judge runtime",
        None,
    )
    assert server.requests == []


def test_no_judge_configured_is_skipped(judges: Judges) -> None:
    score = run(FAITHFULNESS, _target(rag_trace(), judges), parse_params(FAITHFULNESS, {}))[0]
    assert (score.outcome, score.reason, score.value) == ("skipped", "no judge configured", None)


# --- outages and the cache -----------------------------------------------------------------------------------


def test_judge_500_is_an_error_never_a_zero(server: FakeJudge, judges: Judges) -> None:
    server.script = [(500, {"error": "boom"}, {})] * 5
    score = _judge(FAITHFULNESS, rag_trace(), _params(FAITHFULNESS, server, retries=1), judges)
    assert (score.outcome, score.reason, score.value, score.passed) == ("error", "judge unavailable", None, None)
    assert "HTTP 500 after 2 attempts" in (score.explanation or "")
    assert len(server.requests) == 2


def test_unreachable_judge_is_an_error(judges: Judges) -> None:
    params = parse_params(
        FAITHFULNESS, {"endpoint": "http://127.0.0.1:9/v1", "model": "m", "retries": 0, "timeout_s": 1}
    )
    score = run(FAITHFULNESS, _target(rag_trace(), judges), params)[0]
    assert (score.outcome, score.reason, score.value) == ("error", "judge unavailable", None)


def test_the_same_judgment_comes_from_the_cache(server: FakeJudge, judges: Judges) -> None:
    params = _params(FAITHFULNESS, server, price={"input_per_1k": 0.01})
    first = _judge(FAITHFULNESS, rag_trace(), params, judges)
    # another trace with the same question, documents and answer (here: another instrumentation) is not re-judged
    second = _judge(
        FAITHFULNESS, rag_trace("mlflow"), _params(FAITHFULNESS, server, price={"input_per_1k": 0.01}), judges
    )
    assert len(server.requests) == 1
    assert (first.metadata["cached"], second.metadata["cached"]) == (False, True)
    assert (second.value, second.passed, second.judge_cost_usd) == (first.value, first.passed, 0.0)
    # other documents, or the other rag judge on the same trace, are other judgments
    _judge(FAITHFULNESS, rag_trace(documents=DOCUMENTS[:1]), params, judges)
    _judge(RELEVANCE, rag_trace(), _params(RELEVANCE, server), judges)
    assert len(server.requests) == 3


# --- in a policy ---------------------------------------------------------------------------------------------


def test_policy_cascade_judges_faithfulness_where_the_answer_names_the_city(
    server: FakeJudge, tmp_path: Path, judges: Judges, metrics: SelfMetrics
) -> None:
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "rag.yaml").write_text(
        f"""
apiVersion: evals.si/v1alpha1
kind: OnlineEvalPolicy
metadata: {{name: rag}}
spec:
  cascade:
    - ref: builtin/contains
      params: {{any: [Paris]}}
    - ref: builtin/faithfulness
      when: scores['contains'].passed
      params: {{endpoint: "{server.url}", model: judge-1, budget: {{max_calls: 10}}}}
"""
    )
    policies = load_policies(["policies/*.yaml"], tmp_path, judges=judges)

    judged = policies.evaluate_trace(rag_trace(), now=0)
    assert [(s.name, s.outcome) for s in judged] == [("contains", "scored"), ("faithfulness", "scored")]
    faithful = judged[1]
    assert (faithful.policy, faithful.value, faithful.evaluator) == ("rag", 0.9, "builtin/faithfulness")
    assert DOCUMENTS[0][2] in _prompt(server)[1]
    # no retrieval in the trace: skipped with its reason, and the judge is not asked
    plain = policies.evaluate_trace(normalized_capture("openinference", "chat_simple"), now=0)
    assert [(s.name, s.outcome, s.reason) for s in plain][-1] == ("faithfulness", "skipped", "no retrieved documents")
    # the cheap check fails (an answer without "Paris"): the judge does not run
    pii = policies.evaluate_trace(normalized_capture("openinference", "chat_pii"), now=0)
    assert [s.name for s in pii] == ["contains"]
    assert len(server.requests) == 1
    ok = {"judge": "faithfulness", "model": "judge-1", "result": "ok"}
    assert metrics.registry.get_sample_value("evalsi_judge_calls_total", ok) == 1
    # policies loaded without a judge runtime skip their judges, and say why
    bare = load_policies(["policies/*.yaml"], tmp_path).evaluate_trace(rag_trace(), now=0)
    assert [(s.name, s.outcome, s.reason) for s in bare][-1] == ("faithfulness", "skipped", "no judge runtime")
    assert len(server.requests) == 1
