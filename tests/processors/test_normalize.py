"""The normalize processor and the OTel GenAI mapper, on real openai-v2 captures and hand-built edge cases."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from captures import any_value, normalized_capture, parts
from pydantic import ValidationError

from evalsi.component import REGISTRY, Settings
from evalsi.exporters.clickhouse.rows import attribute_string
from evalsi.model.span import Span, SpanBatch, SpanEvent
from evalsi.processors.normalize import MAPPERS, Normalize, NormalizeConfig, mapper as mapper_registry, normalize_span
from evalsi.processors.normalize.mapper import register_mapper
from evalsi.processors.normalize.messages import (
    chat_messages,
    message_from_event,
    messages_from_events,
    semconv_messages,
    system_message,
)
from evalsi.receivers.otlp.decode import decode_traces_json
from evalsi.runtime.telemetry import SelfMetrics

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LEGACY = "otel-openai-v2"
LATEST = "otel-openai-v2-latest"
SCENARIOS = ("chat_simple", "chat_tools", "chat_pii", "chat_error", "embeddings", "chat_stream")


# --- reading the captures -------------------------------------------------------------------------


def markers(folder: str, scenario: str) -> dict[str, Any]:
    meta = json.loads((FIXTURES / folder / "meta.json").read_text())
    return meta["scenarios"][scenario]["markers"]


def normalized(folder: str, scenario: str, suffix: str = ".json") -> list[Span]:
    return normalized_capture(folder, scenario, suffix)


def log_events_by_span(scenario: str) -> dict[str, list[tuple[str, Any]]]:
    """(event name, body dict) pairs of a legacy capture's log records, grouped by the span they belong to."""
    request = json.loads((FIXTURES / LEGACY / f"{scenario}.logs.json").read_text())
    by_span: dict[str, list[tuple[str, Any]]] = {}
    for resource in request["resourceLogs"]:
        for scope in resource["scopeLogs"]:
            for record in scope["logRecords"]:
                by_span.setdefault(record["spanId"], []).append((record["eventName"], any_value(record["body"])))
    return by_span


def text(messages: list[dict[str, Any]] | None) -> str:
    return json.dumps(messages, ensure_ascii=False)


def llm_spans(spans: list[Span]) -> list[Span]:
    return sorted((s for s in spans if s.step_type == "llm"), key=lambda s: s.start_time_unix_nano)


def one(spans: list[Span], step_type: str) -> Span:
    found = [s for s in spans if s.step_type == step_type]
    assert len(found) == 1, [(s.name, s.step_type) for s in spans]
    return found[0]


# --- the captures, span by span -------------------------------------------------------------------


@pytest.mark.parametrize("folder", [LEGACY, LATEST])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_capture_span_is_mapped_with_model_provider_and_tokens(folder: str, scenario: str) -> None:
    spans = normalized(folder, scenario)
    meta = json.loads((FIXTURES / folder / "meta.json").read_text())
    assert len(spans) == meta["scenarios"][scenario]["span_count"]
    for span in spans:
        assert span.convention == "otel_genai"
        assert span.step_type in {"llm", "embedding", "tool", "agent"}
        if span.step_type in {"llm", "embedding"}:
            assert span.provider == "openai"
            expected_model = "text-embedding-3-small" if scenario == "embeddings" else "gpt-4o-mini"
            assert span.model == expected_model
            assert span.input_tokens == span.attributes.get("gen_ai.usage.input_tokens")
            assert span.output_tokens == span.attributes.get("gen_ai.usage.output_tokens")


@pytest.mark.parametrize("folder", [LEGACY, LATEST])
def test_chat_simple_fields(folder: str) -> None:
    (span,) = normalized(folder, "chat_simple")
    assert (span.step_type, span.model, span.provider) == ("llm", "gpt-4o-mini", "openai")
    assert (span.input_tokens, span.output_tokens) == (17, 6)
    assert span.tool_name is None and span.session_id is None


@pytest.mark.parametrize("scenario", ["chat_simple", "chat_pii", "chat_stream", "chat_error"])
def test_latest_chat_content_is_on_the_span(scenario: str) -> None:
    (span,) = normalized(LATEST, scenario)
    found = markers(LATEST, scenario)
    assert span.content_captured
    assert found["prompt"] in text(span.input)
    assert span.input is not None and span.input[-1]["role"] == "user"
    if "completion" in found:
        assert found["completion"] in text(span.output)
        assert span.output is not None and span.output[0]["role"] == "assistant"
        assert span.output[0]["finish_reason"] == "stop"
    else:
        assert span.output is None


def test_latest_chat_simple_messages_are_canonical() -> None:
    (span,) = normalized(LATEST, "chat_simple")
    assert span.input == [
        {"role": "system", "parts": [{"type": "text", "content": "You are a concise assistant."}]},
        {"role": "user", "parts": [{"type": "text", "content": "What is the capital of France?"}]},
    ]
    assert span.output == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": "The capital of France is Paris."}],
            "finish_reason": "stop",
        }
    ]


def test_chat_error_keeps_status_and_has_no_usage() -> None:
    for folder in (LEGACY, LATEST):
        (span,) = normalized(folder, "chat_error")
        assert span.status_code == "ERROR"
        assert span.step_type == "llm"
        assert (span.input_tokens, span.output_tokens) == (None, None)


@pytest.mark.parametrize("folder", [LEGACY, LATEST])
def test_embeddings_record_no_content(folder: str) -> None:
    (span,) = normalized(folder, "embeddings")
    assert span.step_type == "embedding"
    assert (span.input_tokens, span.output_tokens) == (10, None)
    # neither mode puts embedding input on the span, so the prompt marker is nowhere to be found
    assert not span.content_captured and span.input is None and span.output is None


@pytest.mark.parametrize("folder", [LEGACY, LATEST])
def test_chat_tools_tool_span(folder: str) -> None:
    spans = normalized(folder, "chat_tools")
    found = markers(folder, "chat_tools")
    tool = one(spans, "tool")
    assert tool.tool_name == "get_weather"
    assert tool.content_captured
    assert tool.input is not None and tool.output is not None
    (call,) = parts(tool.input, "tool_call")
    assert tool.input[0]["role"] == "assistant"
    assert call["name"] == "get_weather"
    assert call["id"] == "call_74e7c12f7009fc6e6c94"
    assert call["arguments"] == {"location": "Paris"}
    assert any(marker in text(tool.input) for marker in found["tool_args"])
    (response,) = parts(tool.output, "tool_call_response")
    assert tool.output[0]["role"] == "tool"
    assert response["id"] == call["id"]
    assert found["tool_result"] in response["response"]


@pytest.mark.parametrize("folder", [LEGACY, LATEST])
def test_chat_tools_agent_span(folder: str) -> None:
    agent = one(normalized(folder, "chat_tools"), "agent")
    assert agent.name == "invoke_agent weather_agent"
    assert agent.model == "gpt-4o-mini"
    # the legacy manual span sets gen_ai.provider.name; util-genai's agent span sets no provider
    assert agent.provider == ("openai" if folder == LEGACY else None)


def test_latest_chat_tools_llm_spans_carry_the_tool_round_trip() -> None:
    spans = normalized(LATEST, "chat_tools")
    found = markers(LATEST, "chat_tools")
    asking, answering = llm_spans(spans)
    assert found["prompt"] in text(asking.input)
    (call,) = parts(asking.output, "tool_call")
    assert call["name"] == "get_weather"
    assert call["arguments"] == {"location": "Paris"}
    assert asking.output is not None and asking.output[0]["finish_reason"] == "tool_calls"
    (response,) = parts(answering.input, "tool_call_response")
    assert found["tool_result"] in response["response"]
    assert found["completion"] in text(answering.output)
    agent = one(spans, "agent")
    assert found["prompt"] in text(agent.input) and found["completion"] in text(agent.output)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_legacy_llm_spans_alone_have_no_content(scenario: str) -> None:
    # content is in the .logs.json records; joining them to spans is the receiver's later work
    for span in normalized(LEGACY, scenario):
        if span.step_type in {"llm", "embedding", "agent"}:
            assert not span.content_captured
            assert span.input is None and span.output is None


def test_protobuf_and_json_captures_normalize_alike() -> None:
    for folder in (LEGACY, LATEST):
        from_json = sorted((s.canonical() for s in normalized(folder, "chat_tools")), key=lambda c: c["span_id"])
        from_pb = sorted((s.canonical() for s in normalized(folder, "chat_tools", ".pb")), key=lambda c: c["span_id"])
        assert from_json == from_pb


# --- converter (b) on the legacy log records ------------------------------------------------------


@pytest.mark.parametrize("scenario", ["chat_simple", "chat_pii", "chat_stream", "chat_error", "chat_tools"])
def test_log_record_bodies_convert_to_the_markers(scenario: str) -> None:
    found = markers(LEGACY, scenario)
    by_span = log_events_by_span(scenario)
    inputs = [messages_from_events(events)[0] for events in by_span.values()]
    outputs = [messages_from_events(events)[1] for events in by_span.values()]
    assert any(found["prompt"] in text(m) for m in inputs)
    if "completion" in found:
        assert any(found["completion"] in text(m) for m in outputs)
    else:
        assert outputs == [None]


@pytest.mark.parametrize("scenario", ["chat_simple", "chat_pii", "chat_stream", "chat_tools"])
def test_log_records_give_the_same_messages_as_the_latest_span_attributes(scenario: str) -> None:
    latest = {s.attributes["gen_ai.response.id"]: s for s in normalized(LATEST, scenario) if s.step_type == "llm"}
    legacy_spans = {s.span_id: s for s in normalized(LEGACY, scenario)}
    events = log_events_by_span(scenario)
    assert len(events) == len(latest)
    for span_id, span_events in events.items():
        response_id = legacy_spans[span_id].attributes["gen_ai.response.id"]
        assert messages_from_events(span_events) == (latest[response_id].input, latest[response_id].output)


def test_log_records_of_chat_tools_carry_the_call_and_the_result() -> None:
    found = markers(LEGACY, "chat_tools")
    legacy = sorted(normalized(LEGACY, "chat_tools"), key=lambda s: s.start_time_unix_nano)
    asking, answering = llm_spans(legacy)
    events = log_events_by_span("chat_tools")
    _, asked = messages_from_events(events[asking.span_id])
    (call,) = parts(asked, "tool_call")
    assert call == {
        "type": "tool_call",
        "id": "call_74e7c12f7009fc6e6c94",
        "name": "get_weather",
        "arguments": {"location": "Paris"},
    }
    sent, answer = messages_from_events(events[answering.span_id])
    assert sent is not None
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool"]
    (response,) = parts(sent, "tool_call_response")
    assert response["id"] == "call_74e7c12f7009fc6e6c94"
    assert found["tool_result"] in response["response"]
    assert found["completion"] in text(answer)


# --- the mapper on hand-built spans ---------------------------------------------------------------


def span(attributes: dict[str, Any] | None = None, events: list[SpanEvent] | None = None) -> Span:
    return Span(
        trace_id="5b8efff798038103d269b633813fc60c",
        span_id="eee19b7ec3c1b174",
        parent_span_id="",
        name="test",
        kind="CLIENT",
        start_time_unix_nano=1,
        end_time_unix_nano=2,
        attributes=attributes or {},
        events=events or [],
    )


def test_unknown_span_is_left_untouched() -> None:
    attributes = {"http.method": "GET", "db.system": "postgresql", "llm.model_name": "not-gen-ai"}
    s = span(dict(attributes))
    normalize_span(s)
    assert s.attributes == attributes
    assert (s.step_type, s.convention, s.model, s.content_captured) == ("other", "", None, False)


@pytest.mark.parametrize(
    ("operation", "step_type"),
    [
        ("chat", "llm"),
        ("text_completion", "llm"),
        ("generate_content", "llm"),
        ("embeddings", "embedding"),
        ("execute_tool", "tool"),
        ("invoke_agent", "agent"),
        ("create_agent", "agent"),
        ("invoke_workflow", "chain"),
        ("retrieval", "retriever"),
    ],
)
def test_step_type_follows_the_operation(operation: str, step_type: str) -> None:
    s = span({"gen_ai.operation.name": operation})
    normalize_span(s)
    assert (s.step_type, s.convention) == (step_type, "otel_genai")


def test_other_operations_are_llm_only_with_a_model() -> None:
    with_model = span({"gen_ai.operation.name": "rerank", "gen_ai.request.model": "m"})
    without = span({"gen_ai.system": "openai"})
    normalize_span(with_model)
    normalize_span(without)
    assert with_model.step_type == "llm"
    assert (without.step_type, without.convention, without.provider) == ("other", "otel_genai", "openai")


def test_older_attribute_names_and_numeric_strings() -> None:
    s = span(
        {
            "gen_ai.system": "anthropic",
            "gen_ai.request.model": "claude-x",
            "gen_ai.usage.prompt_tokens": "12",
            "gen_ai.usage.completion_tokens": 3.0,
            "gen_ai.conversation.id": "conv-1",
        }
    )
    normalize_span(s)
    assert (s.provider, s.model, s.input_tokens, s.output_tokens) == ("anthropic", "claude-x", 12, 3)
    assert s.session_id == "conv-1"


def test_newer_names_win_over_older_ones() -> None:
    s = span(
        {
            "gen_ai.provider.name": "aws.bedrock",
            "gen_ai.system": "openai",
            "gen_ai.request.model": "requested",
            "gen_ai.response.model": "served",
            "gen_ai.usage.input_tokens": 5,
            "gen_ai.usage.prompt_tokens": 99,
            "gen_ai.usage.output_tokens": "not a number",
        }
    )
    normalize_span(s)
    assert (s.provider, s.model, s.input_tokens, s.output_tokens) == ("aws.bedrock", "served", 5, None)


def test_malformed_input_messages_do_not_raise() -> None:
    raw = '[{"role": "user", "parts": [{"type": "text", "content": "cut off'
    s = span({"gen_ai.operation.name": "chat", "gen_ai.input.messages": raw, "gen_ai.output.messages": "{oops"})
    normalize_span(s)
    assert s.content_captured
    assert s.input == [{"role": "user", "parts": [{"type": "text", "content": raw}], "unparsed": True}]
    assert s.output == [{"role": "assistant", "parts": [{"type": "text", "content": "{oops"}], "unparsed": True}]
    assert s.unparsed == ["input", "output"]
    assert s.attributes["gen_ai.input.messages"] == raw


def test_unparsed_content_is_counted_per_convention_and_field() -> None:
    class Sink:
        async def consume(self, batch: SpanBatch) -> None:
            self.batch = batch

    metrics = SelfMetrics()
    proc = Normalize(NormalizeConfig(), Settings("normalize", metrics, logging.getLogger("t")), Sink())
    bad = span({"gen_ai.operation.name": "chat", "gen_ai.input.messages": "{not json"})
    good = span({"gen_ai.operation.name": "chat", "gen_ai.input.messages": "[]"})
    asyncio.run(proc.consume(SpanBatch([bad, good])))
    value = metrics.registry.get_sample_value(
        "evalsi_normalize_unparsed_total", {"convention": "otel_genai", "field": "input"}
    )
    assert value == 1.0
    assert good.unparsed == []


@pytest.mark.parametrize(
    "value",
    [
        "42",
        "null",
        '"just a string"',
        '[1, "two", null, {"no": "role"}]',
        "[[]]",
        '{"role": 7, "parts": 5}',
        "",
    ],
)
def test_odd_message_json_never_raises(value: str) -> None:
    s = span({"gen_ai.operation.name": "chat", "gen_ai.input.messages": value})
    normalize_span(s)
    for message in s.input or ():
        assert isinstance(message["role"], str)
        assert all("type" in p for p in message["parts"])


def test_structured_messages_are_copied_not_mutated() -> None:
    messages = [{"role": "assistant", "parts": [{"type": "tool_call", "name": "f", "arguments": '{"a": 1}'}]}]
    s = span({"gen_ai.operation.name": "chat", "gen_ai.output.messages": messages})
    normalize_span(s)
    assert s.output == [
        {
            "role": "assistant",
            "parts": [{"type": "tool_call", "id": None, "name": "f", "arguments": {"a": 1}}],
        }
    ]
    assert messages[0]["parts"][0]["arguments"] == '{"a": 1}'


def test_other_part_types_pass_through() -> None:
    value = json.dumps(
        [
            {
                "role": "assistant",
                "parts": [
                    {"type": "reasoning", "content": "thinking"},
                    {"type": "uri", "modality": "image", "uri": "https://example.com/a.png"},
                    {"type": "blob", "modality": "image", "mime_type": "image/png", "content": "aGk="},
                ],
            }
        ]
    )
    assert semconv_messages(value, "assistant") == json.loads(value)


@pytest.mark.parametrize(
    ("instructions", "expected"),
    [
        ('[{"type": "text", "content": "Be brief."}]', [{"type": "text", "content": "Be brief."}]),
        ("Be brief.", [{"type": "text", "content": "Be brief."}]),
        ([{"type": "text", "content": "Be brief."}], [{"type": "text", "content": "Be brief."}]),
    ],
)
def test_system_instructions_lead_the_input(instructions: Any, expected: list[dict[str, Any]]) -> None:
    s = span(
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.system_instructions": instructions,
            "gen_ai.input.messages": '[{"role": "user", "parts": [{"type": "text", "content": "hi"}]}]',
        }
    )
    normalize_span(s)
    assert s.input == [
        {"role": "system", "parts": expected},
        {"role": "user", "parts": [{"type": "text", "content": "hi"}]},
    ]
    assert system_message("") is None
    assert system_message("[]") is None


def test_system_instructions_already_leading_the_input_are_not_added_twice() -> None:
    system = {"role": "system", "parts": [{"type": "text", "content": "Be brief."}]}
    other = {"role": "system", "parts": [{"type": "text", "content": "Be kind."}]}
    user = {"role": "user", "parts": [{"type": "text", "content": "hi"}]}
    # OpenLIT sends the instructions in both attributes; a different system message is content of its own
    for instructions in ("Be brief.", json.dumps(system["parts"])):
        for messages, expected in (([system, user], [system, user]), ([other, user], [system, other, user])):
            s = span(
                {
                    "gen_ai.operation.name": "chat",
                    "gen_ai.system_instructions": instructions,
                    "gen_ai.input.messages": json.dumps(messages),
                }
            )
            normalize_span(s)
            assert s.input == expected


def test_a_part_with_neither_type_nor_content_becomes_its_json_text() -> None:
    value = json.dumps([{"role": "user", "parts": [{"url": "https://example.com/ä"}, {"type": None, "n": 1}]}])
    assert semconv_messages(value, "user") == [
        {
            "role": "user",
            "parts": [
                {"type": "text", "content": '{"url": "https://example.com/ä"}'},
                {"type": "text", "content": '{"type": null, "n": 1}'},
            ],
        }
    ]
    assert system_message([{"note": "x"}]) == {
        "role": "system",
        "parts": [{"type": "text", "content": '{"note": "x"}'}],
    }


def test_execute_tool_span_without_content() -> None:
    s = span({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search"})
    normalize_span(s)
    assert (s.step_type, s.tool_name, s.content_captured, s.input, s.output) == (
        "tool",
        "search",
        False,
        None,
        None,
    )


def test_execute_tool_arguments_that_are_not_json_stay_as_sent() -> None:
    s = span(
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "shell",
            "gen_ai.tool.call.arguments": "ls -la",
        }
    )
    normalize_span(s)
    assert s.input == [
        {
            "role": "assistant",
            "parts": [{"type": "tool_call", "id": None, "name": "shell", "arguments": "ls -la"}],
        }
    ]
    assert s.output is None and s.content_captured


def test_per_message_span_events_are_content() -> None:
    calls = [{"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}]
    events = [
        SpanEvent(1, "gen_ai.system.message", {"gen_ai.system": "openai", "content": "Be brief."}),
        SpanEvent(2, "gen_ai.user.message", {"content": "Weather?"}),
        SpanEvent(
            3,
            "gen_ai.assistant.message",
            {"tool_calls": json.dumps(calls)},
        ),
        SpanEvent(4, "gen_ai.tool.message", {"id": "c1", "content": "sunny"}),
        SpanEvent(
            5,
            "gen_ai.choice",
            {"gen_ai.event.content": '{"index": 0, "finish_reason": "stop", "message": {"content": "Sunny."}}'},
        ),
    ]
    s = span(events=events)
    normalize_span(s)
    assert (s.convention, s.step_type, s.content_captured) == ("otel_genai", "other", True)
    assert s.input == [
        {"role": "system", "parts": [{"type": "text", "content": "Be brief."}]},
        {"role": "user", "parts": [{"type": "text", "content": "Weather?"}]},
        {"role": "assistant", "parts": [{"type": "tool_call", "id": "c1", "name": "w", "arguments": {}}]},
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": "sunny"}]},
    ]
    assert s.output == [
        {"role": "assistant", "parts": [{"type": "text", "content": "Sunny."}], "finish_reason": "stop"}
    ]


def test_choices_are_ordered_by_index() -> None:
    _, output = messages_from_events(
        [
            ("gen_ai.choice", {"index": 1, "finish_reason": "length", "message": {"content": "second"}}),
            ("gen_ai.choice", {"index": 0, "finish_reason": "stop", "message": {"content": "first"}}),
            ("some.other.event", {"content": "ignored"}),
        ]
    )
    assert [m["parts"][0]["content"] for m in output or ()] == ["first", "second"]


def test_message_from_event_is_defensive() -> None:
    assert message_from_event("gen_ai.unknown", {"content": "x"}) is None
    assert message_from_event("gen_ai.user.message", "bare text") == {
        "role": "user",
        "parts": [{"type": "text", "content": "bare text"}],
    }
    assert message_from_event("gen_ai.choice", {"message": "{not json"}) == {
        "role": "assistant",
        "parts": [{"type": "text", "content": "{not json"}],
    }
    multimodal = {"content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "u"}}]}
    assert message_from_event("gen_ai.user.message", multimodal) == {
        "role": "user",
        "parts": [{"type": "text", "content": "look"}, {"type": "image_url", "image_url": {"url": "u"}}],
    }


def test_prompt_and_completion_span_events() -> None:
    prompt = json.dumps([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    completion = json.dumps(
        [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}],
                "finish_reason": "tool_calls",
            }
        ]
    )
    s = span(
        {"gen_ai.system": "openai", "gen_ai.request.model": "gpt"},
        [
            SpanEvent(1, "gen_ai.content.prompt", {"gen_ai.prompt": prompt}),
            SpanEvent(2, "gen_ai.content.completion", {"gen_ai.completion": completion}),
        ],
    )
    normalize_span(s)
    assert s.step_type == "llm" and s.content_captured
    assert s.input == [
        {"role": "system", "parts": [{"type": "text", "content": "Be brief."}]},
        {"role": "user", "parts": [{"type": "text", "content": "Hi"}]},
    ]
    assert s.output == [
        {
            "role": "assistant",
            "parts": [{"type": "tool_call", "id": "c", "name": "f", "arguments": {"x": 1}}],
            "finish_reason": "tool_calls",
        }
    ]


def test_malformed_prompt_event_keeps_the_raw_text() -> None:
    assert chat_messages("not json [", "user") == [
        {"role": "user", "parts": [{"type": "text", "content": "not json ["}], "unparsed": True}
    ]
    assert chat_messages("", "user") is None


def test_renormalizing_with_other_mappers_clears_the_old_mapping() -> None:
    s = span({"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"})
    normalize_span(s)
    assert s.convention == "otel_genai"
    normalize_span(s, mappers=[])
    assert (s.step_type, s.model, s.convention) == ("other", None, "")


# --- the semconv's extra facts: on the captures -----------------------------------------------------


def raw_attributes(folder: str, scenario: str) -> dict[str, dict[str, Any]]:
    """span id -> the span's attributes exactly as the OTLP/JSON capture has them."""
    request = json.loads((FIXTURES / folder / f"{scenario}.json").read_text())
    return {
        s["spanId"]: {a["key"]: any_value(a["value"]) for a in s.get("attributes", [])}
        for resource in request["resourceSpans"]
        for scope in resource["scopeSpans"]
        for s in scope["spans"]
    }


@pytest.mark.parametrize("folder", [LEGACY, LATEST])
def test_request_parameters_go_to_details(folder: str) -> None:
    (span,) = normalized(folder, "chat_simple")
    raw = raw_attributes(folder, "chat_simple")[span.span_id]
    assert span.details["request"] == {
        key: raw[f"gen_ai.request.{key}"] for key in ("temperature", "top_p", "max_tokens", "seed")
    }
    assert span.details["request"] == {"temperature": 0.2, "top_p": 0.9, "max_tokens": 64, "seed": 42}


@pytest.mark.parametrize("folder", [LEGACY, LATEST])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_response_id_and_finish_reasons_go_to_details(folder: str, scenario: str) -> None:
    raw = raw_attributes(folder, scenario)
    for span in normalized(folder, scenario):
        attributes = raw[span.span_id]
        assert span.details.get("response_id") == attributes.get("gen_ai.response.id")
        assert span.details.get("finish_reasons") == attributes.get("gen_ai.response.finish_reasons")
        assert span.user_id is None


def test_finish_reasons_are_read_from_the_captures() -> None:
    asking, answering = llm_spans(normalized(LATEST, "chat_tools"))
    assert (asking.details["finish_reasons"], answering.details["finish_reasons"]) == (["tool_calls"], ["stop"])


@pytest.mark.parametrize("folder", [LEGACY, LATEST])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_error_type_only_on_the_failed_span(folder: str, scenario: str) -> None:
    raw = raw_attributes(folder, scenario)
    for span in normalized(folder, scenario):
        if scenario == "chat_error":
            recorded = raw[span.span_id]["error.type"]
            # latest util-genai writes str(type): "<class 'openai.InternalServerError'>"
            assert span.error_type == recorded.removeprefix("<class '").removesuffix("'>")
            assert span.error_type.endswith("InternalServerError") and span.status_code == "ERROR"
        else:
            assert span.error_type is None


def test_error_type_of_the_two_openai_v2_modes() -> None:
    (legacy,) = normalized(LEGACY, "chat_error")
    (latest,) = normalized(LATEST, "chat_error")
    assert (legacy.error_type, latest.error_type) == ("InternalServerError", "openai.InternalServerError")


@pytest.mark.parametrize("folder", [LEGACY, LATEST])
def test_agent_and_tool_facts_from_chat_tools(folder: str) -> None:
    spans = normalized(folder, "chat_tools")
    raw = raw_attributes(folder, "chat_tools")
    agent = one(spans, "agent")
    assert agent.agent_name == raw[agent.span_id]["gen_ai.agent.name"] == "weather_agent"
    tool = one(spans, "tool")
    attributes = raw[tool.span_id]
    assert tool.details["tool_type"] == attributes["gen_ai.tool.type"] == "function"
    assert tool.details["tool_call_id"] == attributes["gen_ai.tool.call.id"]
    assert tool.details.get("tool_description") == attributes.get("gen_ai.tool.description")
    for span in llm_spans(spans):
        assert span.agent_name is None


def test_latest_tool_span_has_a_description() -> None:
    tool = one(normalized(LATEST, "chat_tools"), "tool")
    assert tool.details["tool_description"] == "Get the current weather for a city."


@pytest.mark.parametrize("folder", [LEGACY, LATEST])
def test_embedding_dimensions_go_to_the_request(folder: str) -> None:
    (span,) = normalized(folder, "embeddings")
    raw = raw_attributes(folder, "embeddings")[span.span_id]
    assert span.details["request"] == {"dimensions": raw["gen_ai.embeddings.dimension.count"]} == {"dimensions": 8}


@pytest.mark.parametrize("folder", [LEGACY, LATEST])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_stored_spans_map_alike(folder: str, scenario: str) -> None:
    # the store keeps attribute values as strings (as the OTel ClickHouse exporter does); re-normalizing
    # a stored span must give the same canonical fields
    for span in normalized(folder, scenario):
        expected = span.canonical()
        span.attributes = {k: attribute_string(v) for k, v in span.attributes.items()}
        normalize_span(span)
        got = span.canonical()
        got["attributes"] = expected["attributes"]
        assert got == expected


# --- the semconv's extra facts: hand-built spans --------------------------------------------------


def test_agent_name_and_ids() -> None:
    s = span(
        {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": "planner",
            "gen_ai.agent.id": "asst_5j66UpCpwteGg4YSxUnt7lPY",
            "gen_ai.agent.description": "Plans trips",
            "gen_ai.agent.version": "2025-05-01",
        }
    )
    normalize_span(s)
    assert (s.step_type, s.agent_name) == ("agent", "planner")
    assert s.details == {
        "agent_id": "asst_5j66UpCpwteGg4YSxUnt7lPY",
        "agent_description": "Plans trips",
        "agent_version": "2025-05-01",
    }


def test_error_status_without_error_type() -> None:
    plain = span({"gen_ai.operation.name": "chat"})
    plain.status_code = "ERROR"
    normalize_span(plain)
    assert plain.error_type == "_OTHER"
    exception = SpanEvent(3, "exception", {"exception.type": "httpx.ReadTimeout", "exception.message": "timed out"})
    with_event = span({"gen_ai.operation.name": "chat"}, [exception])
    with_event.status_code = "ERROR"
    normalize_span(with_event)
    assert with_event.error_type == "httpx.ReadTimeout"
    unset = span({"gen_ai.operation.name": "chat", "error.type": "tool_error"})
    normalize_span(unset)
    assert unset.error_type == "tool_error"
    ok = span({"gen_ai.operation.name": "chat"}, [exception])
    normalize_span(ok)
    assert ok.error_type is None


def test_cache_and_reasoning_tokens() -> None:
    s = span(
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.usage.input_tokens": 100,
            "gen_ai.usage.cache_read.input_tokens": 50,
            "gen_ai.usage.cache_creation.input_tokens": "25",
            "gen_ai.usage.reasoning.output_tokens": 12.0,
            "gen_ai.usage.reasoning_tokens": 99,
        }
    )
    normalize_span(s)
    assert s.details == {"cache_read_input_tokens": 50, "cache_creation_input_tokens": 25, "reasoning_tokens": 12}
    older = span({"gen_ai.operation.name": "chat", "gen_ai.usage.reasoning_tokens": 7})
    normalize_span(older)
    assert older.details == {"reasoning_tokens": 7}
    odd = span({"gen_ai.operation.name": "chat", "gen_ai.usage.cache_read.input_tokens": "many"})
    normalize_span(odd)
    assert odd.details == {}


def test_every_request_parameter() -> None:
    s = span(
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.temperature": 0.7,
            "gen_ai.request.max_tokens": 100,
            "gen_ai.request.top_p": 1.0,
            "gen_ai.request.top_k": 40.0,
            "gen_ai.request.frequency_penalty": 0.1,
            "gen_ai.request.presence_penalty": 0.2,
            "gen_ai.request.stop_sequences": ["forest", "lived"],
            "gen_ai.request.seed": 100,
            "gen_ai.request.choice.count": 3,
            "gen_ai.request.encoding_formats": ["base64"],
            "gen_ai.request.stream": True,
        }
    )
    normalize_span(s)
    assert s.details["request"] == {
        "temperature": 0.7,
        "max_tokens": 100,
        "top_p": 1.0,
        "top_k": 40.0,
        "frequency_penalty": 0.1,
        "presence_penalty": 0.2,
        "stop_sequences": ["forest", "lived"],
        "seed": 100,
        "choice_count": 3,
        "encoding_formats": ["base64"],
        "stream": True,
    }


def test_response_facts() -> None:
    s = span(
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.response.id": "chatcmpl-123",
            "gen_ai.response.finish_reasons": "length",
            "gen_ai.response.time_to_first_chunk": 0.5,
            "gen_ai.output.type": "json",
        }
    )
    normalize_span(s)
    assert s.details == {
        "response_id": "chatcmpl-123",
        "finish_reasons": ["length"],
        "time_to_first_token_s": 0.5,
        "output_type": "json",
    }


@pytest.mark.parametrize("value", [[], "", 5, {"a": 1}, [None, 3, "stop"]])
def test_odd_finish_reasons(value: Any) -> None:
    s = span({"gen_ai.operation.name": "chat", "gen_ai.response.finish_reasons": value})
    normalize_span(s)
    assert s.details.get("finish_reasons") in (None, ["3", "stop"])


def test_tool_facts() -> None:
    s = span(
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "search",
            "gen_ai.tool.type": "datastore",
            "gen_ai.tool.description": "Searches the wiki",
            "gen_ai.data_source.id": "H7STPQYOND",
        }
    )
    normalize_span(s)
    assert (s.step_type, s.tool_name) == ("tool", "search")
    assert s.details == {
        "tool_type": "datastore",
        "tool_description": "Searches the wiki",
        "data_source_id": "H7STPQYOND",
    }


def test_retrieval_span() -> None:
    documents = [
        {"id": "doc_123", "score": 0.95, "content": "Paris is the capital.", "metadata": {"source": "wiki"}},
        {"id": "doc_456", "score": "0.87", "title": "France"},
    ]
    s = span(
        {
            "gen_ai.operation.name": "retrieval",
            "gen_ai.data_source.id": "H7STPQYOND",
            "gen_ai.retrieval.query.text": "capital of France",
            "gen_ai.retrieval.documents": json.dumps(documents),
        }
    )
    normalize_span(s)
    assert s.step_type == "retriever"
    assert s.input == [{"role": "user", "parts": [{"type": "text", "content": "capital of France"}]}]
    assert s.output is None and s.content_captured
    assert s.details["data_source_id"] == "H7STPQYOND"
    assert s.details["documents"] == [
        {"id": "doc_123", "content": "Paris is the capital.", "score": 0.95, "metadata": {"source": "wiki"}},
        {"id": "doc_456", "content": None, "score": 0.87, "metadata": {"title": "France"}},
    ]
    structured = span({"gen_ai.operation.name": "retrieval", "gen_ai.retrieval.documents": documents[:1]})
    normalize_span(structured)
    assert structured.details["documents"][0]["id"] == "doc_123"
    assert not structured.content_captured and structured.unparsed == []


def test_malformed_retrieval_documents_are_kept_raw_and_flagged() -> None:
    s = span({"gen_ai.operation.name": "retrieval", "gen_ai.retrieval.documents": '[{"id": "doc_1", '})
    normalize_span(s)
    assert s.details["documents"] == [{"id": None, "content": '[{"id": "doc_1", ', "score": None, "metadata": None}]
    assert s.unparsed == ["documents"]
    odd = span({"gen_ai.operation.name": "retrieval", "gen_ai.retrieval.documents": '[1, "two", null]'})
    normalize_span(odd)
    assert [d["content"] for d in odd.details["documents"]] == ["1", "two", None]


def test_workflow_span() -> None:
    s = span({"gen_ai.operation.name": "invoke_workflow", "gen_ai.workflow.name": "multi_agent_rag"})
    normalize_span(s)
    assert (s.step_type, s.details) == ("chain", {"workflow_name": "multi_agent_rag", "workflow": True})


def test_user_id_and_its_older_name() -> None:
    both = span({"gen_ai.operation.name": "chat", "user.id": "u-1", "enduser.id": "e-1"})
    older = span({"gen_ai.operation.name": "chat", "enduser.id": "e-1"})
    normalize_span(both)
    normalize_span(older)
    assert (both.user_id, older.user_id) == ("u-1", "e-1")


@pytest.mark.parametrize("value", [None, "", 7, -1.5, True, [1, "a"], {"k": "v"}, b"\xff"])
def test_odd_detail_values_never_raise(value: Any) -> None:
    keys = [
        "gen_ai.agent.name",
        "gen_ai.agent.id",
        "gen_ai.response.id",
        "gen_ai.response.finish_reasons",
        "gen_ai.response.time_to_first_chunk",
        "gen_ai.usage.cache_read.input_tokens",
        "gen_ai.usage.reasoning.output_tokens",
        "gen_ai.request.temperature",
        "gen_ai.retrieval.documents",
        "gen_ai.retrieval.query.text",
        "gen_ai.tool.type",
        "user.id",
        "error.type",
    ]
    for operation in ("chat", "retrieval", "execute_tool"):
        attributes = {k: value for k in keys}
        attributes["gen_ai.operation.name"] = operation
        s = span(dict(attributes))
        s.status_code = "ERROR"
        normalize_span(s)
        assert s.attributes == attributes
        json.dumps(s.canonical(), default=str)


def test_containers_are_no_text_and_non_finite_numbers_no_number() -> None:
    s = span(
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": ["m"],
            "gen_ai.conversation.id": {"id": "c"},
            "gen_ai.response.id": ["r"],
            "gen_ai.request.temperature": "NaN",
            "gen_ai.request.top_p": float("inf"),
            "gen_ai.response.time_to_first_chunk": "1e400",
        }
    )
    normalize_span(s)
    assert (s.step_type, s.model, s.session_id) == ("llm", None, None)
    assert s.details == {}


# --- registry, config and the processor -----------------------------------------------------------


class Marker:
    """A mapper that claims spans carrying `test.marker`."""

    version = "1"

    def __init__(self, name: str) -> None:
        self.name = name

    def matches(self, span: Span) -> bool:
        return "test.marker" in span.attributes

    def apply(self, span: Span) -> None:
        span.step_type = "chain"


class Broken(Marker):
    def apply(self, span: Span) -> None:
        span.step_type = "chain"
        raise RuntimeError("bug")


@pytest.fixture
def registry() -> Iterator[None]:
    """Let a test register mappers and put the registry back afterwards."""
    saved = dict(MAPPERS)
    saved_precedence = dict(mapper_registry._precedence)
    yield
    MAPPERS.clear()
    MAPPERS.update(saved)
    mapper_registry._precedence.clear()
    mapper_registry._precedence.update(saved_precedence)


def test_registry_orders_by_precedence(registry: None) -> None:
    register_mapper(Marker("late"), precedence=200)
    register_mapper(Marker("early"), precedence=10)
    # other test modules register the convention mappers too: check the order, not the whole list
    names = list(MAPPERS)
    assert names.index("early") < names.index("otel_genai") < names.index("late") == len(names) - 1
    assert all(mapper_registry._precedence[n] <= 10 for n in names[: names.index("early")])
    with pytest.raises(ValueError, match="registered twice"):
        register_mapper(Marker("early"))
    s = span({"test.marker": True, "gen_ai.operation.name": "chat"})
    normalize_span(s)
    assert (s.convention, s.step_type) == ("early", "chain")


class Marked(Marker):
    """A mapper that claims spans carrying one of its `markers`."""

    def __init__(self, name: str, *markers: str) -> None:
        super().__init__(name)
        self.markers = frozenset(markers)

    def matches(self, span: Span) -> bool:
        return not span.attributes.keys().isdisjoint(self.markers)


def test_mappers_with_markers_are_still_tried_in_precedence_order(registry: None) -> None:
    # agentgateway (10), mlflow (20), openinference (30), vercel_ai (35), openllmetry (40) declare markers; a mapper
    # with markers joins their run, one without splits it: each span still goes to the first mapper that matches it
    register_mapper(Marked("marked", "test.marked", "ai.operationId"), precedence=32)
    register_mapper(Marker("plain"), precedence=37)
    for mappers in (None, list(MAPPERS.values())):
        for attributes, expected in (
            ({"ai.operationId": "ai.generateText", "openinference.span.kind": "LLM"}, "openinference"),
            ({"ai.operationId": "ai.generateText", "traceloop.span.kind": "task"}, "marked"),
            ({"test.marked": 1, "test.marker": 1, "traceloop.span.kind": "task"}, "marked"),
            ({"test.marker": 1, "traceloop.span.kind": "task"}, "plain"),
            ({"traceloop.span.kind": "task", "gen_ai.operation.name": "chat"}, "openllmetry"),
            ({"gen_ai.operation.name": "chat"}, "otel_genai"),
            ({"http.method": "GET"}, ""),
        ):
            s = span(attributes)
            normalize_span(s, mappers)
            assert s.convention == expected, attributes
    # agentgateway's markers say what it needs besides its scope: a span of its scope is its without them
    s = span({"gen_ai.operation.name": "chat"})
    s.scope_name = "agentgateway"
    normalize_span(s)
    assert s.convention == "agentgateway"
    s = span({"src.addr": "10.0.0.1", "duration": "5ms", "protocol": "llm", "gen_ai.operation.name": "chat"})
    normalize_span(s)
    assert s.convention == "agentgateway"
    proc = Normalize(NormalizeConfig(mappers=["plain", "vercel_ai", "marked"]), settings(), Sink())
    s = span({"test.marked": 1, "test.marker": 1})
    asyncio.run(proc.consume(SpanBatch([s], revision=True)))
    assert s.convention == "plain"


def test_config_rejects_an_unknown_mapper_and_lists_the_known_ones() -> None:
    with pytest.raises(ValidationError) as failure:
        NormalizeConfig(mappers=["otel_genai", "openinferense"])
    message = str(failure.value)
    assert "'openinferense'" in message and "known mappers: " in message
    assert all(name in message for name in MAPPERS)
    with pytest.raises(ValidationError):
        NormalizeConfig(mapper=["otel_genai"])  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="more than once"):
        NormalizeConfig(mappers=["otel_genai", "otel_genai"])
    assert NormalizeConfig().mappers is None
    assert NormalizeConfig(mappers=["otel_genai"]).mappers == ["otel_genai"]


def test_normalize_is_registered() -> None:
    factory = REGISTRY[("processor", "normalize")]
    assert (factory.cls, factory.config) == (Normalize, NormalizeConfig)


class Sink:
    def __init__(self) -> None:
        self.batches: list[SpanBatch] = []

    async def consume(self, batch: SpanBatch) -> None:
        self.batches.append(batch)


def settings() -> Settings:
    return Settings(id="normalize", metrics=SelfMetrics(), logger=logging.getLogger("test.normalize"))


def test_processor_normalizes_and_hands_the_batch_on() -> None:
    body = (FIXTURES / LATEST / "chat_tools.json").read_bytes()
    batch = decode_traces_json(body).batch
    batch.spans.append(span({"http.method": "GET"}))
    sink = Sink()
    normalize = Normalize(NormalizeConfig(), settings(), sink)

    async def run() -> None:
        await normalize.start()
        await normalize.consume(batch)
        await normalize.shutdown()

    asyncio.run(run())
    assert sink.batches == [batch]
    assert [s.convention for s in batch] == ["otel_genai"] * 4 + [""]
    assert sorted(s.step_type for s in batch) == ["agent", "llm", "llm", "other", "tool"]


def test_processor_uses_only_the_configured_mappers(registry: None) -> None:
    register_mapper(Marker("first"), precedence=10)
    sink = Sink()
    normalize = Normalize(NormalizeConfig(mappers=["otel_genai"]), settings(), sink)
    s = span({"test.marker": True, "gen_ai.operation.name": "chat"})
    asyncio.run(normalize.consume(SpanBatch([s])))
    assert s.convention == "otel_genai"


def test_a_failing_mapper_costs_one_span_not_the_batch(registry: None, caplog: pytest.LogCaptureFixture) -> None:
    register_mapper(Broken("broken"), precedence=10)
    sink = Sink()
    normalize = Normalize(NormalizeConfig(), settings(), sink)
    bad = span({"test.marker": True})
    good = span({"gen_ai.operation.name": "chat"})
    with caplog.at_level(logging.ERROR, logger="test.normalize"):
        asyncio.run(normalize.consume(SpanBatch([bad, good, span({"test.marker": True})])))
    assert (bad.step_type, bad.convention) == ("other", "")
    assert (good.step_type, good.convention) == ("llm", "otel_genai")
    assert len(sink.batches) == 1
    assert len([r for r in caplog.records if "broken" in r.getMessage()]) == 1
