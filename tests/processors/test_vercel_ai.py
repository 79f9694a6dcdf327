"""The `vercel_ai` mapper on what the captures (tests/fixtures/vercel-ai-sdk/) do not hold: AI SDK 4.x's names
(`ai.usage.promptTokens`, tool-call `args`, tool-result `result`), `ai.generateObject`, embeddings, and session and
user metadata; spans made by the real OpenTelemetry SDK with the attributes as the AI SDK's sources name them."""

from __future__ import annotations

import json

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from evalsi.model.span import Span, SpanBatch
from evalsi.model.trajectory import build_trajectories
from evalsi.processors.normalize import normalize_span
from evalsi.receivers.otlp.decode import decode_traces_protobuf


def _spans(build) -> list[Span]:  # type: ignore[no-untyped-def]
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    build(provider.get_tracer("ai"))
    provider.shutdown()
    batch = decode_traces_protobuf(encode_spans(memory.get_finished_spans()).SerializeToString()).batch
    assert isinstance(batch, SpanBatch)
    for span in batch.spans:
        normalize_span(span)
    return batch.spans


def test_ai_sdk_4_names_are_read() -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {"role": "assistant", "content": [{"type": "tool-call", "toolCallId": "c1", "toolName": "get_weather",
                                           "args": {"location": "Paris"}}]},
        {"role": "tool", "content": [{"type": "tool-result", "toolCallId": "c1", "toolName": "get_weather",
                                      "result": "sunny"}]},
    ]  # fmt: skip

    def build(tracer) -> None:  # type: ignore[no-untyped-def]
        with tracer.start_as_current_span("ai.generateText") as root:
            root.set_attributes(
                {
                    "ai.operationId": "ai.generateText",
                    "ai.telemetry.functionId": "weather",
                    "ai.telemetry.metadata.sessionId": "s-1",
                    "ai.telemetry.metadata.userId": "u-1",
                    "ai.model.id": "gpt-4o-mini",
                    "ai.model.provider": "openai.chat",
                    "ai.prompt": json.dumps({"prompt": "Weather in Paris?"}),
                    "ai.response.text": "It is sunny.",
                    "ai.usage.promptTokens": 60,
                    "ai.usage.completionTokens": 9,
                }
            )
            with tracer.start_as_current_span("ai.generateText.doGenerate") as call:
                call.set_attributes(
                    {
                        "ai.operationId": "ai.generateText.doGenerate",
                        "ai.model.id": "gpt-4o-mini",
                        "ai.model.provider": "openai.chat",
                        "ai.prompt.messages": json.dumps(messages),
                        "ai.response.text": "It is sunny.",
                        "ai.response.finishReason": "stop",
                        "ai.usage.promptTokens": 60,
                        "ai.usage.completionTokens": 9,
                        "gen_ai.usage.input_tokens": 60,
                        "gen_ai.usage.output_tokens": 9,
                    }
                )

    root, call = sorted(_spans(build), key=lambda s: s.start_time_unix_nano)
    assert (root.step_type, root.agent_name, root.input_tokens) == ("agent", "weather", None)
    assert (root.session_id, root.user_id) == ("s-1", "u-1")
    assert (call.convention, call.step_type, call.provider, call.model) == ("vercel_ai", "llm", "openai", "gpt-4o-mini")
    assert (call.input_tokens, call.output_tokens) == (60, 9)
    parts = [p for m in call.input or [] for p in m["parts"]]
    assert {"type": "tool_call", "id": "c1", "name": "get_weather", "arguments": {"location": "Paris"}} in parts
    assert {"type": "tool_call_response", "id": "c1", "response": "sunny"} in parts
    (trajectory,) = build_trajectories([root, call])
    assert (trajectory["input_tokens"], trajectory["final_output"]) == (60, "It is sunny.")


def test_generate_object_and_embeddings() -> None:
    def build(tracer) -> None:  # type: ignore[no-untyped-def]
        with tracer.start_as_current_span("ai.generateObject") as root:
            root.set_attributes({"ai.operationId": "ai.generateObject", "ai.response.object": '{"city":"Paris"}'})
            with tracer.start_as_current_span("ai.generateObject.doGenerate") as call:
                call.set_attributes(
                    {
                        "ai.operationId": "ai.generateObject.doGenerate",
                        "ai.model.id": "gpt-4o-mini",
                        "ai.response.object": '{"city":"Paris"}',
                        "ai.usage.inputTokens": 30,
                        "ai.usage.outputTokens": 5,
                    }
                )
        with tracer.start_as_current_span("ai.embed.doEmbed") as embed:
            embed.set_attributes(
                {"ai.operationId": "ai.embed.doEmbed", "ai.model.id": "text-embedding-3-small", "ai.usage.tokens": 4}
            )

    spans = {s.name: s for s in _spans(build)}
    call = spans["ai.generateObject.doGenerate"]
    assert call.step_type == "llm" and call.output == [
        {"role": "assistant", "parts": [{"type": "text", "content": '{"city":"Paris"}'}]}
    ]
    assert spans["ai.generateObject"].step_type == "agent"
    embed = spans["ai.embed.doEmbed"]
    assert (embed.step_type, embed.input_tokens, embed.model) == ("embedding", 4, "text-embedding-3-small")
