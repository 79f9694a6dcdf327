"""End to end: a policy that samples nothing online scores and promotes a trace when negative feedback arrives
later through `POST /v1/feedback`; positive feedback brings nothing in, and feedback for an unknown trace is
stored and counted as unmatched."""

from __future__ import annotations

import json
import os
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
metadata: {name: complaints}
spec:
  sampling: {rate: 0, always: [feedback.negative]}
  cascade:
    - ref: builtin/contains
      params: {any: [Paris]}
    - ref: builtin/latency
      params: {max_ms: 60000}
  promote: {when: feedback.negative, dataset: complaints}
"""


def _chat(provider: TracerProvider, answer: str) -> str:
    tracer = provider.get_tracer("support.app")
    with tracer.start_as_current_span("chat gpt-4o-mini") as chat:
        chat.set_attribute("gen_ai.operation.name", "chat")
        chat.set_attribute("gen_ai.request.model", "gpt-4o-mini")
        question = [{"role": "user", "parts": [{"type": "text", "content": "Capital of France?"}]}]
        reply = [{"role": "assistant", "parts": [{"type": "text", "content": answer}]}]
        chat.set_attribute("gen_ai.input.messages", json.dumps(question))
        chat.set_attribute("gen_ai.output.messages", json.dumps(reply))
        return format(chat.get_span_context().trace_id, "032x")


def _scores(c: Collector, trace_id: str) -> list[dict[str, Any]]:
    return httpx.get(c.api + "/api/v1/scores", params={"trace_id": trace_id}).json()["scores"]


def _metric(c: Collector, line_start: str) -> float:
    for line in httpx.get(c.metrics).text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "two-workers"])
def test_negative_feedback_brings_a_sampled_out_trace_into_the_policy_and_the_dataset(
    tmp_path: Path, workers: int
) -> None:
    """With two workers the feedback goes from the collector process to the worker holding its trace."""
    (tmp_path / "complaints.yaml").write_text(POLICY)
    cfg = serve_config(tmp_path / "store")
    cfg["service"]["workers"] = workers
    cfg["processors"]["tail_sampling"] = {"decision_wait": "300ms"}
    cfg["processors"]["evaluate"] = {
        "policies": ["complaints.yaml"], "datasets_dir": str(tmp_path / "datasets"),
        "late_signals": {"window": "5m", "max_traces": 1000},
    }  # fmt: skip
    pipelines = cfg["service"]["pipelines"]
    pipelines["traces"]["processors"] = ["normalize", "tail_sampling", "evaluate"]
    pipelines["scores"] = {"processors": ["evaluate"], "exporters": ["clickhouse"]}
    c = start_collector(tmp_path, cfg)
    dataset = tmp_path / "datasets" / "complaints.jsonl"
    evaluated = 'evalsi_evaluate_traces_total{processor="evaluate"}'
    scored = 'evalsi_evaluate_scores_total{outcome="scored",processor="evaluate"}'
    try:
        provider = TracerProvider(resource=Resource.create({"service.name": "support"}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=c.http + "/v1/traces")))
        bad = _chat(provider, "The capital of France is Lyon.")
        good = _chat(provider, "The capital of France is Paris.")
        assert provider.force_flush(10_000)
        provider.shutdown()

        # online: both traces complete and are evaluated, and the policy (rate 0, no feedback yet) scores neither
        assert wait_until(lambda: _metric(c, evaluated) == 2), httpx.get(c.metrics).text
        assert c.wait_stored(2) == 2
        assert _scores(c, bad) == [] and _scores(c, good) == []

        unknown = os.urandom(16).hex()
        for trace_id, name, value in ((good, "thumbs_up", True), (bad, "thumbs_up", False), (unknown, "stars", 0)):
            resp = httpx.post(c.api + "/v1/feedback", json={"trace_id": trace_id, "name": name, "value": value})
            assert resp.status_code == 200, resp.text
            assert resp.json()["stored"]["source"] == "human"

        assert wait_until(lambda: {s["name"] for s in _scores(c, bad)} >= {"thumbs_up", "contains", "latency"})
        by_name = {s["name"]: s for s in _scores(c, bad)}
        assert (by_name["contains"]["policy"], by_name["contains"]["passed"]) == ("complaints", False)
        assert by_name["latency"]["outcome"] == "scored"
        assert (by_name["thumbs_up"]["source"], by_name["thumbs_up"]["passed"]) == ("human", False)
        assert wait_until(dataset.exists)
        rows = [json.loads(line) for line in dataset.read_text().splitlines()]
        assert [r["trace_id"] for r in rows] == [bad]
        assert rows[0]["output"] == "The capital of France is Lyon."

        # positive feedback brought nothing in; the unknown trace's feedback is stored and counted unmatched
        assert wait_until(lambda: [s["name"] for s in _scores(c, good)] == ["thumbs_up"])
        # the scores pipeline queues each feedback's score for the store, which flushes on its own clock: the
        # unknown trace's can land in a later insert than the good one's
        assert wait_until(lambda: [s["name"] for s in _scores(c, unknown)] == ["stars"]), _scores(c, unknown)
        unmatched = 'evalsi_late_signals_unmatched_total{processor="evaluate",reason="unknown_trace"}'
        # (with workers, their counts reach the exposition within a second)
        assert wait_until(lambda: _metric(c, unmatched) == 1)
        late = 'evalsi_late_signals_matched_total{processor="evaluate",when="late"}'
        assert wait_until(lambda: _metric(c, late) == 2)
        assert wait_until(lambda: _metric(c, scored) == 2)

        # the same complaint again: nothing runs, is scored or promoted twice
        again = httpx.post(c.api + "/v1/feedback", json={"trace_id": bad, "name": "comment", "value": "wrong city"})
        assert again.status_code == 200
        assert wait_until(lambda: _metric(c, late) == 3)
        time.sleep(1.2)  # a worker's counts are a second behind at most
        assert _metric(c, scored) == 2
        assert len(dataset.read_text().splitlines()) == 1
        stats = json.loads(c.cli("policies", "stats", "--policy", "complaints", "--json").stdout)["stats"]
        assert {(s["name"], s["n"]) for s in stats} == {("contains", 1), ("latency", 1)}
    finally:
        assert c.stop() == 0
