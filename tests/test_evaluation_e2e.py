"""End to end: `evalsi serve` with a policy file scores the traces its selector picks, cheap checks first."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from running_collector import Collector, serve_config, start_collector, wait_until

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
    - ref: builtin/refusal
      when: scores['contains'].passed
    - ref: builtin/latency
      params: {max_ms: 60000}
"""


def _agent_trace(provider: TracerProvider, route: str, answer: str | None) -> str:
    """One app request: a root span with the route, one chat call with (or without) recorded content."""
    tracer = provider.get_tracer("support.app")
    with tracer.start_as_current_span("handle request") as root:
        root.set_attribute("app.route", route)
        with tracer.start_as_current_span("chat gpt-4o-mini") as chat:
            chat.set_attribute("gen_ai.operation.name", "chat")
            chat.set_attribute("gen_ai.request.model", "gpt-4o-mini")
            chat.set_attribute("gen_ai.usage.input_tokens", 10)
            chat.set_attribute("gen_ai.usage.output_tokens", 5)
            if answer is not None:
                question = [{"role": "user", "parts": [{"type": "text", "content": "Capital of France?"}]}]
                reply = [{"role": "assistant", "parts": [{"type": "text", "content": answer}]}]
                chat.set_attribute("gen_ai.input.messages", json.dumps(question))
                chat.set_attribute("gen_ai.output.messages", json.dumps(reply))
        return format(root.get_span_context().trace_id, "032x")


def _scores(c: Collector, trace_id: str) -> dict[str, dict[str, Any]]:
    doc = json.loads(c.cli("scores", "list", "--trace", trace_id, "--json").stdout)
    return {s["name"]: s for s in doc}


WORKERS = pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "two-workers"])
"""The evaluation tests run in one process and with two pipeline workers: the same scores either way."""


@WORKERS
def test_policy_scores_selected_traces_with_honest_outcomes(tmp_path: Path, workers: int) -> None:
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "support.yaml").write_text(POLICY)
    cfg = serve_config(tmp_path / "store")
    cfg["service"]["workers"] = workers
    cfg["processors"]["tail_sampling"] = {"decision_wait": "300ms"}
    cfg["processors"]["evaluate"] = {"policies": ["policies/*.yaml"]}
    pipelines = cfg["service"]["pipelines"]
    pipelines["traces"]["processors"] = ["normalize", "tail_sampling", "evaluate"]
    pipelines["scores"] = {"exporters": ["clickhouse"]}
    c = start_collector(tmp_path, cfg)
    try:
        provider = TracerProvider(resource=Resource.create({"service.name": "support"}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=c.http + "/v1/traces")))
        good = _agent_trace(provider, "support", "The capital of France is Paris.")
        wrong = _agent_trace(provider, "support", "I am not sure.")
        no_content = _agent_trace(provider, "support", None)
        other_route = _agent_trace(provider, "billing", "Paris.")
        assert provider.force_flush(10_000)
        provider.shutdown()

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            listed = json.loads(c.cli("scores", "list", "--json").stdout)
            if {s["trace_id"] for s in listed} >= {good, wrong, no_content}:
                break
            time.sleep(0.3)

        ok = _scores(c, good)
        assert ok["contains"]["outcome"] == "scored" and ok["contains"]["passed"] is True
        # refusal runs only where contains passed, and this answer is no refusal
        assert ok["refusal"]["outcome"] == "scored" and ok["refusal"]["passed"] is True
        assert ok["latency"]["outcome"] == "scored" and ok["latency"]["value"] > 0
        assert {s["policy"] for s in ok.values()} == {"support-answers"}
        assert ok["contains"]["evaluator"] == "builtin/contains"

        bad = _scores(c, wrong)
        assert bad["contains"]["passed"] is False
        assert "refusal" not in bad  # its `when` was not met: no score, not a zero

        empty = _scores(c, no_content)
        assert empty["contains"]["outcome"] == "skipped" and empty["contains"]["reason"] == "no content"
        assert "refusal" not in empty
        assert empty["latency"]["outcome"] == "scored"  # needs no content

        assert _scores(c, other_route) == {}  # the selector left it out

        # every trace was stored, evaluated or not
        stored = {t["trace_id"] for t in json.loads(c.cli("traces", "list", "--json").stdout)}
        assert stored >= {good, wrong, no_content, other_route}
        evaluated = 'evalsi_evaluate_traces_total{processor="evaluate"} 4.0'
        # pipeline workers report their counts every second
        assert wait_until(lambda: evaluated in httpx.get(c.metrics).text, 10), httpx.get(c.metrics).text
    finally:
        assert c.stop() == 0

    # scores survive a restart and are read from the store directly; a replayed write would not add rows
    listed = json.loads(c.cli("scores", "list", "--json", api=False).stdout)
    assert len([s for s in listed if s["trace_id"] == good]) == 3


def test_validate_reports_a_broken_policy_with_its_file_and_key(tmp_path: Path) -> None:
    import subprocess
    import sys

    import yaml

    (tmp_path / "bad.yaml").write_text(POLICY.replace("builtin/contains", "builtin/containz"))
    cfg = serve_config(tmp_path / "store")
    cfg["processors"]["evaluate"] = {"policies": [str(tmp_path / "bad.yaml")]}
    cfg["service"]["pipelines"]["traces"]["processors"] = ["normalize", "evaluate"]
    path = tmp_path / "evalsi.yaml"
    path.write_text(yaml.safe_dump(cfg))
    res = subprocess.run([sys.executable, "-m", "evalsi", "validate", "-c", str(path)], capture_output=True, text=True)
    assert res.returncode == 1
    assert "processors.evaluate" in res.stderr and "bad.yaml" in res.stderr and "builtin/containz" in res.stderr
    assert "Traceback" not in res.stderr


JUDGE_POLICY = """
apiVersion: evals.si/v1alpha1
kind: OnlineEvalPolicy
metadata: {{name: judged}}
spec:
  cascade:
    - ref: builtin/contains
      params: {{any: [Paris]}}
    - ref: builtin/llm-judge
      when: scores['contains'].passed
      params:
        endpoint: {endpoint}
        model: judge-1
        rubric: correctness
        budget: {{max_calls: 3}}
"""


@WORKERS
def test_judge_runs_where_cheap_checks_pass_and_stops_at_its_budget(tmp_path: Path, workers: int) -> None:
    from fake_judge import FakeJudge

    fake = FakeJudge()
    fake.thread.start()
    (tmp_path / "judged.yaml").write_text(JUDGE_POLICY.format(endpoint=fake.url))
    cfg = serve_config(tmp_path / "store")
    cfg["service"]["workers"] = workers  # with two, the budget is still one: the collector process keeps it
    cfg["processors"]["tail_sampling"] = {"decision_wait": "300ms"}
    cfg["processors"]["evaluate"] = {"policies": ["judged.yaml"]}
    pipelines = cfg["service"]["pipelines"]
    pipelines["traces"]["processors"] = ["normalize", "tail_sampling", "evaluate"]
    pipelines["scores"] = {"exporters": ["clickhouse"]}
    c = start_collector(tmp_path, cfg)
    try:
        provider = TracerProvider(resource=Resource.create({"service.name": "support"}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=c.http + "/v1/traces")))
        # five different right answers (no judge cache hits) and one wrong one
        right = [_agent_trace(provider, "support", f"Paris, answer {i}.") for i in range(5)]
        wrong = _agent_trace(provider, "support", "Lyon.")
        assert provider.force_flush(10_000)
        provider.shutdown()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            listed = json.loads(c.cli("scores", "list", "--json").stdout)
            if {s["trace_id"] for s in listed} >= {*right, wrong}:
                break
            time.sleep(0.3)
        judged = [_scores(c, t)["llm-judge"] for t in right]
        assert sorted(s["outcome"] for s in judged) == ["scored"] * 3 + ["skipped"] * 2
        assert {s["reason"] for s in judged if s["outcome"] == "skipped"} == {"budget exhausted"}
        assert all(s["source"] == "llm_judge" and s["value"] == 0.9 for s in judged if s["outcome"] == "scored")
        assert "llm-judge" not in _scores(c, wrong)  # the cheap check failed: the judge never ran
        assert len(fake.requests) == 3 and all(r["model"] == "judge-1" for r in fake.requests)
        exhausted = 'evalsi_judge_budget_exhausted_total{judge="llm-judge",model="judge-1"} 2.0'
        # pipeline workers report their counts every second
        assert wait_until(lambda: exhausted in httpx.get(c.metrics).text, 10), httpx.get(c.metrics).text
    finally:
        fake.server.shutdown()
        assert c.stop() == 0


@WORKERS
def test_evaluation_results_sent_as_otlp_log_events_are_stored_as_external_scores(tmp_path: Path, workers: int) -> None:
    cfg = serve_config(tmp_path / "store")
    cfg["service"]["workers"] = workers
    cfg["processors"]["evaluate"] = {}
    pipelines = cfg["service"]["pipelines"]
    pipelines["logs"]["processors"] = ["normalize", "evaluate"]
    pipelines["scores"] = {"exporters": ["clickhouse"]}
    c = start_collector(tmp_path, cfg)
    trace_id, span_id = "5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174"

    def attr(key: str, value: dict[str, Any]) -> dict[str, Any]:
        return {"key": key, "value": value}

    record = {
        "timeUnixNano": str(time.time_ns()),
        "eventName": "gen_ai.evaluation.result",
        "traceId": trace_id,
        "spanId": span_id,
        "attributes": [
            attr("gen_ai.evaluation.name", {"stringValue": "relevance"}),
            attr("gen_ai.evaluation.score.value", {"doubleValue": 0.75}),
            attr("gen_ai.evaluation.score.label", {"stringValue": "relevant"}),
            attr("gen_ai.evaluation.explanation", {"stringValue": "on topic"}),
        ],
    }
    body = {"resourceLogs": [{"scopeLogs": [{"scope": {"name": "my.evaluator"}, "logRecords": [record]}]}]}
    try:
        r = httpx.post(c.http + "/v1/logs", json=body)
        assert r.status_code == 200, r.text
        deadline = time.monotonic() + 20
        found: dict[str, Any] = {}
        while time.monotonic() < deadline and not found:
            found = _scores(c, trace_id)
            time.sleep(0.2)
        score = found["relevance"]
        assert score["source"] == "external" and score["outcome"] == "scored"
        assert (score["value"], score["label"], score["explanation"]) == (0.75, "relevant", "on topic")
        assert score["span_id"] == span_id and score["evaluator"] == "my.evaluator"
    finally:
        assert c.stop() == 0
