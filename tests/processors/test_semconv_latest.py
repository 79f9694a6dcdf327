"""The GenAI semantic conventions' latest changes (semantic-conventions-genai), read in their new and old names, on
spans and log records made by the real OpenTelemetry SDK and sent as its OTLP exporter encodes them:
`gen_ai.usage.cache_write.input_tokens` (was `cache_creation`), the message parts `reasoning`, `server_tool_call`,
`server_tool_call_response`, `blob`, `file`, `uri`, `invoke_workflow` spans, and `gen_ai.evaluation.result`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from evalsi.exporters.otlp_encode import logs_request
from evalsi.model.log_record import LogBatch
from evalsi.model.score import Score
from evalsi.model.span import Span, SpanBatch
from evalsi.model.trajectory import build_trajectories
from evalsi.processors.evaluate.events import score_from_event
from evalsi.processors.normalize import normalize_span
from evalsi.processors.normalize.cost import CostConfig, Pricer
from evalsi.receivers.otlp.decode import decode_logs_protobuf, decode_traces_protobuf


class _Sdk:
    """A TracerProvider and a LoggerProvider of the real SDK, kept in memory; `spans()` / `records()` decode what
    the OTLP exporter would have sent, as evalsi's receiver does."""

    def __init__(self) -> None:
        resource = Resource.create({"service.name": "semconv-latest"})
        self.span_memory = InMemorySpanExporter()
        self.tracer_provider = TracerProvider(resource=resource)
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.span_memory))
        self.tracer = self.tracer_provider.get_tracer("tests.semconv_latest")
        self.log_memory = InMemoryLogRecordExporter()
        self.logger_provider = LoggerProvider(resource=resource)
        self.logger_provider.add_log_record_processor(SimpleLogRecordProcessor(self.log_memory))
        self.logger = self.logger_provider.get_logger("tests.semconv_latest")

    def spans(self) -> list[Span]:
        body = encode_spans(self.span_memory.get_finished_spans()).SerializeToString()
        batch = decode_traces_protobuf(body).batch
        assert isinstance(batch, SpanBatch)
        for span in batch.spans:
            normalize_span(span)
        return batch.spans

    def records(self) -> LogBatch:
        body = encode_logs(self.log_memory.get_finished_logs()).SerializeToString()
        batch = decode_logs_protobuf(body).batch
        assert isinstance(batch, LogBatch)
        return batch


@pytest.fixture
def sdk() -> Iterator[_Sdk]:
    made = _Sdk()
    yield made
    made.tracer_provider.shutdown()
    made.logger_provider.shutdown()


def _chat(sdk: _Sdk, attributes: dict[str, Any], output: list[dict[str, Any]] | None = None) -> None:
    base = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "anthropic",
        "gen_ai.request.model": "claude-sonnet-4-5",
        "gen_ai.usage.input_tokens": 1200,
        "gen_ai.usage.output_tokens": 40,
    }
    if output is not None:
        base["gen_ai.output.messages"] = json.dumps(output)
    with sdk.tracer.start_as_current_span("chat claude-sonnet-4-5", kind=trace.SpanKind.CLIENT) as span:
        span.set_attributes(base | attributes)


@pytest.mark.parametrize(
    "name",
    [
        "gen_ai.usage.cache_write.input_tokens",  # the current name
        "gen_ai.usage.cache_creation.input_tokens",  # before semantic-conventions-genai #440
        "gen_ai.usage.cache_creation_input_tokens",  # before semconv 1.37
    ],
)
def test_cache_writes_are_read_under_each_name_and_priced_at_the_cache_write_rate(sdk: _Sdk, name: str) -> None:
    _chat(sdk, {"gen_ai.usage.cache_read.input_tokens": 1000, name: 150})
    (span,) = sdk.spans()
    assert span.details["cache_creation_input_tokens"] == 150
    assert span.details["cache_read_input_tokens"] == 1000
    # Anthropic's input tokens leave the cache out (docs/conventions.md, Cost): 1200 at the input rate, the cache
    # counts at their own
    Pricer(CostConfig(prices={"anthropic/claude-sonnet-4-5": {"input_per_mtok": 3.0, "output_per_mtok": 15.0,
                                                               "cache_read_per_mtok": 0.3,
                                                               "cache_write_per_mtok": 3.75}})).price(span)  # fmt: skip
    assert span.cost_usd == pytest.approx((1200 * 3.0 + 40 * 15.0 + 1000 * 0.3 + 150 * 3.75) / 1e6)


def test_the_new_cache_write_name_wins_over_the_old_one(sdk: _Sdk) -> None:
    _chat(sdk, {"gen_ai.usage.cache_creation.input_tokens": 99, "gen_ai.usage.cache_write.input_tokens": 150})
    (span,) = sdk.spans()
    assert span.details["cache_creation_input_tokens"] == 150


NEW_PARTS_OUTPUT = [
    {
        "role": "assistant",
        "parts": [
            {"type": "reasoning", "content": "The user wants today's news; search first."},
            {
                "type": "server_tool_call",
                "id": "srvtoolu_01",
                "name": "web_search",
                "server_tool_call": {"type": "web_search", "query": "Paris weather today"},
            },
            {
                "type": "server_tool_call_response",
                "id": "srvtoolu_01",
                "server_tool_call_response": {"type": "web_search", "results": [{"url": "https://example.org/w"}]},
            },
            {"type": "text", "content": "It is sunny in Paris."},
        ],
        "finish_reason": "stop",
    }
]
NEW_PARTS_INPUT = [
    {
        "role": "user",
        "parts": [
            {"type": "text", "content": "What is in these?"},
            {"type": "blob", "modality": "image", "mime_type": "image/png", "content": "iVBORw0KGgo="},
            {"type": "file", "modality": "document", "mime_type": "application/pdf", "file_id": "file-abc"},
            {"type": "uri", "modality": "image", "uri": "gs://bucket/cat.png"},
        ],
    },
    {
        "role": "tool",
        # the registry's example of gen_ai.input.messages names the response `result`
        "parts": [{"type": "tool_call_response", "id": "call_1", "result": "rainy, 57°F"}],
    },
]


def test_new_message_parts_are_read_and_the_answer_is_the_text_alone(sdk: _Sdk) -> None:
    _chat(sdk, {"gen_ai.input.messages": json.dumps(NEW_PARTS_INPUT)}, NEW_PARTS_OUTPUT)
    (span,) = sdk.spans()
    assert span.convention == "otel_genai" and not span.unparsed
    user, tool = span.input or []
    assert [p["type"] for p in user["parts"]] == ["text", "blob", "file", "uri"]
    assert user["parts"][1]["content"] == "iVBORw0KGgo=" and user["parts"][2]["file_id"] == "file-abc"
    assert user["parts"][3]["uri"] == "gs://bucket/cat.png"
    assert tool["parts"] == [{"type": "tool_call_response", "id": "call_1", "response": "rainy, 57°F"}]

    (trajectory,) = build_trajectories([span])
    (step,) = trajectory["steps"]
    # reasoning is the model's, never the answer; a tool the provider ran is a tool call of the trajectory
    assert trajectory["final_output"] == "It is sunny in Paris."
    assert step["reasoning"] == "The user wants today's news; search first."
    assert step["server_tool_calls"] == [
        {
            "id": "srvtoolu_01",
            "name": "web_search",
            "arguments": {"type": "web_search", "query": "Paris weather today"},
            "result": {"type": "web_search", "results": [{"url": "https://example.org/w"}]},
        }
    ]
    assert trajectory["tool_calls"] == [
        {
            "name": "web_search",
            "id": "srvtoolu_01",
            "arguments": {"type": "web_search", "query": "Paris weather today"},
            "error": None,
            "server": True,
        }
    ]
    assert step["tool_calls"] == []  # no client tool call: nothing for the app to run


def test_invoke_workflow_is_a_step_above_its_agents_and_its_output_the_answer(sdk: _Sdk) -> None:
    tracer = sdk.tracer
    answer = [{"role": "assistant", "parts": [{"type": "text", "content": "Refund approved."}]}]
    with tracer.start_as_current_span("invoke_workflow support_pipeline") as workflow:
        workflow.set_attributes(
            {
                "gen_ai.operation.name": "invoke_workflow",
                "gen_ai.workflow.name": "support_pipeline",
                "gen_ai.input.messages": json.dumps(
                    [{"role": "user", "parts": [{"type": "text", "content": "Refund order 42"}]}]
                ),
            }
        )
        for agent in ("triage", "billing"):
            with tracer.start_as_current_span(f"invoke_agent {agent}") as span:
                span.set_attributes({"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent})
                _chat(sdk, {}, [{"role": "assistant", "parts": [{"type": "text", "content": f"{agent} done"}]}])
        workflow.set_attribute("gen_ai.output.messages", json.dumps(answer))
    (trajectory,) = build_trajectories(sdk.spans())
    steps = trajectory["steps"]
    assert [(s["type"], s["depth"]) for s in steps] == [
        ("chain", 0),
        ("agent", 1),
        ("llm", 2),
        ("agent", 1),
        ("llm", 2),
    ]
    assert steps[0]["workflow_name"] == "support_pipeline"
    assert [s["agent_name"] for s in steps if s["type"] == "agent"] == ["triage", "billing"]
    assert all(s["parent_span_id"] == steps[0]["span_id"] for s in steps if s["type"] == "agent")
    assert trajectory["final_output"] == "Refund approved."
    assert trajectory["llm_calls"] == 2 and trajectory["input_tokens"] == 2400


def test_evaluation_results_round_trip_through_evalsis_exporter() -> None:
    """What evalsi's `otlp` exporter writes, evalsi reads back with the spec's attributes."""
    sent = [
        Score(
            "relevance",
            value=4.0,
            label="relevant",
            explanation="Answers the question.",
            trace_id="ab" * 16,
            span_id="cd" * 8,
            policy="quality",
            evaluator="judge",
            metadata={"gen_ai.response.id": "chatcmpl-123"},
        ),
        Score("toxicity", passed=True, trace_id="ab" * 16, span_id="cd" * 8, policy="safety", evaluator="toxicity"),
        Score("faithfulness", outcome="error", reason="JudgeTimeout", trace_id="ab" * 16, policy="p", evaluator="e"),
    ]
    batch = decode_logs_protobuf(logs_request(sent).SerializeToString()).batch
    assert isinstance(batch, LogBatch)
    records = batch.records
    assert [r.event_name for r in records] == ["gen_ai.evaluation.result"] * 3
    assert records[0].attributes["gen_ai.evaluation.score.value"] == 4.0
    assert records[0].attributes["gen_ai.evaluation.score.label"] == "relevant"
    assert records[0].attributes["gen_ai.evaluation.explanation"] == "Answers the question."
    assert records[0].attributes["gen_ai.response.id"] == "chatcmpl-123"
    assert records[1].attributes["gen_ai.evaluation.score.label"] == "pass"
    assert records[2].attributes["error.type"] == "JudgeTimeout"
    read = [score_from_event(r) for r in records]
    relevance, toxicity, failed = read
    assert relevance is not None and toxicity is not None and failed is not None
    assert (relevance.name, relevance.value, relevance.label, relevance.explanation) == (
        "relevance",
        4.0,
        "relevant",
        "Answers the question.",
    )
    assert (relevance.trace_id, relevance.span_id) == ("ab" * 16, "cd" * 8)
    assert relevance.metadata["gen_ai.response.id"] == "chatcmpl-123"
    assert (relevance.policy, relevance.evaluator) == ("quality", "judge")
    assert (toxicity.label, toxicity.outcome) == ("pass", "scored")
    assert (failed.outcome, failed.reason) == ("error", "JudgeTimeout")


def test_evaluation_results_another_tool_emits_with_the_sdk_are_read(sdk: _Sdk) -> None:
    """A `gen_ai.evaluation.result` event as the spec describes it, emitted by the SDK's logger, parented to the span
    it evaluates."""
    with sdk.tracer.start_as_current_span("chat gpt-4o-mini") as span:
        span.set_attribute("gen_ai.operation.name", "chat")
        sdk.logger.emit(
            event_name="gen_ai.evaluation.result",
            attributes={
                "gen_ai.evaluation.name": "IntentResolution",
                "gen_ai.evaluation.score.value": 4.0,
                "gen_ai.evaluation.score.label": "pass",
                "gen_ai.evaluation.explanation": "The intent was resolved.",
                "gen_ai.response.id": "chatcmpl-9",
            },
        )
        context = span.get_span_context()
    (record,) = sdk.records().records
    score = score_from_event(record)
    assert score is not None
    assert (score.name, score.value, score.label, score.explanation) == (
        "IntentResolution",
        4.0,
        "pass",
        "The intent was resolved.",
    )
    assert score.trace_id == format(context.trace_id, "032x") and score.span_id == format(context.span_id, "016x")
    assert score.metadata["gen_ai.response.id"] == "chatcmpl-9"
    assert score.source == "external" and score.outcome == "scored"


def test_an_agent_spans_usage_counts_only_when_no_call_below_records_it(sdk: _Sdk) -> None:
    """`invoke_agent` spans may carry the run's summed `gen_ai.usage.*`: with its model calls recorded below it, a
    trace's sums count the calls (once); an agent span with nothing below it (a remote agent's only record) counts."""
    from evalsi import cel

    agent_usage = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "remote",
                   "gen_ai.request.model": "claude-sonnet-4-5", "gen_ai.usage.input_tokens": 2400,
                   "gen_ai.usage.output_tokens": 80}  # fmt: skip
    with sdk.tracer.start_as_current_span("invoke_agent local") as agent:
        agent.set_attributes(agent_usage | {"gen_ai.agent.name": "local"})
        _chat(sdk, {})
        _chat(sdk, {})
    local = sdk.spans()
    sdk.span_memory.clear()
    with sdk.tracer.start_as_current_span("invoke_agent remote") as agent:
        agent.set_attributes(agent_usage)
    remote = sdk.spans()
    assert (
        cel.trace_activation(local)["trace"]["input_tokens"],
        cel.trace_activation(local)["trace"]["llm_calls"],
    ) == (
        2400,
        2,
    )
    assert cel.trace_activation(remote)["trace"]["input_tokens"] == 2400
    pricer = Pricer(CostConfig())
    for span in local + remote:
        pricer.price(span)
    assert [s.cost_usd for s in local + remote if s.step_type == "agent"] == [None, None]
    assert all(s.cost_usd for s in local if s.step_type == "llm")
