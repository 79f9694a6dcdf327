"""End to end with pipeline workers (`service.workers: 2`): a session whose traces land in different workers is
evaluated whole, an alert over every worker's traces fires once, and evaluation that cannot keep up pushes back or
sheds, as configured. (tests/test_evaluation_e2e.py and tests/test_late_feedback_e2e.py run in both modes.)"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from running_collector import Collector, serve_config, start_collector, wait_until

from evalsi.collector.workers.pool import slot_owners
from evalsi.model.span import trace_shard

POLICIES = """
apiVersion: evals.si/v1alpha1
kind: OnlineEvalPolicy
metadata: {name: answers}
spec:
  cascade:
    - ref: builtin/contains
      params: {any: [Paris]}
  alerts:
    - {name: six-traces, when: "count >= 6"}
---
apiVersion: evals.si/v1alpha1
kind: OnlineEvalPolicy
metadata: {name: conversations}
spec:
  selector: session.id == 'conv-1'
  cascade:
    - ref: builtin/session-turns
      params: {max_turns: 5}
"""


class ChosenIds(RandomIdGenerator):
    """Trace ids from a list (span ids random): which worker owns each trace is then known."""

    def __init__(self, trace_ids: Iterator[int]) -> None:
        self.trace_ids = trace_ids

    def generate_trace_id(self) -> int:
        return next(self.trace_ids)


def _send(c: Collector, trace_ids: list[int], sessions: dict[int, str]) -> list[str]:
    provider = TracerProvider(resource=Resource.create({"service.name": "support"}), id_generator=ChosenIds(
        iter(trace_ids)))  # fmt: skip
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=c.http + "/v1/traces")))
    tracer = provider.get_tracer("support.app")
    out = []
    for trace_id in trace_ids:
        with tracer.start_as_current_span("chat gpt-4o-mini") as chat:
            chat.set_attribute("gen_ai.operation.name", "chat")
            chat.set_attribute("gen_ai.request.model", "gpt-4o-mini")
            if trace_id in sessions:
                chat.set_attribute("gen_ai.conversation.id", sessions[trace_id])
            reply = [{"role": "assistant", "parts": [{"type": "text", "content": "Paris."}]}]
            chat.set_attribute("gen_ai.output.messages", json.dumps(reply))
        out.append(format(trace_id, "032x"))
    assert provider.force_flush(10_000)
    provider.shutdown()
    return out


def _scores(c: Collector) -> list[dict[str, Any]]:
    return httpx.get(c.api + "/api/v1/scores", params={"limit": 1000}).json()["scores"]


def _metric(c: Collector, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in httpx.get(c.metrics).text.splitlines()
               if line.startswith(name))  # fmt: skip


@pytest.mark.parametrize(("workers", "collector_shard"), [(1, False), (2, False), (2, True)],
                         ids=["one-process", "two-workers", "collector-shard"])  # fmt: skip
def test_a_session_across_workers_is_evaluated_whole_and_an_alert_fires_once(
    tmp_path: Path, workers: int, collector_shard: bool
) -> None:
    (tmp_path / "policies.yaml").write_text(POLICIES)
    cfg = serve_config(tmp_path / "store")
    cfg["service"]["workers"] = workers
    cfg["service"]["collector_shard"] = collector_shard
    cfg["processors"]["tail_sampling"] = {"decision_wait": "300ms", "session_timeout": "1s"}
    cfg["processors"]["evaluate"] = {"policies": ["policies.yaml"]}
    pipelines = cfg["service"]["pipelines"]
    pipelines["traces"]["processors"] = ["normalize", "tail_sampling", "evaluate"]
    pipelines["scores"] = {"exporters": ["clickhouse"]}
    c = start_collector(tmp_path, cfg)
    try:
        ids = [0xA1B2 << 64 | n for n in range(3, 9)]
        assert [trace_shard(format(t, "032x"), 2) for t in ids] == [1, 0, 1, 0, 1, 0]
        # with the collector's own shard (worker 0), it owns one slot of four and worker 1 three
        assert [slot_owners(2, True)[trace_shard(format(t, "032x"), 4)] for t in ids] == [1, 0, 1, 1, 1, 0]
        # the conversation's two turns are owned by different workers
        sent = _send(c, ids, {ids[0]: "conv-1", ids[1]: "conv-1"})
        assert wait_until(lambda: any(s["name"] == "session-turns" for s in _scores(c))), _scores(c)
        scores = _scores(c)
        [turns] = [s for s in scores if s["name"] == "session-turns"]
        assert (turns["value"], turns["passed"], turns["session_id"]) == (2, True, "conv-1")
        assert turns["trace_id"] == sent[0]  # a session's score belongs to its first trace
        assert {s["trace_id"] for s in scores if s["name"] == "contains"} == set(sent)
        # the alert counts every worker's traces (no worker alone has six) and fires once
        assert wait_until(lambda: any(e.get("msg") == "alert fired" for e in c.logs()))
        time.sleep(1.5)  # two more alert checks: it must not fire again
        fired = [e for e in c.logs() if e.get("msg") == "alert fired"]
        assert [(e["policy"], e["alert"]) for e in fired] == [("answers", "six-traces")]
        assert _metric(c, 'evalsi_alerts_fired_total{alert="six-traces",policy="answers"') == 1
    finally:
        assert c.stop() == 0


@pytest.mark.parametrize("overload", ["backpressure", "shed"])
def test_evaluation_past_its_capacity_pushes_back_or_sheds_as_configured(tmp_path: Path, overload: str) -> None:
    from fake_judge import FakeJudge

    fake = FakeJudge()
    fake.delay_s = 0.3  # a slow judge: evaluation cannot keep up with ten traces at once
    fake.thread.start()
    (tmp_path / "judged.yaml").write_text(
        "apiVersion: evals.si/v1alpha1\nkind: OnlineEvalPolicy\nmetadata: {name: judged}\nspec:\n  cascade:\n"
        f"    - ref: builtin/llm-judge\n      params: {{endpoint: {fake.url}, model: judge-1, rubric: correctness}}\n"
    )
    cfg = serve_config(tmp_path / "store")
    cfg["service"]["workers"] = 2
    cfg["processors"]["tail_sampling"] = {"decision_wait": "200ms"}
    cfg["processors"]["evaluate"] = {"policies": ["judged.yaml"], "queue_size": 1, "overload": overload}
    pipelines = cfg["service"]["pipelines"]
    pipelines["traces"]["processors"] = ["normalize", "tail_sampling", "evaluate"]
    pipelines["scores"] = {"exporters": ["clickhouse"]}
    c = start_collector(tmp_path, cfg)
    try:
        sent = _send(c, [0xBEEF << 64 | n for n in range(1, 11)], {})
        assert c.wait_stored(10) == 10  # every span is stored either way
        done = 'evalsi_evaluate_traces_total{processor="evaluate"}'
        shed = 'evalsi_evaluate_traces_shed_total{processor="evaluate"}'
        assert wait_until(lambda: _metric(c, done) + _metric(c, shed) == 10, timeout=60), httpx.get(c.metrics).text

        def judged_stored() -> set[str]:
            return {s["trace_id"] for s in _scores(c) if s["name"] == "llm-judge"}

        # the last traces' scores reach the store within its flush interval after they are counted evaluated
        assert wait_until(lambda: len(judged_stored()) == 10 - _metric(c, shed)), _scores(c)
        judged = judged_stored()
        if overload == "backpressure":  # held upstream until evaluation had room: every trace judged
            assert _metric(c, shed) == 0 and judged == set(sent)
        else:  # left out, counted, never silently
            assert _metric(c, shed) >= 1 and len(judged) == 10 - _metric(c, shed)
    finally:
        fake.server.shutdown()
        assert c.stop() == 0
